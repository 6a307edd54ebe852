"""Report sections on what the representations do: policy against decoded belief and MEG
(Table 2, Fig. 9), the one-shot plan decoder (Fig. 10, Table 5) and activation patching
(section 5.2, appendix F)."""

from __future__ import annotations

from goalprobe.report.blocks import Block, Box, Figures, num, pct, stat_text, table
from goalprobe.report.run import MissingInput, RunReader
from goalprobe.viewer.figures import (
    belief_figure,
    meg_figure,
    patching_heatmap_figure,
    prefix_accuracy_grid_figure,
    sweep_runs,
    topk_figure,
)


def belief(run: RunReader, fig: Figures) -> list[Block]:
    """Acc. GT, Acc. Dec., Agreement and Recovery by size and density; top-k; MEG."""
    summary = run.json(run.layout.belief)
    key = summary.get("default_probe") or next(iter(summary["probes"]))
    entry = summary["probes"][key]
    metrics = ("acc_gt", "acc_dec", "agreement", "recovery", "chance_acc_gt", "chance_acc_dec")
    rows = []
    for group_name, groups in (("size", entry["by_size"]), ("density", entry["by_density"])):
        for value, stats in groups.items():
            rows.append((f"{group_name} {value}", *(stat_text(stats.get(m)) for m in metrics)))
    rows.append(("all", *(stat_text(entry["overall"].get(m)) for m in metrics)))
    groups_table = table(
        ("group", "Acc. GT", "Acc. Dec.", "Agreement", "Recovery", "chance GT", "chance Dec."),
        rows,
        caption=f"Probe {key} ({entry.get('family')}, {entry.get('stage')}, layer "
        f"{entry.get('layer')}); decoded maps exist for test grids only. Chance: a uniformly "
        "random action. 95% grid-bootstrap intervals.",
    )
    blocks: list[Block] = [fig(belief_figure(summary)), groups_table, fig(topk_figure(summary))]
    try:
        meg = run.json(run.layout.meg)
    except MissingInput as err:
        blocks.append(Box("not_run", f"MEG: {err}"))
        return blocks
    overall = meg.get("overall", {})
    paired = overall.get("paired") or {}
    null = overall.get("vs_random_walk") or {}
    blocks.append(fig(meg_figure(meg)))
    blocks.append(
        table(
            ("MEG (nats)", "value [95% CI]"),
            [
                ("true grid, all grids", stat_text(overall["true"]["meg"], percent=False)),
                (
                    "subjective (decoded grid), paired grids",
                    stat_text((paired.get("subjective") or {}).get("meg"), percent=False),
                ),
                (
                    "subjective − true",
                    stat_text((paired.get("difference") or {}).get("meg"), percent=False),
                ),
                (
                    "null: random walk estimated the same way",
                    stat_text(null.get("random_walk", {}).get("meg"), percent=False),
                ),
                (
                    "true − null, paired by grid (the verdict)",
                    stat_text(null.get("difference", {}).get("meg"), percent=False),
                ),
            ],
            caption="Known-utility MEG of the agent's empirical policy. MEG is a supremum over "
            "beta including 0, so it is never negative and a random walk read from a few "
            "trajectories scores above 0: the null is the random walk's MEG estimated from "
            "the same number of trajectories per grid, and the agent is goal-directed only "
            "where its paired difference to that null excludes 0.",
        )
    )
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
            (
                r["stage"],
                r["layer"],
                r["kind"].replace("_", " ")
                + ("" if r["decoder_layers"] is None else f" {r['decoder_layers']}L"),
                pct(acc[0]),
                pct(acc[2]) if len(acc) > 2 else "–",
                pct(acc[4]) if len(acc) > 4 else "–",
                pct(m.get("exact_length_match")),
                num(m.get("mean_predicted_length"), 2),
                num(m.get("mean_true_length"), 2),
                num(m.get("length_bias"), 2),
                num(m.get("median_abs_length_error"), 1),
            )
        )
    lengths = table(
        (
            "stage",
            "layer",
            "predictor",
            "N=1",
            "N=3",
            "N=5",
            "exact length",
            "mean predicted length",
            "mean true length",
            "bias",
            "median |error|",
        ),
        rows,
        caption="Random baseline 0.25^N: N=1 25.0%, N=3 1.6%, N=5 0.1%. Table 5: length "
        "analysis (plans censored at T = 10).",
    )
    return [fig(figure), lengths]


def patching(run: RunReader, fig: Figures) -> list[Block]:
    """Action changed per site x layer set (teacher-forced), with the control's stability."""
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
    control = {
        (r["direction"], r["site"], r["layers"]): r
        for r in summary
        if r["kind"] == "control" and r["mode"] == "teacher_forced"
    }
    rows = []
    for r in summary:
        if r["kind"] != "disjoint" or r["mode"] != "teacher_forced":
            continue
        c = control.get((r["direction"], r["site"], r["layers"]))
        low, high = r["action_changed_ci"]
        rows.append(
            (
                r["direction"],
                r["site"],
                r["layers"],
                r["n_runs"],
                f"{pct(r['action_changed_rate'])} [{pct(low)}, {pct(high)}]",
                pct(r["into_source_optimal_rate"]),
                num(r["recovered_mean"]),
                "–" if c is None else f"{pct(c['stable_rate'])} (n={c['n_runs']})",
            )
        )
    sites = table(
        (
            "direction",
            "site",
            "layers",
            "runs",
            "action changed [95% CI]",
            "into source's optimal set",
            "logit diff. recovered",
            "control stable",
        ),
        rows,
        caption=f"{data.get('n_bases', '?')} base steps; reasoning held fixed (teacher-forced). "
        "The study found single-layer patches never changed GPT-OSS-20B's action (0/456), "
        "all-layer patches always did.",
    )
    records = data.get("records", [])
    if not records:
        return [sites]
    heatmap = patching_heatmap_figure(
        records, value="action_changed", title="Action changed by site and layer set"
    )
    return [fig(heatmap), sites]
