"""The wall read-out in both frames (``RUN/probes/wall_readout.json``): the headline rows
``walls.absolute`` / ``walls.agent`` and the section showing both frames for every agent, store
and layer, each number beside the same probe fitted on another grid's anchors of the same size
and density (the null); a "no" needs the committed power curve of the store's design
(``probes/wall_power.json``), otherwise it reads "undecided"."""

from __future__ import annotations

from collections.abc import Mapping

from goalprobe.report.blocks import Block, Figures, Text, num, pct, records_table, stat_text
from goalprobe.report.readers import Reading, answer
from goalprobe.report.run import MissingInput, RunReader
from goalprobe.stages import HEADLINE_STAGE, headline_layer
from goalprobe.stages.wall_readouts import WALL_READOUTS_SCHEMA
from goalprobe.stats import Estimate

FRAME_WORDS = {
    "absolute": "absolute cells",
    "agent": "offsets from the agent (|dr|, |dc| <= 3)",
}
"""How each frame is named in a finding."""


def readouts(run: RunReader) -> list[dict]:
    """The read-outs of the run's wall file (MissingInput where the probes stage left none)."""
    data = run.json(run.layout.wall_readout)
    if data.get("schema") != WALL_READOUTS_SCHEMA:
        raise MissingInput(
            f"{run.layout.relative(run.layout.wall_readout)}: schema {data.get('schema')!r} is "
            f"not {WALL_READOUTS_SCHEMA!r}"
        )
    if not data.get("readouts"):
        raise MissingInput(f"{run.layout.relative(run.layout.wall_readout)} holds no read-out")
    return list(data["readouts"])


def headline_readout(run: RunReader) -> dict:
    """The probing set's read-out at the headline stage and layer (else the main store's)."""
    found = readouts(run)
    for store in ("probing", "main"):
        mine = [r for r in found if r["store"] == store and r["stage"] == HEADLINE_STAGE]
        if mine:
            layer = headline_layer({int(r["layer"]) for r in mine})
            return next(r for r in mine if int(r["layer"]) == layer)
    raise MissingInput(f"no {HEADLINE_STAGE} wall read-out")


def power_text(verdict: Mapping, power: Mapping) -> str:
    """The power a verdict stands on, in words."""
    mds, mdb = verdict.get("minimum_detectable_strength"), verdict.get("minimum_detectable_bits")
    if mds is None or mdb is None:
        return f"no power shown for this store ({power.get('reason', 'no power curve')})"
    return (
        f"minimum detectable planted strength {mds:g} = {num(mdb, 4)} bits per uncertain cell "
        "(probes/wall_power.json)"
    )


def wall_row(run: RunReader, frame: str) -> Reading:
    """Headline row of the conditional wall test in ``frame``: held-out bits per prior-uncertain
    cell of the probe minus its same-size-and-density null, with the within-grid AUC and the
    accuracy beside it, and the verdict with its power."""
    r = headline_readout(run)
    block, verdict = r["frames"][frame], r["verdicts"][frame]
    o = block["overall"]
    bits, auc, acc = o["bits"], o["auc_within_grid"], o["accuracy"]
    rings = ""
    for k, words in (("1", "A's 4 neighbours, one step"), ("2", "8 cells two steps away")):
        ring = block.get("rings", {}).get(k, {}).get("accuracy")
        if ring is not None:  # the agent frame: rings of steps from A
            rings += (
                f"; ring {k} ({words}) accuracy {stat_text(ring.get('probe'))} against null "
                f"{stat_text(ring.get('null'))}"
            )
    finding = (
        f"Walls, conditional test in {FRAME_WORDS[frame]} ({r['store']} set, {r['stage']} "
        f"L{r['layer']}, {o['n_grids']} test grids, {o['cells_per_row']:.1f} uncertain cells "
        f"per row): bits per prior-uncertain cell, probe minus null"
    )
    value = (
        f"{stat_text(bits['difference'], percent=False, digits=4)} bits; within-grid AUC "
        f"{stat_text(auc['probe'])} (minus null {stat_text(auc['difference'])}); accuracy "
        f"{stat_text(acc['probe'])}{rings}"
    )
    baseline = (
        f"same probe on another same-size-and-density grid's anchors: "
        f"{stat_text(bits['null'], percent=False, digits=4)} bits, AUC "
        f"{stat_text(auc['null'])}, accuracy {stat_text(acc['null'])} (prior "
        f"{stat_text(acc['prior'])})"
    )
    reason = power_text(verdict, r.get("power") or {})
    said = verdict["verdict"]
    if said == "no" and verdict.get("minimum_detectable_bits") is None:
        said = "undecided"  # a "no" without shown power means nothing
    if said == "yes":
        reason = ""
    return Reading(
        finding,
        value,
        baseline,
        Estimate.from_dict({"n_grids": o["n_grids"], **bits["difference"]}),
        question="above the same-size-and-density null",
        answer=answer(said),
        percent=False,
        reason=reason,
        detectable=verdict.get("minimum_detectable_bits"),
    )


