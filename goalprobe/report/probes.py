"""Report sections on representations: cell-type probes (Figs. 6, 8, 15), agent and goal
localisation (Fig. 7) and goal-distance regressors (Table 4)."""

from __future__ import annotations

from goalprobe.report.blocks import Block, Figures, stat_text, table
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
            x = f"{r['stage'].split('_')[0]} L{r['layer']}"
            stat = metric(r["metrics"], "probe", ACCURACY) or {}
            models = r["metrics"].get("models", {})
            bars.append(
                {"name": x, "group": label, **stat, "baselines": baseline_values(models, ACCURACY)}
            )
            diff = r["metrics"].get("differences", {}).get("probe - shuffled", {}).get(ACCURACY)
            rows.append(
                (
                    label,
                    r["stage"],
                    r["layer"],
                    r["n_test"],
                    stat_text(stat),
                    stat_text(metric(r["metrics"], "probe", "balanced_accuracy")),
                    stat_text(metric(r["metrics"], "majority", ACCURACY)),
                    stat_text(metric(r["metrics"], "shuffled", ACCURACY)),
                    stat_text(diff),
                )
            )
    comparison = probe_comparison_figure(
        bars,
        y_title="accuracy on grid cells (test grids)",
        title="Cell-type probe accuracy by family, stage and layer (95% grid-bootstrap CI); "
        "marks: majority, size and size-density priors, shuffled labels",
    )
    runs_table = table(
        (
            "probe",
            "stage",
            "layer",
            "test rows",
            "accuracy (grid cells)",
            "balanced accuracy",
            "majority class",
            "shuffled labels",
            "selectivity (probe − shuffled)",
        ),
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
            rows.append(
                (
                    obj,
                    group,
                    stat_text(metric(g, "probe", f"{obj}_top1")),
                    stat_text(metric(g, "majority", f"{obj}_top1")),
                    stat_text(metric(g, "shuffled", f"{obj}_top1")),
                    stat_text(metric(g, "probe", f"{obj}_manhattan"), percent=False, digits=2),
                    stat_text(metric(g, "shuffled", f"{obj}_manhattan"), percent=False, digits=2),
                )
            )
    localisation_table = table(
        (
            "object",
            "grid size",
            "top-1",
            "top-1 majority",
            "top-1 shuffled",
            "Manhattan",
            "Manhattan shuffled",
        ),
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
                (
                    name.removeprefix("distance_"),
                    r["stage"],
                    r["layer"],
                    r["n_test"],
                    stat_text(metric(m, "probe", "mae"), percent=False, digits=2),
                    stat_text(metric(m, "probe", "r2"), percent=False),
                    stat_text(metric(m, "mean", "mae"), percent=False, digits=2),
                    stat_text(metric(m, "shuffled", "r2"), percent=False),
                )
            )
    return [
        table(
            (
                "regressor",
                "stage",
                "layer",
                "test rows",
                "MAE",
                "R²",
                "MAE of the mean",
                "R² shuffled labels",
            ),
            rows,
            caption="Shortest-path distance to the goal from the anchor activations; test grids.",
        )
    ]
