"""Both agents side by side: the headline of this run's agent next to the positive control's
(``RUN/control/``, written by ``goalprobe demo`` without ``--model``), with what each agent's
anchors do and do not hold."""

from __future__ import annotations

import re

from goalprobe.agents.bundled import ANCHOR_READINGS
from goalprobe.report.blocks import Block, Box, Text, table
from goalprobe.report.headline import HeadlineRow, headline_rows
from goalprobe.report.run import MissingInput, RunReader


def agent_name(run: RunReader) -> str:
    """The model a run's demo config names (``?`` when it has none)."""
    try:
        return str(run.json(run.layout.demo_config)["agent"]["model"])
    except (MissingInput, KeyError, TypeError):
        return "?"


_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")
"""A number in a finding (counts, layers differ between two runs' rows)."""


def side_by_side(left: list[HeadlineRow], right: list[HeadlineRow]) -> list[tuple[str, ...]]:
    """``(finding, left value, left baseline, left verdict, right value, right baseline, right
    verdict)`` per row spec, in ``left``'s order then ``right``'s extra rows; ``-`` where a run
    has no such row. Rows pair up by their spec's id; a number in the finding that differs (a
    count) shows as ``left / right``."""
    by_id = {row.id: row for row in right}
    rows: list[tuple[str, ...]] = []
    for row in left:
        other = by_id.pop(row.id, None)
        finding = row.finding
        if other is not None and _NUMBER.sub("#", finding) == _NUMBER.sub("#", other.finding):
            pairs = zip(_NUMBER.split(finding), _NUMBER.split(other.finding), strict=True)
            finding = "".join(x if x == y else f"{x} / {y}" for x, y in pairs)
        theirs = (other.value, other.baseline, other.verdict) if other else ("-", "-", "-")
        rows.append((finding, row.value, row.baseline, row.verdict, *theirs))
    rows += [(r.finding, "-", "-", "-", r.value, r.baseline, r.verdict) for r in by_id.values()]
    return rows


def side_by_side_markdown(run_dir) -> str:
    """Both agents' headline rows side by side (``run_dir``'s and ``RUN/control/``'s) as a
    Markdown table (the README, ``scripts/bench_demo.py``)."""
    run = RunReader(run_dir)
    control = RunReader(run.layout.control.root)
    left, right = agent_name(run), agent_name(control)
    lines = [
        f"| finding | `{left}` (95% CI) | baseline | verdict | `{right}` (95% CI) | baseline "
        "| verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in side_by_side(headline_rows(run.root), headline_rows(control.root)):
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def agents(run: RunReader) -> list[Block]:
    """The section's blocks: a reading per agent and the side-by-side headline."""
    control = RunReader(run.layout.control.root)
    if not control.layout.stages_dir.is_dir():
        full = [(r.finding, r.value, r.baseline, r.verdict) for r in headline_rows(run.root)]
        return [
            Box(
                "not_run",
                "no positive-control run beside this one: `goalprobe demo` without --model runs "
                "the map agent (bundled:map) beside the default agent in RUN/control/",
            ),
            table(
                ("finding", "value [95% CI]", "baseline", "verdict (Holm-adjusted p)"),
                full,
                caption="This agent's headline rows in full (95% CIs).",
            ),
        ]
    names = agent_name(run), agent_name(control)
    blocks: list[Block] = [
        Text(
            f"The same study on two agents: `{names[0]}` (this run) and `{names[1]}` (the "
            "positive control, RUN/control/: same grids, probing set and seeds; it runs the "
            "behaviour, every representational stage and the false-belief grids, not the iso, "
            "key, harm and intention studies). A finding the toolkit reports on the control but not on the "
            "default agent is about the agent, not a failure of the measurement."
        )
    ]
    blocks += [
        Text(f"`{name}`: {ANCHOR_READINGS[name]}") for name in names if name in ANCHOR_READINGS
    ]
    rows = side_by_side(headline_rows(run.root), headline_rows(control.root))
    header = ("finding", *(f"{n}: {c}" for n in names for c in ("value", "baseline", "verdict")))
    blocks.append(table(header, rows, caption="Each agent's headline row (95% CIs)."))
    return blocks
