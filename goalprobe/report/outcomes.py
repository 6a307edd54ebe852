"""Report sections on what the representations do: policy against decoded belief and MEG
(Table 2, Fig. 9), the one-shot plan decoder (Fig. 10, Table 5) and activation patching
(section 5.2, appendix F)."""

from __future__ import annotations

from goalprobe.probes.patching.sites import CHUNK_PREFIX
from goalprobe.report.blocks import Block, Box, Figures, num, pct, records_table, stat_text, table
from goalprobe.report.causal_rows import baseline_name
from goalprobe.report.loop import loop
from goalprobe.report.run import MissingInput, RunReader
from goalprobe.viewer.figures.patching import patching_heatmap_figure
from goalprobe.viewer.figures.plans import prefix_accuracy_grid_figure, sweep_runs
from goalprobe.viewer.figures.scoring import belief_figure, meg_figure, probe_entry, topk_figure
from goalprobe.viewer.figures.style import layer_key


def belief(run: RunReader, fig: Figures) -> list[Block]:
    """Acc. GT, Acc. Dec., Agreement and Recovery by size and density; top-k; MEG."""
    summary = run.json(run.layout.belief)
    key, entry = probe_entry(summary)
    metrics: tuple[str, ...]
    metrics = ("acc_gt", "acc_dec", "agreement", "recovery", "chance_acc_gt", "chance_acc_dec")
    if "optimal_on_both" in entry["overall"]:
        metrics = (*metrics[:3], "optimal_on_both", *metrics[3:])
    rows = []
    for group_name, groups in (("size", entry["by_size"]), ("density", entry["by_density"])):
        for value, stats in groups.items():
            rows.append((f"{group_name} {value}", *(stat_text(stats.get(m)) for m in metrics)))
    rows.append(("all", *(stat_text(entry["overall"].get(m)) for m in metrics)))
    names = {"acc_gt": "Acc. GT", "acc_dec": "Acc. Dec.", "agreement": "Agreement"}
    names |= {"optimal_on_both": "optimal on both", "recovery": "Recovery"}
    names |= {"chance_acc_gt": "chance GT", "chance_acc_dec": "chance Dec."}
    groups_table = table(
        ("group", *(names[m] for m in metrics)),
        rows,
        caption=f"This run's agent, maps {key} ({entry.get('family')}, {entry.get('stage')}, "
        f"layer {entry.get('layer')}). Chance: a uniformly random action. 95% grid-bootstrap "
        "intervals.",
    )
    blocks: list[Block] = [*loop(run), fig(belief_figure(summary)), groups_table]
    blocks.append(fig(topk_figure(summary)))
    try:
        meg = run.json(run.layout.meg)
    except MissingInput as err:
        blocks.append(Box("not_run", f"MEG: {err}"))
        return blocks
    overall = meg.get("overall", {})
    paired = overall.get("paired") or {}
    null = overall.get("vs_random_walk") or {}
    megs = {
        "true grid, all grids": overall["true"]["meg"],
        "subjective (decoded grid), paired grids": (paired.get("subjective") or {}).get("meg"),
        "subjective − true": (paired.get("difference") or {}).get("meg"),
        "null: random walk estimated the same way": null.get("random_walk", {}).get("meg"),
        "true − null, paired by grid (the verdict)": null.get("difference", {}).get("meg"),
    }
    blocks.append(fig(meg_figure(meg)))
    blocks.append(
        table(
            ("MEG (nats)", "value [95% CI]"),
            [(label, stat_text(stat, percent=False)) for label, stat in megs.items()],
            caption="Known-utility MEG of the agent's empirical policy. MEG is a supremum over "
            "beta including 0, so it is never negative and a random walk read from a few "
            "trajectories scores above 0: the null is the random walk's MEG estimated from "
            "the same number of trajectories per grid, and the agent is goal-directed only "
            "where its paired difference to that null excludes 0.",
        )
    )
    per_step = meg.get("per_step") or {}
    if per_step.get("overall"):
        o = per_step["overall"]
        blocks.append(
            table(
                ("MEG per step (nats)", "value [95% CI]"),
                [
                    ("subjective: the step's decoded map, from the agent's cell",
                     stat_text(o["subjective"], percent=False)),
                    ("true grid, from the same cells", stat_text(o["true"], percent=False)),
                    ("subjective − true", stat_text(o["difference"], percent=False)),
                ],
                caption=f"What it estimates: {per_step['what']}. {per_step['n_steps']} steps "
                f"({per_step['n_states']} distinct states); {per_step['n_unreachable']} steps "
                "whose believed goal is unreachable on their believed grid and "
                f"{per_step['n_other_states']} steps of key/door grids are left out, not "
                "scored 0. Grids weighted as Fig. 4.",
            )
        )  # fmt: skip
    return blocks


