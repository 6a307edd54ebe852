"""Where the representational and causal headline rows get their numbers: the cell probes, the
position probes and the distance regressors against their strongest prior, the plan decoder
against its strongest baseline, and patching at the anchors against a random other grid. One
reader per row spec (:mod:`goalprobe.report.row_specs`); :mod:`goalprobe.report.readers` holds
the behavioural and scoring ones."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from goalprobe.report.blocks import num, pct, stat_text
from goalprobe.report.readers import Reading, answer, check_outcome, file_role
from goalprobe.report.run import MissingInput, RunReader, metric
from goalprobe.stages import (
    HEADLINE_PROBE,
    HEADLINE_STAGE,
    committed_power,
    headline_layer,
    headline_run,
)
from goalprobe.stats import Estimate

_PROBE_LABELS = {
    "accuracy_no_padding": "Cognitive map: probe accuracy on grid cells",
    "auc/wall": "Cognitive map: wall AUC (rank-based, class-balance free)",
    "agent_top1": "Agent localisation, top-1",
    "goal_top1": "Goal localisation, top-1",
}


def headline_sweep(paths) -> tuple[str, dict]:
    """The sweep of the headline probe kind and family among ``paths`` (by file stem
    ``cell_<kind>_<family>``): ``(stem, sweep)``."""
    kind, family = HEADLINE_PROBE
    wanted = f"cell_{kind}_{family}"
    for path in paths:
        if Path(path).stem == wanted:
            return wanted, json.loads(Path(path).read_text())
    raise MissingInput(f"no {wanted}.json among the probing-set sweeps")


def _selectivity(
    finding: str,
    value: Mapping | None,
    sel: Mapping,
    base: Mapping | None,
    percent: bool,
    n_grids: int | None,
) -> Reading:
    strongest = sel["baseline"]
    reason = str(sel.get("reason", ""))
    if not reason and sel.get("seeds_disagree"):
        reason = (
            f"the {sel.get('n_seeds', 'several')} training seeds disagree by more than their "
            f"intervals (seed sd {num(sel.get('seed_sd'))})"
        )
    return Reading(
        finding,
        stat_text(value, percent=percent),
        (
            f"strongest control {strongest} {stat_text(base, percent=percent)}; selectivity "
            if base is not None
            else f"selectivity over the strongest prior ({strongest}) across seeds "
        )
        + stat_text(sel, percent=percent),
        Estimate.from_dict({"n_grids": n_grids, **sel}),
        question=f"above {strongest}",
        answer=answer(sel.get("verdict") or sel.get("above_baseline")),
        percent=percent,
        reason=reason,
    )


def probe(run: RunReader, key: str) -> Reading:
    """The headline cell probe's ``key`` metric on the probing set, over training seeds where
    they were pooled (:mod:`goalprobe.probes.probe_sweep`), else from the sweep's selectivity."""
    _, sweep = headline_sweep(run.layout.probing_probe_sweeps())
    head = headline_run(sweep)
    if head is None:
        raise MissingInput("no headline-stage run in the probe sweep")
    m, where = head["metrics"], f"{head['name']}, {head['n_test_grids']} test grids"
    seeds = run.optional_json(run.layout.probing_headline_seeds)
    if seeds and key in seeds.get("pooled", {}):
        pooled = seeds["pooled"][key]
        where += f"; {len(seeds['seeds'])} training seeds pooled"
        value, sel, base = pooled["probe"], pooled["selectivity"], None
    else:
        sel = m["selectivity"][key]
        value, base = metric(m, "probe", key), metric(m, sel["baseline"], key)
    finding = f"{_PROBE_LABELS[key]} (probing set, {where}; Figs. 6-7)"
    out = _selectivity(finding, value, sel, base, True, head["n_test_grids"])
    return wall_auc_power(out) if key == "auc/wall" else out


def position(run: RunReader, target: str) -> Reading:
    """The ``target`` (agent, goal) position probe's top-1 against its strongest prior."""
    pos = run.json(run.layout.probing_positions)
    result = pos[target]
    sel = result["selectivity"]["top1"]
    unconverged = [m for m, ok in result.get("converged", {}).items() if not ok]
    note = f"; solver did not converge: {', '.join(unconverged)}" if unconverged else ""
    finding = (
        f"{target.capitalize()} position probe, top-1 (probing set, {pos['stage']} "
        f"L{pos['layer']}, {result['n_grids']} test grids; Fig. 7{note})"
    )
    base = result["models"][sel["baseline"]]["top1"]
    probe_top1 = result["models"]["probe"]["top1"]
    return _selectivity(finding, probe_top1, sel, base, True, result["n_grids"])


