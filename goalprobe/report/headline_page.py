"""The report's first screen: the Holm family of each agent, named before any row, then one
line per question with both agents' values and verdicts side by side."""

from __future__ import annotations

from goalprobe.report.agents import agent_name
from goalprobe.report.blocks import Block, Box, Text, table
from goalprobe.report.headline import P_METHODS, HeadlineRow, headline_rows
from goalprobe.report.row_specs import SPECS, TEST, family
from goalprobe.report.run import RunReader


def answer_text(row: HeadlineRow | None) -> str:
    """A row's answer in a few words: ``yes (Holm ok)``, ``no; detectable 12.0%``, ``check``,
    ``descriptive``; ``–`` where the agent has no such row."""
    if row is None:
        return "–"
    if row.kind != TEST:
        return f"{row.kind}: {row.check}" if row.check else row.kind
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
    blocks: list[Block] = [Text(family_sentence([name for name, _ in agents]))]
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
    methods = "; ".join(f"{k}: {v}" for k, v in P_METHODS.items())
    blocks.append(
        Text(
            "A row of the family that a run lacks counts as p = 1, so the data cannot shrink "
            "the family. One-sided p-values, by the most exact route the result file allows "
            f"({methods}). A 'no' or 'undecided' states the effect its n could detect (80% "
            "power, one-sided at 2.5%)."
        )
    )
    return blocks


def family_sentence(names: list[str]) -> str:
    """The Holm family of each agent in one sentence (the default agent's rows, then what the
    control's lacks)."""
    default = family("default")
    labels = {s.id: s.label for s in SPECS}
    text = (
        f"Holm family, declared before the run: for {names[0]}, {len(default)} tests ("
        + "; ".join(labels[i] for i in default)
        + ")"
    )
    if len(names) > 1:
        control = family("control")
        missing = [labels[i] for i in default if i not in control]
        text += f"; for {names[1]}, the same {len(control)} without " + "; ".join(missing)
    return text + ". Descriptive rows and pipeline checks carry no verdict."
