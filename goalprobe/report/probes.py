"""Report sections on representations: cell-type probes (Figs. 6, 8, 15), agent and goal
localisation (Fig. 7) and goal-distance regressors (Table 4)."""

from __future__ import annotations

from goalprobe.report.blocks import Block, Figures, records_table, stat_text, table
from goalprobe.report.run import MissingInput, RunReader, best_cell_run, metric
from goalprobe.viewer.figures.probes import (
    baseline_values,
    localisation_figure,
    per_class_figure,
    probe_comparison_figure,
)

ACCURACY = "accuracy_no_padding"
"""The probes' headline metric: accuracy on grid cells (padding excluded)."""


def probes(run: RunReader, fig: Figures) -> list[Block]:
    """Accuracy by family, stage and layer against its baselines; per class; pre vs post."""
    sweeps = run.cell_sweeps()
    bars, rows = [], []
    for name, sweep in sweeps.items():
        label = name.removeprefix("cell_").replace("_", " ")
        for r in sweep["runs"]:
            m, x = r["metrics"], f"{r['stage'].split('_')[0]} L{r['layer']}"
            stat = metric(m, "probe", ACCURACY) or {}
            baselines = baseline_values(m.get("models", {}), ACCURACY)
            bars.append({"name": x, "group": label, **stat, "baselines": baselines})
            diff = m.get("differences", {}).get("probe - shuffled", {}).get(ACCURACY)
            rows.append(
                {
                    "probe": label,
                    "stage": r["stage"],
                    "layer": r["layer"],
                    "test rows": r["n_test"],
                    "accuracy (grid cells)": stat_text(stat),
                    "balanced accuracy": stat_text(metric(m, "probe", "balanced_accuracy")),
                    "majority class": stat_text(metric(m, "majority", ACCURACY)),
                    "shuffled labels": stat_text(metric(m, "shuffled", ACCURACY)),
                    "selectivity (probe − shuffled)": stat_text(diff),
                }
            )
    comparison = probe_comparison_figure(
        bars,
        y_title="accuracy on grid cells (test grids)",
        title="Cell-type probe accuracy by family, stage and layer (95% grid-bootstrap CI); "
        "marks: majority, size and size-density priors, shuffled labels",
    )
    runs_table = records_table(
        rows,
        caption="Test grids only (split by grid, never by row); padding cells excluded.",
    )
    best_name, best = best_cell_run(sweeps)
    per_class = per_class_figure(best["metrics"].get("by_grid_size", {}), best_name)
    stages = []
    for name, sweep in sweeps.items():
        for comp in sweep.get("stage_comparisons", []):
            for key, diff in comp["metrics"].get("differences", {}).items():
                stages.append(
                    (name.removeprefix("cell_"), comp["layer"], key, stat_text(diff.get(ACCURACY)))
                )
    stage_table = table(
        ("probe", "layer", "difference", "accuracy difference [95% CI]"),
        stages,
        caption="Fig. 8: paired pre- vs post-reasoning accuracy on the same test steps.",
    )
    return [fig(comparison), runs_table, fig(per_class), stage_table]


def localisation(run: RunReader, fig: Figures) -> list[Block]:
    """Top-1 and Manhattan distance of the decoded agent and goal, overall and by grid size."""
    best_name, best = best_cell_run(run.cell_sweeps())
    groups = {"all": best["metrics"], **best["metrics"].get("by_grid_size", {})}
    rows = []
    for obj in ("agent", "goal"):
        for group, g in groups.items():
            top1, manhattan = f"{obj}_top1", f"{obj}_manhattan"
            rows.append(
                {
                    "object": obj,
                    "grid size": group,
                    "top-1": stat_text(metric(g, "probe", top1)),
                    "top-1 majority": stat_text(metric(g, "majority", top1)),
                    "top-1 shuffled": stat_text(metric(g, "shuffled", top1)),
                    "Manhattan": stat_text(metric(g, "probe", manhattan), percent=False, digits=2),
                    "Manhattan shuffled": stat_text(
                        metric(g, "shuffled", manhattan), percent=False, digits=2
                    ),
                }
            )
    localisation_table = records_table(
        rows,
        caption="Argmax cell of the probe's agent/goal probability against the true cell.",
    )
    return [fig(localisation_figure(groups, best_name)), localisation_table]


def distance(run: RunReader, fig: Figures) -> list[Block]:
    """Table 4: MAE and R² of the goal-distance regressors against the mean and shuffled."""
    sweeps = run.distance_sweeps()
    if not sweeps:
        where = run.layout.relative(run.layout.distance_sweeps)
        raise MissingInput(f"{where}/*.json not found")
    rows = []
    for name, sweep in sweeps.items():
        for r in sweep["runs"]:
            m = r["metrics"]
            rows.append(
                {
                    "regressor": name.removeprefix("distance_"),
                    "stage": r["stage"],
                    "layer": r["layer"],
                    "test rows": r["n_test"],
                    "MAE": stat_text(metric(m, "probe", "mae"), percent=False, digits=2),
                    "R²": stat_text(metric(m, "probe", "r2"), percent=False),
                    "MAE of the mean": stat_text(metric(m, "mean", "mae"), percent=False, digits=2),
                    "R² shuffled labels": stat_text(metric(m, "shuffled", "r2"), percent=False),
                }
            )
    return [
        records_table(
            rows,
            caption="Shortest-path distance to the goal from the anchor activations; test grids.",
        )
    ]
