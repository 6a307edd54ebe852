"""``--help`` reads as prose: each docstring paragraph of a verb renders as one paragraph that
the terminal wraps, never cut where the source's line breaks were."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from goalprobe.cli import VERBS, app, prose

WIDTH = 80


def description(output: str) -> list[list[str]]:
    """The help's description: the lines between ``Usage:`` and the first box, as paragraphs
    (lists of stripped lines)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("╭")), len(lines))
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:end]:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


def render_help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("verb", list(VERBS))
def test_verb_help_paragraphs_are_wrapped_prose(verb):
    from goalprobe.cli import app as typer_app

    command = next(c for c in typer_app.registered_commands if c.name == verb)
    expected = [" ".join(p.split()) for p in prose(command.help).split("\n\n")]
    rendered = description(render_help(verb))
    assert [" ".join(" ".join(p).split()) for p in rendered] == expected
    for paragraph in rendered:
        for line, following in zip(paragraph, paragraph[1:], strict=False):
            # a line that ends early although the next word would have fit is a cut sentence
            assert len(line) + 1 + len(following.split()[0]) > WIDTH - 6, (verb, line)


def test_prose_joins_lines_and_keeps_paragraphs_and_lists():
    doc = """First line
    continues here.

    Second paragraph
    on two lines.

    - an item
    - another item
    """
    assert prose(doc) == (
        "First line continues here.\n\nSecond paragraph on two lines.\n\n- an item\n- another item"
    )


def test_options_help_has_no_hard_line_breaks():
    import typing

    from goalprobe.cli import app as typer_app

    checked = 0
    for command in typer_app.registered_commands:
        hints = typing.get_type_hints(command.callback, include_extras=True)
        for name, hint in hints.items():
            for meta in getattr(hint, "__metadata__", ()):
                text = getattr(meta, "help", None) or ""
                assert "\n" not in text, (command.name, name)
                checked += bool(text)
    assert checked > 50  # every verb's options were seen