def plans(run: RunReader, fig: Figures) -> list[Block]:
    """Prefix accuracy vs N (every stage and layer, small multiples, with the shuffled control
    and 0.25^N in each panel), and Table 5's length analysis."""
    runs = run.json(run.layout.plan_sweep)["runs"]
    decoders = [r for r in runs if r["kind"] == "decoder"]
    if not decoders:
        raise MissingInput(f"{run.layout.relative(run.layout.plan_sweep)} holds no trained decoder")
    figure = prefix_accuracy_grid_figure(
        sweep_runs(runs), title="Fig. 10: prefix accuracy vs N (test grids)"
    )
    rows = []
    for r in runs:
        m = r["metrics"]
        acc = m["prefix_accuracy"]
        rows.append(
            {
                "stage": r["stage"],
                "layer": r["layer"],
                "predictor": r["kind"].replace("_", " ")
                + ("" if r["decoder_layers"] is None else f" {r['decoder_layers']}L"),
                "N=1": pct(acc[0]),
                "N=3": pct(acc[2]) if len(acc) > 2 else "–",
                "N=5": pct(acc[4]) if len(acc) > 4 else "–",
                "exact length": pct(m.get("exact_length_match")),
                "mean predicted length": num(m.get("mean_predicted_length"), 2),
                "mean true length": num(m.get("mean_true_length"), 2),
                "bias": num(m.get("length_bias"), 2),
                "median |error|": num(m.get("median_abs_length_error"), 1),
            }
        )
    lengths = records_table(  # rows: at least the decoders
        rows,
        caption="Random baseline 0.25^N: N=1 25.0%, N=3 1.6%, N=5 0.1%. Table 5: length "
        "analysis (plans censored at T = 10).",
    )
    return [fig(figure), plan_verdicts_table(decoders), lengths]


def _verdict_text(v: dict) -> str:
    detectable = v.get("detectable")
    if v["verdict"] == "yes" or detectable is None:
        return v["verdict"]
    return f"{v['verdict']} (detects {pct(detectable)})"


def plan_verdicts_table(decoders: list[dict]) -> Block:
    """Every decoder against the strongest baseline at N = 1, 2, 3, 5, and at N = 1 where the
    agent departs from the optimal policy or breaks a tie."""
    ns = (1, 2, 3, 5)
    rows = []
    for r in decoders:
        by_n = {v["n"]: v for v in r.get("verdicts") or []}
        line = [r["stage"], r["layer"], f"{r['decoder_layers']}L"]
        for n in ns:
            v = by_n.get(n)
            line.append(
                "–"
                if v is None or not v.get("baselines")
                else f"{pct(v['decoder']['value'])} vs {baseline_name(v['strongest'])} "
                f"{pct(v['baselines'][v['strongest']])}: {_verdict_text(v)}"
            )
        dep = (r.get("departures") or {}).get("verdict_n1")
        line.append(
            "–"
            if not dep or not dep.get("baselines")
            else f"{stat_text(dep['decoder'])} vs {baseline_name(dep['strongest'])} "
            f"{pct(dep['baselines'][dep['strongest']])}: {_verdict_text(dep)} (n={dep['n_rows']})"
        )
        rows.append(tuple(line))
    return table(
        ("stage", "layer", "decoder", *(f"N={n}" for n in ns), "N=1, departures and ties"),
        rows,
        caption="Each decoder against the strongest of 0.25^N, the majority plan, the shuffled "
        "control, a state-only decoder (agent's and goal's cells and the grid's size, trained on "
        "the same rows) and the optimal policy's plan on the true grid. Verdict: yes where the "
        "paired 95% grid-clustered interval of decoder minus strongest lies above 0, else no "
        "with the effect its n could detect. Departures and "
        "ties: the test rows whose first step is not optimal or is one of several optimal "
        "actions, where no state-only predictor is right by construction.",
    )


