"""The report's first screen: the Holm family of each agent, named before any row, then one
line per question with both agents' values and verdicts side by side."""

from __future__ import annotations

from goalprobe.report.agents import agent_name
from goalprobe.report.blocks import Block, Box, Text, table
from goalprobe.report.headline import P_METHODS, HeadlineRow, family_text, headline_rows
from goalprobe.report.row_specs import SPECS, TEST
from goalprobe.report.run import RunReader


def answer_text(row: HeadlineRow | None) -> str:
    """A row's answer in a few words: ``yes (Holm ok)``, ``no; detectable 12.0%``, ``check``,
    ``descriptive``; ``–`` where the agent has no such row."""
    if row is None:
        return "–"
    if row.kind != TEST:
        return row.kind
    text = row.answer or "undecided"
    if row.answer == "yes":
        text += " (Holm ok)" if row.holm_p is not None and row.holm_p < 0.05 else " (Holm ns)"
    if row.detectable:
        text += f"; detectable {row.detectable}"
    return text


def agent_rows(run: RunReader) -> list[tuple[str, list[HeadlineRow]]]:
    """``(agent name, headline rows)`` of the run's agent, then of the positive control where
    it ran beside it."""
    out = [(agent_name(run), headline_rows(run.root))]
    control = RunReader(run.layout.control.root)
    if control.layout.stages_dir.is_dir():
        out.append((agent_name(control), headline_rows(control.root)))
    return out


def headline_blocks(run: RunReader) -> list[Block]:
    """The family paragraph and the one-line-per-question table (both agents)."""
    agents = agent_rows(run)
    if not any(rows for _, rows in agents):
        return [Box("not_run", "no stage produced a headline figure yet")]
    roles = ("default", "control")
    family = " ".join(
        f"{name} ({role} agent): {family_text(role)}."
        for (name, _), role in zip(agents, roles[: len(agents)], strict=True)
    )
    methods = "; ".join(f"{k}: {v}" for k, v in P_METHODS.items())
    blocks: list[Block] = [
        Text(
            "Holm family, declared before the run (every test row; a row the run lacks counts "
            f"as p = 1, so the data cannot shrink it). {family} Rows marked descriptive or "
            "pipeline check carry no verdict. One-sided p-values, by the most exact route the "
            f"result file allows ({methods}). A 'no' or 'undecided' states the effect its n "
            "could detect (80% power)."
        )
    ]
    by_id = [{r.id: r for r in rows} for _, rows in agents]
    header = ["question"]
    for name, _ in agents:
        header += [f"{name}: value [95% CI]", f"{name}: verdict"]
    header.append("baseline")
    lines = []
    for spec in SPECS:
        found = [rows.get(spec.id) for rows in by_id]
        if not any(found):
            continue
        line = [spec.label]
        for row in found:
            line += [row.value if row else "–", answer_text(row)]
        first = next(r for r in found if r is not None)
        line.append(first.baseline or spec.baseline)
        lines.append(line)
    caption = (
        "One line per question (the full findings, baselines and Holm-adjusted p-values "
        "follow). Rates carry exact intervals on the effective number of grids "
        "(honest at 0% and 100%)."
    )
    blocks.append(table(header, lines, caption=caption))
    return blocks
