"""Report section on where the decision is made: the logit lens on the answer and along the
reasoning, with a reading derived from the numbers."""

from __future__ import annotations

from collections.abc import Mapping

from goalprobe.probes.decision_time import first_readable
from goalprobe.report.blocks import Block, Figures, Text, stat_text, table
from goalprobe.report.run import RunReader
from goalprobe.viewer.figures.decision import decision_time_figure, reasoning_readout_figure


def reading(data: Mapping) -> str:
    """What the curves say."""
    answer = data["answer_by_layer"]
    last = data["progress_by_layer"][-1]
    first = next(
        (i for i, row in enumerate(answer) if row["ci_low"] is not None and row["ci_low"] > 0.25),
        None,
    )
    parts = [
        f"On {data['steps']} answered steps of {data['grids']} grids, the lens at the position "
        "that predicts the answer's action names the answered action in "
        f"{stat_text(answer[-1])} of steps at the last block (the model itself) and in "
        f"{stat_text(answer[0])} at block 0; majority action {stat_text(data['majority'])}, "
        "chance 25%.",
        "It names it above chance from block "
        + (f"{first} on." if first is not None else "none (no block's interval clears 25%)."),
        f"Along the reasoning, at the last block, the lens names the final action in "
        f"{stat_text(last[0])} of steps in the first fifth of the reasoning and "
        f"{stat_text(last[-1])} in the last fifth.",
    ]
    stable = data["first_stable"]
    if stable["quartiles"]:
        q = stable["quartiles"]
        parts.append(
            f"Where the final action ends as the top choice ({stable['steps']} steps), it stays "
            f"the top choice from a median {100 * q[1]:.0f}% of the reasoning on (quartiles "
            f"{100 * q[0]:.0f}%-{100 * q[2]:.0f}%)."
        )
    parts.append(
        "A lens reads what the residual stream would say if the model answered there; it is a "
        "read-out, not a causal test (patching along the reasoning is in the patching section)."
    )
    return " ".join(parts)


def decision(run: RunReader, fig: Figures) -> list[Block]:
    """The reading, the figure and the per-layer table."""
    data = run.json(run.layout.decision_lens)
    rows = [
        (str(layer), stat_text(row), stat_text(bins[0]), stat_text(bins[-1]))
        for layer, (row, bins) in enumerate(
            zip(data["answer_by_layer"], data["progress_by_layer"], strict=True)
        )
    ]
    blocks: list[Block] = [
        Text(reading(data)),
        fig(decision_time_figure(data)),
        table(
            ("block", "answer position", "first fifth of reasoning", "last fifth"),
            rows,
            caption=f"Share of steps whose logit-lens top action is the answered one, 95% "
            f"grid-bootstrap intervals; chunks of {data['chunk']} reasoning tokens; "
            f"{data['steps_skipped']} sampled steps had no readable answer.",
        ),
    ]
    readout = data.get("readout")
    if readout:
        strongest = readout["strongest"]
        grid_rows = [
            (str(layer), *map(_marked, cells)) for layer, cells in enumerate(readout["by_layer"])
        ]
        blocks.append(
            table(
                ("block", "0-20%", "20-40%", "40-60%", "60-80%", "80-100%"),
                grid_rows,
                caption="The answered action read out of the residual stream (a linear probe "
                "per block and fifth of the reasoning, trained on half the grids, scored on the "
                f"others) against the strongest baseline, {strongest} "
                f"({stat_text(readout['baselines'][strongest])}; others: {_others(readout)}). ✓: the margin over it excludes 0 (intervals Bonferroni-adjusted over the "
                f"{readout['family']} cells).",
            )
        )
    along = data.get("reasoning_readout")
    if along:
        blocks.extend(readout_blocks(along, fig))
    return blocks


def readout_reading(readout: Mapping) -> str:
    """What the store's read-out over reasoning time says, target by target."""
    bins = readout["bins"]
    parts = [
        f"Read out of the stored residual stream ({readout['rows']} steps of "
        f"{readout['grids']} grids; probes trained on half the grids, scored on the other "
        f"{readout['test_grids']}; reasoning rows every {readout['every']} tokens):"
    ]
    for name, target in readout["targets"].items():
        strongest = target["strongest"]
        base = target["baselines"][strongest]
        first = first_readable(target)
        cells = [row[0] for row in target["by_layer"]]
        best_pre = max(cells, key=lambda c: c.get("value") or 0.0)
        yes = [
            any(row[b].get("verdict") == "yes" for row in target["by_layer"])
            for b in range(len(bins))
        ]
        held = first is not None and all(yes[first["bin"] :])
        where = (
            f"first beats it at the {first['name']} (block "
            f"{readout['layers'][first['layer_index']]})"
            + (" and at every later bin" if held else ", not at every later bin")
            if first is not None
            else "beats it at no bin and block"
        )
        parts.append(
            f"{name}: strongest baseline {strongest} {stat_text(base)}; at the pre-reasoning "
            f"anchor up to {stat_text(best_pre)}; the read-out {where}."
        )
    parts.append(
        "A read-out says what is linearly decodable at a position, not that the model uses it; "
        "bins hold the last stored reasoning row of each fifth of the reasoning."
    )
    return " ".join(parts)


def readout_blocks(readout: Mapping, fig: Figures) -> list[Block]:
    """The reading, the figure and one table per target (rows: stored blocks; columns: bins)."""
    blocks: list[Block] = [Text(readout_reading(readout)), fig(reasoning_readout_figure(readout))]
    for name, target in readout["targets"].items():
        rows = [
            (str(readout["layers"][j]), *map(_marked, cells))
            for j, cells in enumerate(target["by_layer"])
        ]
        others = _others(target)
        blocks.append(
            table(
                ("block", *readout["bins"]),
                rows,
                caption=f"{name}: held-out accuracy of the read-out ({target['rows']} steps) "
                f"against the strongest baseline, {target['strongest']} "
                f"({stat_text(target['baselines'][target['strongest']])}"
                + (f"; others: {others}" if others else "")
                + "). ✓: the paired margin over it excludes 0 (intervals Bonferroni-adjusted "
                f"over the {target['family']} cells).",
            )
        )
    return blocks


def _marked(cell: Mapping) -> str:
    """A read-out cell with its interval, ``✓`` where its margin over the baseline is a yes."""
    return stat_text(cell) + (" ✓" if cell.get("verdict") == "yes" else "")


def _others(readout: Mapping) -> str:
    """The baselines other than the strongest, with their intervals."""
    strongest = readout["strongest"]
    return ", ".join(
        f"{k} {stat_text(v)}" for k, v in readout["baselines"].items() if k != strongest
    )