def patching(run: RunReader, fig: Figures) -> list[Block]:
    """The anchors' verdicts (every block, against a random other grid), the dose-response
    (single blocks, first k and last k blocks, at every site) and the heatmap."""
    data = run.json(run.layout.patch_results)
    summary = data.get("summary", [])
    if not summary:
        prep = data.get("preparation", {})
        return [
            Box(
                "not_run",
                f"no counterfactual pair survived preparation ({prep}); nothing was patched",
            )
        ]
    verdicts = table(
        ("site", "reasoning", "direction", "pairs (grids)", "moved into cf's optimal set",
         "invalid", "random other grid", "controls changed", "logit diff. recovered",
         "moved − random (paired)", "verdict"),
        [
            (
                v["site"], v["mode"].replace("_", " "), v["direction"],
                f"{v['n_pairs']} ({v['n_grids']})", stat_text(v["moved"]),
                pct(v["invalid"]["value"]), stat_text(v["random_grid"]),
                f"{stat_text(v['control_changed'])} (n={v['control_changed']['n']})",
                stat_text(v["recovered"], percent=False, digits=2),
                stat_text(v["difference"]), v["verdict"],
            )
            for v in data.get("verdicts", [])
        ],
        caption="Every block patched at once. Moved: the patched action lies in the "
        "counterfactual's optimal set (the source's); an answer naming no action is invalid, "
        "never moved. The random-grid control patches the same target with a random other grid "
        "of the same size, scored against the pair's counterfactual: a patch that only "
        "disrupts the run moves as often under it. Verdict: the paired difference's 95% "
        "grid-clustered interval lies above 0. At grid and changed_cells the patch transplants "
        "the input: true for any agent that acts on it (a sanity check, no verdict). The upper "
        "bound of 'moved' is the largest effect the pairs cannot exclude.",
    )  # fmt: skip
    dose = [
        r for r in summary if r["kind"] == "disjoint" and not r["site"].startswith(CHUNK_PREFIX)
    ]
    labels = sorted({r["layers"] for r in dose}, key=layer_key)
    cells = {(r["mode"], r["direction"], r["site"], r["layers"]): r for r in dose}
    rows = []
    for mode, direction, site in sorted({k[:3] for k in cells}):
        line = [mode.replace("_", " "), direction, site]
        for label in labels:
            r = cells.get((mode, direction, site, label))
            line.append(
                "–" if r is None else f"{pct(r['into_source_optimal_rate'])} ({r['n_runs']})"
            )
        rows.append(tuple(line))
    dose_table = table(
        ("reasoning", "direction", "site", *labels),
        rows,
        caption=f"Dose-response: share of disjoint pairs moved into the counterfactual's optimal "
        f"set (n runs) by block set: single blocks, the first k and the last k blocks, all. "
        f"{data.get('n_bases', '?')} base steps; pairs kept: {data.get('n_pairs', {})}. The "
        "study: single layers 0/456, all layers always.",
    )
    chunks = reasoning_chunks(data)
    records = data.get("records", [])
    if not records:
        return [verdicts, dose_table, *chunks]
    heatmap = patching_heatmap_figure(
        records, value="into_source_optimal", title="Moved into the source's optimal set"
    )
    return [verdicts, dose_table, *chunks, fig(heatmap)]


def reasoning_chunks(data) -> list[Block]:
    """Patching along the reasoning (issue 30): per reasoning chunk, the share of disjoint
    pairs whose regenerated action moved into the counterfactual's optimal set against the
    same chunk from a random other grid, and the no-change controls."""
    chunks = data.get("reasoning_chunks")
    if not chunks:
        return []
    layer_sets = ", ".join(
        f"{label} (blocks {'+'.join(str(x) for x in layers)})"
        for label, layers in chunks["layer_sets"].items()
    )
    peak = chunks.get("peak") or {}
    chosen = f" Blocks chosen as: {peak['source']}." if peak.get("source") else ""
    rows = [
        (
            v["site"].removeprefix(CHUNK_PREFIX).replace("of", " of "),
            v["layers"],
            f"{v['n_pairs']} ({v['n_grids']})",
            stat_text(v["moved"]),
            pct(v["invalid"]["value"]),
            stat_text(v["random_grid"]),
            f"{stat_text(v['control_changed'])} (n={v['control_changed']['n']})",
            stat_text(v["difference"]),
            v["verdict"],
        )
        for v in chunks["verdicts"]
    ]
    if not rows:
        return [Box("not_run", "no pair was patched along the reasoning")]
    return [
        table(
            ("chunk", "blocks", "pairs (grids)", "moved into cf's optimal set", "invalid",
             "random other grid", "controls changed", "moved − random (paired)", "verdict"),
            rows,
            caption="Patching along the reasoning (cf -> base): the counterfactual's residual "
            f"stream at one chunk of its reasoning written into the base run at {layer_sets}; "
            "the base is teacher-forced on its own reasoning up to the chunk's end and the rest "
            "of the reasoning and the answer are regenerated greedily. Reasonings differ in "
            f"length, so chunks are fractions of each side's reasoning: {chunks['alignment']}"
            f"{chosen} Controls: the same chunk from a random other grid of the same size "
            "(scored against the pair's counterfactual) and from no-relevant-change "
            "counterfactuals. Verdict: the paired difference's grid-clustered interval lies "
            f"above 0; every interval here is at {100 * chunks['confidence']:.1f}% (Bonferroni "
            f"over the {chunks['family']} chunk verdicts).",
        )
    ]  # fmt: skip
