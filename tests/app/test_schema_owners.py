"""One owner per file format: a schema name is spelled only in the module that writes it.

A versioned file carries its schema name (``"goalprobe.trajectory/2"``, ``"goalprobe.decoded_maps"``,
...) as a ``schema`` field or attribute. The module that writes it defines the name (a
``*SCHEMA*`` constant, or the literal written as the ``schema`` field) and reads it back with the
schema and version checks; every other module goes through that module's readers or imports its
constant. A second spelling is a second reader that skips the checks, so this test finds every
schema name by parsing the code and forbids its literal anywhere else (docstrings aside, which
describe formats; tests aside, which pin the on-disk strings of old files on purpose).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("gridworld", "agents", "activations", "probes", "viewer", "goalprobe", "scripts")
"""Where the code outside tests lives."""

_NAME = re.compile(r"^goalprobe\.[a-z_]+(?:\.[a-z_]+)*(?:/\d+)?$")


def _modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every string that is a statement of its own (docstrings, attribute notes)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


@functools.cache
def _parse(text: str, filename: str) -> ast.Module:
    """``ast.parse``, once per source text (both checks below walk every module)."""
    return ast.parse(text, filename=filename)


def _tree(path: Path) -> ast.Module:
    return _parse(path.read_text(encoding="utf-8"), str(path))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def _base(name: str) -> str:
    """The schema name without its version (``goalprobe.trajectory/2`` -> ``goalprobe.trajectory``)."""
    return name.split("/", 1)[0]


def schema_owners(paths: list[Path]) -> dict[str, set[str]]:
    """Schema base name -> the modules that define it: a literal assigned to a name containing
    ``SCHEMA``, or written as the value of a ``"schema"`` key or ``attrs["schema"]``."""
    owners: dict[str, set[str]] = {}

    def own(value: ast.AST, path: Path) -> None:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if _NAME.match(value.value):
                owners.setdefault(_base(value.value), set()).add(_rel(path))

    for path in paths:
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and "SCHEMA" in target.id:
                        own(node.value, path)
                    if (
                        isinstance(target, ast.Subscript)
                        and isinstance(target.slice, ast.Constant)
                        and target.slice.value == "schema"
                    ):
                        own(node.value, path)
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "schema":
                        own(value, path)
    return owners


def spellings(path: Path, bases: list[str]) -> list[tuple[int, str]]:
    """``(line, schema base name)`` of every non-docstring string of ``path`` that spells a
    schema name (regular-expression escapes removed, so a pattern counts too)."""
    tree = _tree(path)
    skip = _docstrings(tree)
    patterns = {b: re.compile(re.escape(b) + r"(?![\w.])") for b in bases}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip:
            continue
        value = node.value
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str):
            continue
        text = value.replace("\\", "")
        if "goalprobe." not in text:  # every schema name starts so (_NAME)
            continue
        found.extend((node.lineno, b) for b, pattern in patterns.items() if pattern.search(text))
    return found


def test_every_schema_has_one_owner():
    owners = schema_owners(_modules())
    # the formats the viewer and the stages read must be found, or the check below is empty
    for name in (
        "goalprobe.trajectory",
        "goalprobe.gridset",
        "goalprobe.activations",
        "goalprobe.decoded_maps",
        "goalprobe.step_maps",
        "goalprobe.predicted_plans",
        "goalprobe.probe_card",
        "goalprobe.plan_decoder",
        "goalprobe.patching",
        "goalprobe.false_belief",
    ):
        assert name in owners, f"no module defines the schema {name}"
    shared = {name: sorted(mods) for name, mods in owners.items() if len(mods) > 1}
    assert shared == {}, f"schemas defined in several modules: {shared}"


def test_schema_names_are_spelled_only_by_their_owner():
    paths = _modules()
    owners = {name: next(iter(mods)) for name, mods in schema_owners(paths).items()}
    wrong = []
    for path in paths:
        relative = _rel(path)
        for line, name in spellings(path, sorted(owners)):
            if owners[name] != relative:
                wrong.append(f"{relative}:{line} spells {name!r} (owned by {owners[name]})")
    assert wrong == [], "schema names outside their owner:\n" + "\n".join(wrong)


def test_the_check_sees_literals_patterns_and_attributes(tmp_path):
    # the checks above would be toothless if they missed these forms
    owner = tmp_path / "owner.py"
    owner.write_text('SCHEMA = "goalprobe.thing/2"\n"""Schema of goalprobe.thing files."""\n')
    writer = tmp_path / "writer.py"
    writer.write_text('def w(f):\n    f.attrs["schema"] = "goalprobe.other"\n')
    reader = tmp_path / "reader.py"
    reader.write_text(
        '"""Reads goalprobe.thing files (a docstring may say so)."""\nimport re\n'
        'R = re.compile(rb\'^\\{"schema":"goalprobe\\.thing/[12]"\')\n'
        'def r(f):\n    return f.attrs.get("schema") == "goalprobe.other"\n'
        'MODULE = "goalprobe.thing.reader"\n'
    )
    owners = schema_owners([owner, writer, reader])
    assert owners == {"goalprobe.thing": {"owner.py"}, "goalprobe.other": {"writer.py"}}
    assert spellings(owner, sorted(owners)) == [(1, "goalprobe.thing")]
    assert spellings(reader, sorted(owners)) == [(3, "goalprobe.thing"), (5, "goalprobe.other")]