def _rows(agent: str, r: Mapping) -> list[dict]:
    out = []
    for frame, block in r["frames"].items():
        verdict = r["verdicts"][frame]
        parts = [("all", block["overall"])]
        parts += [
            (f"ring {k}", v)
            for k, v in sorted(block.get("rings", {}).items(), key=lambda kv: int(kv[0]))
        ]
        for i, (part, s) in enumerate(parts):
            bits, auc, acc = s["bits"], s["auc_within_grid"], s["accuracy"]
            out.append(
                {
                    "agent": agent,
                    "store": r["store"],
                    "layer": r["layer"],
                    "frame": frame,
                    "cells": part,
                    "uncertain cells / row": f"{s['cells_per_row']:.1f}",
                    "bits probe": stat_text(bits["probe"], percent=False, digits=4),
                    "bits null": stat_text(bits["null"], percent=False, digits=4),
                    "bits probe − null": stat_text(bits["difference"], percent=False, digits=4),
                    "AUC probe / null": f"{stat_text(auc['probe'])} / {stat_text(auc['null'])}",
                    "AUC probe − null": stat_text(auc["difference"]),
                    "accuracy probe / null / prior": f"{stat_text(acc['probe'])} / "
                    f"{stat_text(acc['null'])} / {pct((acc.get('prior') or {}).get('value'))}",
                    "verdict": verdict["verdict"] if i == 0 else "",
                    "power": power_text(verdict, r.get("power") or {}) if i == 0 else "",
                }
            )
    return out


def walls(run: RunReader, fig: Figures) -> list[Block]:
    """Both frames for this run's agent and (beside it) the positive control's, every store and
    layer: bits, within-grid AUC and accuracy against the null, by ring in the agent frame."""
    agents = [("this run", run)]
    control = RunReader(run.layout.control.root)
    if control.layout.wall_readout.is_file():
        agents.append(("positive control", control))
    rows: list[dict] = []
    for name, reader in agents:
        for r in readouts(reader):
            rows += _rows(name, r)
    return [
        Text(
            "The conditional wall test (issue 39): a per-cell logistic probe whose logit starts "
            "from the wall prior given the grid's size and density, read in absolute cells and "
            "at offsets from the agent (the 7 x 7 box around it, in rings of steps from A: ring 1 is "
            "A's four neighbours, ring 2 the eight cells two moves away), scored on held-out grids in bits per "
            "prior-uncertain cell, within-grid AUC and accuracy, each beside the same probe "
            "fitted on another grid's anchors of the same size and density (the null). A frame "
            "is read (yes) when the bits and AUC intervals of probe minus null both lie above "
            "0; a 'no' needs the committed power curve of this design, otherwise it is "
            "'undecided'."
        ),
        records_table(
            rows,
            caption="Held-out grids only (split by grid, the probe sweep's split); 95% "
            "grid-bootstrap intervals; bits over the size-and-density prior.",
        ),
    ]
