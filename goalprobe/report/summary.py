"""What ``goalprobe demo`` prints when it ends: one screen at 80 columns.

One line per headline verdict (both agents' answers side by side when the positive control ran
beside the default agent), then the report's path and the exact ``goalprobe view`` command,
each on one line. The numbers, their intervals and baselines are in the report; this is the
at-a-glance reading.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from goalprobe.report.agents import agent_name, side_by_side
from goalprobe.report.headline import headline_rows
from goalprobe.report.run import RunReader

WIDTH = 80
"""Columns the summary fits in."""

_DETAILS = re.compile(r"\s*\([^()]*[0-9,;][^()]*\)")
"""A parenthesised detail: a figure, a count, a probe name (anything with a digit, a comma or
a semicolon); ``(regenerated)`` and ``(teacher_forced)`` tell findings apart and stay."""

_ABOVE = re.compile(r"^(?:probe |regressor )?above ")


def short_finding(finding: str) -> str:
    """A finding without its parenthesised details (figure, counts, probe name)."""
    return _DETAILS.sub("", finding).strip()


def short_question(question: str) -> str:
    """``"probe above prior_size"`` -> ``"> prior_size"`` (the other questions as they are)."""
    return _ABOVE.sub("> ", question)


def split_verdict(verdict: str) -> tuple[str, str]:
    """``"above random walk: yes"`` -> ``("above random walk", "yes")``; ``("", "-")`` for a
    missing verdict."""
    question, sep, answer = verdict.partition(": ")
    if not sep:
        return "", verdict.strip() or "-"
    return question.strip(), short_answer(answer.strip())


def short_answer(answer: str) -> str:
    """``"yes; Holm p 0.036 of 12 (holds after correction)"`` -> ``"yes, Holm ok"`` (``"Holm
    ns"`` when it does not hold after the correction); other answers as they are."""
    head, sep, rest = answer.partition("; Holm")
    if not sep:
        return answer
    return f"{head}, Holm {'ok' if 'holds' in rest else 'ns'}"


def _questions(questions: list[str]) -> str:
    """The agents' questions, once: ``"probe above shuffled / prior_size"`` when they differ
    (another strongest control), the words they share said once."""
    distinct = list(dict.fromkeys(questions))
    if len(distinct) <= 1:
        return short_question(distinct[0]) if distinct else ""
    first = distinct[0].split()
    out = [short_question(distinct[0])]
    for other in distinct[1:]:
        words = other.split()
        shared = 0
        while shared < min(len(first), len(words)) - 1 and first[shared] == words[shared]:
            shared += 1
        out.append(" ".join(words[shared:]))
    return " / ".join(out)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def verdict_lines(
    rows: list[tuple[str, list[str]]], names: list[str], width: int = WIDTH
) -> list[str]:
    """One line per finding: the finding and its baseline (``> baseline``), then each agent's
    answer at the right margin (``yes | no``); the text is cut (``…``) where it would not fit.

    Args:
        rows: ``(finding, [verdict per agent])``; a finding whose verdicts are all empty (a
            row with nothing to test) is left out.
        names: the agents, in the order of the verdicts.
        width: the columns every line fits in.
    """
    kept = [(f, v) for f, v in rows if any(x.strip() and x != "-" for x in v)]
    agents = " | ".join(names)
    lines = [_fit("Verdicts at 95% (report.html: values, baselines)", width - len(agents) - 1)]
    lines[0] = lines[0].ljust(width - len(agents)) + agents
    shorts = [short_finding(f) for f, _ in kept]
    for (finding, verdicts), short in zip(kept, shorts, strict=True):
        parsed = [split_verdict(x) for x in verdicts]
        answers = " | ".join(a for _, a in parsed)
        questions = _questions([q for q, _ in parsed if q])
        # two findings that only their details tell apart (two regressors) keep the details
        name = finding if shorts.count(short) > 1 else short
        text = name + (f": {questions}" if questions else "")
        room = width - len(answers) - 1
        lines.append(_fit(text, room).ljust(room) + " " + answers)
    return lines


def terminal_summary(run_dir: str | Path, *, with_control: bool, width: int = WIDTH) -> list[str]:
    """The lines ``goalprobe demo`` prints at its end (see the module docstring)."""
    run = RunReader(run_dir)
    rows: list[tuple[str, list[str]]]
    if with_control:
        control = RunReader(run.layout.control.root)
        names = [agent_name(run), agent_name(control)]
        pairs = side_by_side(headline_rows(run.root), headline_rows(control.root))
        rows = [(p[0], [p[3], p[6]]) for p in pairs]
    else:
        names = [agent_name(run)]
        rows = [(r.finding, [r.verdict]) for r in headline_rows(run.root)]
    lines = verdict_lines(rows, names, width)
    report = run.layout.report
    if report.is_file():
        lines.append(f"report: {report}")
    lines.append(f"view: goalprobe view {shlex.quote(str(run.root))}")
    return lines
