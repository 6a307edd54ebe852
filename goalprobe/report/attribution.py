"""Report section and headline reader on where the agents read the coordinates from (issue 41):
attribution patching's metric (b), the log-probability of the coordinates the reasoning writes,
attributed to every block x prompt position of the patching stage's pairs
(``RUN/attribution/``; :mod:`goalprobe.stages.attribution`), for this run's agent and the
positive control beside it, with the check against real patches where the stage ran one."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from goalprobe.report.blocks import Block, Figures, Text, num, pct, records_table, stat_text, table
from goalprobe.report.readers import Reading
from goalprobe.report.run import MissingInput, RunReader
from goalprobe.stats import Estimate

REGION_WORDS: dict[str, str] = {
    "changed_cells": "the two changed grid cells' tokens",
    "other_grid": "the rest of the grid's tokens",
    "instructions": "the instructions (every other prompt token)",
    "pre_reasoning": "the pre-reasoning anchors",
}
"""Each region of :data:`goalprobe.probes.attribution.REGIONS` in words."""

METRIC_WORDS: dict[str, str] = {
    "coordinates": "metric (b), the coordinates' log-probability",
    "action": "metric (a), the answered action's logit difference",
}


DAS_CARD = "das.json"
"""File name of a named agent's DAS card, beside its weights (``scripts/das_anchors.py``)."""

DAS_CARD_SCHEMA = "goalprobe.das_card/1"
"""``schema`` of a DAS card (docs/formats.md, "DAS card")."""


def weights_sha256(model: str | Path) -> str | None:
    """sha256 of ``model.safetensors`` of a named agent or a model directory (None: no such file)."""
    from goalprobe.agents.bundled import named_agent

    agent = named_agent(str(model))
    path = (agent.directory if agent is not None else Path(model)) / "model.safetensors"
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def das_card(model: str) -> dict | None:
    """The DAS card shipped with the named agent ``model`` (None: it has none), with ``stale``
    set when its weights' digest is not the shipped one's (another schema: :class:`MissingInput`)."""
    from goalprobe.agents.bundled import named_agent

    agent = named_agent(model)
    path = None if agent is None else agent.directory / DAS_CARD
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != DAS_CARD_SCHEMA:
        raise MissingInput(f"{path}: schema {data.get('schema')!r}, expected {DAS_CARD_SCHEMA!r}")
    return {**data, "stale": data.get("weights_sha256") != weights_sha256(model)}


def das_blocks(model: str) -> list[Block]:
    """The control's trained subspace (DAS) at its anchors, from its card: the smallest rank
    reaching 90% of the full anchor patch, the random subspace of the same rank, the principal
    angles to the position probes and the natural-variation check (issue 41, item 5)."""
    data = das_card(model)
    if data is None:
        return []
    rows = [
        (
            r["rank"], stat_text(r["das"]), stat_text(r["random"]), num(r["fraction_of_full"], 2),
            ", ".join(f"{a:.0f}" for a in r["angles_das_deg"]),
            ", ".join(f"{a:.0f}" for a in r["angles_random_deg"]),
            f"{num(r['natural_r2_das'], 2)} / {num(r['natural_r2_random'], 2)}",
        )
        for r in data["rows"]
    ]  # fmt: skip
    smallest = data.get("smallest_rank_reaching_90pct_of_full")
    stale = "; STALE: the weights have changed since, so these figures describe other weights"
    caption = (
        f"Trained subspace interventions (DAS) at {model}'s pre-reasoning anchors, block "
        f"{data['block']}: a rank-k subspace trained on {data['train_pairs']} pairs so that "
        "interchanging it makes the base produce the counterfactual's completion, evaluated on "
        f"{data['test_pairs']} disjoint pairs of {data['test_grids']} held-out grids (share whose "
        "action moves into the counterfactual's optimal set; the full anchor patch moves "
        f"{stat_text(data['full_patch'])}). Smallest rank reaching 90% of the full patch: "
        f"{smallest if smallest is not None else 'none of those tried'}. From the agent's DAS "
        f"card ({data['command']}), measured once on the shipped weights, not in this run"
        f"{stale if data['stale'] else ''}."
    )
    header = ("rank k", "DAS: moved", "random k: moved", "DAS / full",
              "angles to the position probes (deg)", "random's", "natural R^2 DAS / random")  # fmt: skip
    return [table(header, rows, caption)]


def share_text(top: Mapping) -> str:
    """The top region's share with its interval over grids (in words with one grid)."""
    text = stat_text(top["share"])
    return text if top["share"].get("ci_low") is not None else f"{text} (one grid: no interval)"


def counts_text(top: Mapping) -> str:
    """``"n = 10 pairs on 5 grids"``."""
    grids = top["n_grids"]
    return f"n = {top['n_pairs']} pairs on {grids} grid{'' if grids == 1 else 's'}"


def where_text(top: Mapping) -> str:
    """``"the pre-reasoning anchors: 62% [40%, 80%] of the attribution (uniform 3%; n = ...)"``."""
    return (
        f"{REGION_WORDS[top['region']]}: {share_text(top)} of the attribution "
        f"(uniform over the affected positions {pct(top['uniform_share'])}; {counts_text(top)})"
    )


