"""What ``goalprobe demo`` prints when it ends: one screen at 80 columns.

One line per headline question that carries a verdict or checks the pipeline (the row spec's
short label), each agent's answer at the right margin, then the report's path and the exact
``goalprobe view`` command. Nothing is cut mid-word; the numbers are in the report.
"""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

from goalprobe.report.agents import agent_name
from goalprobe.report.headline import HeadlineRow, headline_rows
from goalprobe.report.row_specs import DESCRIPTIVE, SPECS, TEST
from goalprobe.report.run import RunReader

WIDTH = 80
"""Columns the summary fits in."""


def short_answer(row: HeadlineRow | None) -> str:
    """``yes*`` (holds after Holm's correction), ``yes`` (not after it), ``no``, ``undecided``,
    ``unstable``, ``n/a``, ``passed`` / ``flagged`` (a pipeline check that records its outcome),
    ``check`` (one that does not), ``-`` (the agent has no such row)."""
    if row is None:
        return "-"
    if row.kind != TEST:
        return row.check or "check"
    if row.answer == "yes" and row.holm_p is not None and row.holm_p < 0.05:
        return "yes*"
    return row.answer or "undecided"


def verdict_lines(
    rows: list[tuple[str, list[str]]], names: list[str], width: int = WIDTH
) -> list[str]:
    """One line per ``(label, [answer per agent in names])`` row: the label, then the answers at
    the right margin of ``width`` (``yes* | no``); a label too long to sit beside them is
    wrapped at a space, the answers on its last line."""
    cols = [max([len(n), *(len(a[i]) for _, a in rows)]) for i, n in enumerate(names)]

    def right(cells: list[str]) -> str:
        return " | ".join(c.rjust(w) for c, w in zip(cells, cols, strict=True))

    head = right(list(names))
    room = width - len(head) - 1
    title = "Verdicts at 95% (* holds after Holm)"
    if len(title) <= room:
        lines = [title.ljust(room) + " " + head]
    else:  # a long agent name: the title on its own line
        lines = [title, head.rjust(width)]
    for label, answers in rows:
        tail = right(answers)
        parts = textwrap.wrap(label, width=max(10, width - len(tail) - 1), break_long_words=False)
        lines += parts[:-1]
        lines.append(parts[-1].ljust(width - len(tail) - 1) + " " + tail)
    return lines


def summary_rows(agents: list[list[HeadlineRow]]) -> list[tuple[str, list[str]]]:
    """``(label, [answer per agent])`` for every spec with a verdict or a pipeline check that
    some agent has, in spec order."""
    by_id = [{r.id: r for r in rows} for rows in agents]
    room = WIDTH - 2 * len("undecided") - 4
    out = []
    for spec in SPECS:
        found = [rows.get(spec.id) for rows in by_id]
        if spec.kind == DESCRIPTIVE or not any(found):
            continue
        label = spec.label
        said = spec.baseline.split()[-1] in label.split()  # the label names it already
        if spec.kind == TEST and not said and len(f"{label} (vs {spec.baseline})") <= room:
            label = f"{label} (vs {spec.baseline})"
        out.append((label, [short_answer(r) for r in found]))
    return out


def terminal_summary(run_dir: str | Path, *, with_control: bool, width: int = WIDTH) -> list[str]:
    """The lines ``goalprobe demo`` prints at its end (see the module docstring)."""
    run = RunReader(run_dir)
    runs = [run]
    if with_control:
        runs.append(RunReader(run.layout.control.root))
    # a model given as a directory is named by its last part (the columns stay narrow)
    names = [Path(n).name if "/" in n else n for n in map(agent_name, runs)]
    lines = verdict_lines(summary_rows([headline_rows(r.root) for r in runs]), names, width)
    report = run.layout.report
    if report.is_file():
        lines.append(f"report: {report}")
    lines.append(f"view: goalprobe view {shlex.quote(str(run.root))}")
    return lines