def distance(run: RunReader, family: str) -> Reading:
    """The ``family`` (linear, quadratic, mlp) goal-distance regressor's R² against its
    strongest prior."""
    path = run.layout.probing_distance / f"distance_{family}.json"
    head = headline_run(run.json(path))
    if head is None:
        raise MissingInput(f"no headline-stage run in {path.name}")
    m = head["metrics"]
    sel = m["selectivity"]["r2"]
    finding = f"Goal distance R² ({family} regressor, {head['name']}, probing set; Table 4)"
    base = metric(m, sel["baseline"], "r2")
    return _selectivity(
        finding, metric(m, "probe", "r2"), sel, base, False, head.get("n_test_grids")
    )


def baseline_name(name: str) -> str:
    """A baseline's name in a plan verdict, without its stage and layer."""
    return name.rsplit("/", 1)[-1].replace("_", " ")


def _plan_head(run: RunReader) -> Mapping:
    runs = run.json(run.layout.plan_sweep)["runs"]
    decoders = [r for r in runs if r["kind"] == "decoder" and r["stage"] == HEADLINE_STAGE]
    layer = headline_layer({r["layer"] for r in decoders})
    return min((r for r in decoders if r["layer"] == layer), key=lambda r: r["decoder_layers"])


def _plan_Reading(finding: str, v: Mapping, extra: str = "") -> Reading:
    strongest = v["strongest"]
    return Reading(
        finding,
        stat_text(v["decoder"]),
        f"strongest: {baseline_name(strongest)} {pct(v['baselines'][strongest])}{extra}",
        Estimate.from_dict({"n_grids": (v["decoder"] or {}).get("n_grids"), **v["difference"]})
        if v.get("difference")
        else None,
        question="above the strongest baseline",
        answer=answer(v["verdict"]),
        role=file_role(v.get("role")),
    )


def plan(run: RunReader, n: str) -> Reading:
    """The headline decoder's prefix accuracy at N = ``n`` against the strongest baseline (the
    majority plan, the shuffled control, the state-only decoder, the optimal policy's plan,
    0.25^N); descriptive, as the optimal policy's plan wins wherever the agent follows it."""
    head = _plan_head(run)
    verdicts = {v["n"]: v for v in head.get("verdicts") or []}
    v = verdicts[int(n)]
    n_grids = (verdicts[1]["decoder"] or {}).get("n_grids")
    return _plan_Reading(
        f"Plan decoder prefix accuracy N={n} ({head['name']}, {v['n_rows']} test rows, "
        f"{n_grids} grids; Fig. 10)",
        v,
        f" (0.25^N {pct(0.25 ** int(n))})",
    )


def departures(run: RunReader, arg: str) -> Reading:
    """The decoder at N = 1 on the rows where the agent departs from the optimal policy or
    breaks a tie (where only a plan read-out can beat the optimal policy's plan)."""
    verdict = (_plan_head(run).get("departures") or {}).get("verdict_n1")
    if not verdict or not verdict.get("n_rows"):
        raise KeyError("no departure rows in the plan sweep")
    return _plan_Reading(
        f"Plan decoder N=1 where the agent departs from the optimal policy or breaks a tie "
        f"({verdict['n_rows']} test rows)",
        verdict,
    )


_MODES = {
    "pre_reasoning": ("regenerated",),
    "post_reasoning": ("teacher_forced",),
    "grid": ("regenerated", "teacher_forced"),
}
"""The patching mode each site's row reads, in order of preference: the pre-reasoning row is
the test (regenerated), the post-reasoning row is teacher-forced and descriptive (the answer may
copy the fixed reasoning's plan), the grid row is the sanity check (regenerated: it can pass)."""