def where_read_row(run: RunReader, arg: str) -> Reading:
    """The headline row (descriptive): the region ``arg``'s metric is read from most, and its
    share of the attribution, beside a uniform attribution's."""
    top = (run.json(run.layout.attribution).get("top_region") or {}).get(arg)
    if top is None:
        raise KeyError(f"no {arg} attribution")
    return Reading(
        f"Where the coordinates are read from: the region with the largest share of "
        f"{METRIC_WORDS[arg]}'s attribution (GradDrop; chosen on the same pairs: a location, "
        "not a test)",
        f"{top['region'].replace('_', ' ')} {share_text(top)}; {counts_text(top)}",
        f"uniform {pct(top['uniform_share'])}",
        Estimate.from_dict(top["share"]),
        top["uniform_share"],
        question="where",
    )


def _agent_blocks(run: RunReader, who: str, fig: Figures) -> list[Block]:
    try:
        data = run.json(run.layout.attribution)
    except MissingInput as err:
        return [Text(f"{who}: not run ({err}).")]
    blocks: list[Block] = []
    for metric in ("coordinates", "action"):
        top = (data.get("top_region") or {}).get(metric)
        where = (data.get("where") or {}).get(metric)
        if top is None or where is None:
            blocks.append(Text(f"{who}, {METRIC_WORDS[metric]}: no pair defines it."))
            continue
        blocks.append(Text(f"{who} ({data['model']}), {METRIC_WORDS[metric]}: read most from "
                           f"{where_text(top)}."))  # fmt: skip
        rows = [
            (str(block), *(pct(v) for v in shares))
            for block, shares in enumerate(where["share_by_block"])
        ]
        blocks.append(
            table(
                ("block", *where["regions"]),
                rows,
                caption=f"Share of the summed {where['source']} magnitude by block and prompt "
                f"region, mean over {where['n_pairs']} pairs on {where['n_grids']} grids "
                f"({who}). Whole rows sum over blocks to 100%.",
            )
        )
        if metric == "coordinates":
            blocks.append(fig(_first_map(run, metric)))
    return blocks


def _first_map(run: RunReader, metric: str):
    """The heat map of the first pair of ``metric`` (grid cells laid out as the grid x blocks)."""
    from goalprobe.probes.attribution import read_attributions
    from goalprobe.stages.attribution import heatmap_figure

    records, _ = read_attributions(run.layout.attribution)
    return heatmap_figure(next(r for r in records if r.metric == metric))


def _check_rows(run: RunReader, who: str) -> list[dict]:
    from goalprobe.probes.attribution_check import diagnose
    from goalprobe.stages.attribution import read_check

    check = read_check(run.layout.attribution_check)
    return [
        {
            "agent": who,
            "metric": metric,
            "pair": e["pair_id"],
            "affected sites": e["n_sites"],
            "rho AtP vs effect": num(e["spearman"], 2),
            "rho GradDrop vs |effect|": num(e["spearman_graddrop"], 2),
            "top-k hits": f"{e['hits_top']}/{e['top_k']}",
            "k random (expected)": pct(e["random_hit_rate"]),
            "estimate / effect (top decile)": num(e["scale_top"], 2),
            "whole-prompt effect": num(e["total_effect"], 3),
            "where and why they disagree": diagnose(
                e["spearman"], e["scale_top"], e["wrong_sign_top"]
            ),
        }
        for metric, entries in (check["metrics"].items() if check else ())
        for e in entries
    ]


def attribution(run: RunReader, fig: Figures) -> list[Block]:
    """Both agents: where metric (b) says the coordinates are read from (region shares by block
    with n, the heat map of the first pair), metric (a) beside it, and the check against real
    patches where the stage ran one."""
    run.json(run.layout.attribution)  # this run's stage must have run: MissingInput otherwise
    control = RunReader(run.layout.control.root)
    blocks: list[Block] = [
        Text(
            "Attribution patching (AtP with AtP*'s GradDrop) estimates, from one gradient run "
            "per pair, what patching each block x prompt position of the counterfactual into "
            "the base would do to a metric, for the patching stage's first disjoint pairs, both "
            "runs teacher-forced on the base's own reasoning. Metric (b) asks where the "
            "coordinates the reasoning writes (A is at (r, c). G is at (r, c)) are read from. "
            "The top region is chosen on the same pairs (a location, not a test); the uniform "
            "share is what an attribution spread evenly over the affected positions would give."
        )
    ]
    blocks += _agent_blocks(run, "Default agent", fig)
    rows = _check_rows(run, "default")
    with_control = control.layout.stages_dir.is_dir()
    if with_control:
        blocks += _agent_blocks(control, "Positive control", fig)
        rows += _check_rows(control, "control")
    if rows:
        blocks.append(
            records_table(
                rows,
                caption="Attribution against the real patch of every affected block x position "
                "of the first pair(s) (probes/attribution_check.py). A hit: a site whose real "
                "|effect| is in the pair's top decile. Estimate / effect well below 1: saturation "
                "(the coordinates are written with probability about 1) or cancellation.",
            )
        )
    if with_control:
        blocks += das_blocks(control.json(control.layout.attribution)["model"])
    return blocks