def patching(run: RunReader, site: str) -> Reading:
    """Every block patched at ``site`` (cf -> base): the share of disjoint pairs moved into the
    counterfactual's optimal set against a random other grid of the same size, with invalid
    answers, the no-change controls and the recovered logit difference (teacher-forced runs
    only: a regenerated run has none) beside it."""
    data = run.json(run.layout.patch_results)
    verdicts = {(v["site"], v["mode"], v["direction"]): v for v in data.get("verdicts") or []}
    found = [
        verdicts[(site, m, "cf_to_base")]
        for m in _MODES[site]
        if (site, m, "cf_to_base") in verdicts
    ]
    if not found:
        raise KeyError(f"no {site} patching verdict")
    v = found[0]
    mode = v["mode"].replace("_", " ")
    what = (
        "Sanity check, true for any agent that acts on its input: every block at the grid tokens"
        if site == "grid"
        else f"Patching the {site.replace('_', '-')} anchors at every block"
    )
    recovered = v.get("recovered") or {}
    logit = (
        f"; logit diff. recovered {stat_text(recovered, percent=False, digits=2)}"
        if v["mode"] == "teacher_forced" and recovered.get("value") is not None
        else ""
    )
    bound = v.get("moved_bound")
    bound_text = "" if bound is None else f"; moved at most {pct(bound)} (exact 95% bound)"
    check = check_outcome(v.get("sanity_passed"))
    notes = [x for x in (v.get("flag"), v.get("note")) if x]
    return Reading(
        f"{what} ({mode}, cf->base): action into the counterfactual's optimal set "
        f"(n={v['n_pairs']} pairs, {v['n_grids']} grids)"
        + (f"; {'; '.join(notes)}" if notes else ""),
        f"{stat_text(v['moved'])}; invalid answers {pct(v['invalid']['value'])}{logit}"
        + bound_text,
        f"random other grid {stat_text(v['random_grid'])}; no-change controls changed "
        f"{stat_text(v['control_changed'])} (n={v['control_changed']['n']})",
        Estimate.from_dict({"n_grids": v["n_grids"], **(v.get("difference") or {})}),
        question="moves it beyond a random grid",
        answer=answer(v["verdict"]),
        role=file_role(v.get("role")),
        check=check,
        reason=(v.get("flag") or "") if check == "flagged" else "",
    )


def wall_auc_power(reading: Reading) -> Reading:
    """The cell probe's wall-AUC row with the power of its design beside it (the committed power
    curve): where that probe detected no planted wall map, a "no" of this row cannot exclude one
    and reads "undecided"."""
    data = committed_power()
    mde = None if data is None else data.get("minimum_detectable_effect")
    if data is not None and mde is not None:
        auc = data.get("auc_at_mde")
        text = (
            f"; power: planted wall maps of strength {mde:g} detected (probe wall AUC {pct(auc)})"
        )
        return replace(reading, baseline=reading.baseline + text)
    largest = None if data is None else max((data.get("design") or {}).get("signals") or [0])
    shown = (
        "no power curve shown"
        if largest is None
        else (f"no planted wall map up to strength {largest:g} detected by this probe")
    )
    text = f"; power: {shown} (the walls rows carry the conditional test with its power)"
    out = replace(reading, baseline=reading.baseline + text)
    if out.answer == "no":
        out = replace(out, answer="undecided", reason=shown)
    return out


def steering(run: RunReader, arg: str) -> Reading:
    """Steering the pre-reasoning anchors along the agent-centred wall probe's direction for one
    neighbour of the agent: the share of test states whose regenerated action
    moves into the edited map's optimal set, against a random direction of the same norm and
    the probe's edit of an irrelevant cell (paired on the same states)."""
    data = run.json(run.layout.steering_results)
    if not data.get("n_states"):
        dropped = "; ".join(f"{n} {why}" for why, n in (data.get("dropped") or {}).items())
        return Reading(
            f"Steering along the agent-centred wall probe: no test state kept ({dropped})",
            "–",
            "random direction; irrelevant cell",
            None,
            question="moves it beyond both controls",
            answer=answer(data.get("verdict")),
            role=file_role(data.get("role")),
            reason=str(data.get("reason", "")),
        )
    rates, tested = data["rates"], data["tested"]
    flips = data.get("read_flip") or {}
    flip = (
        f"; the probe's read-out flipped on {pct(flips['probe'])} of {flips['n']} "
        "prior-uncertain targets"
        if flips.get("probe") is not None
        else ""
    )
    finding = (
        f"Steering the {data['stage'].replace('_', '-')} anchors (block {data['layer']}) along "
        "the agent-centred wall probe for one neighbour of the agent, reasoning regenerated: "
        f"action into the edited map's optimal set (n={data['n_states']} states, "
        f"{data['n_grids']} test grids{flip})"
    )
    return Reading(
        finding,
        stat_text(rates["probe"]),
        f"random direction {stat_text(rates['random'])}; irrelevant cell "
        f"{stat_text(rates['irrelevant'])}; unedited {stat_text(rates['none'])}; probe minus "
        f"{tested['control']} (paired) {stat_text(tested)}",
        Estimate.from_dict(tested),
        question="moves it beyond both controls",
        answer=answer(data.get("verdict")),
        role=file_role(data.get("role")),
        detectable=data.get("detectable"),
        reason=str(data.get("reason", "")) if data.get("verdict") != "yes" else "",
    )
