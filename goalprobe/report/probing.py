"""Report section on the probing set: the headline probe at the pre-reasoning anchors of
hundreds of prompt-only states, against its strongest control, and its learning curve."""

from __future__ import annotations

from goalprobe.report.blocks import Block, Figures, stat_text, table
from goalprobe.report.causal_rows import headline_sweep
from goalprobe.report.probes import ACCURACY
from goalprobe.report.run import MissingInput, RunReader, metric
from goalprobe.stages import HEADLINE_STAGE
from goalprobe.viewer.figures.probes import learning_curve_figure

METRICS: tuple[tuple[str, str], ...] = (
    ("accuracy_no_padding", "accuracy on grid cells"),
    ("auc/wall", "wall AUC"),
    ("agent_top1", "agent top-1"),
    ("goal_top1", "goal top-1"),
)
"""Metric -> column label of the per-layer table."""


def probing(run: RunReader, fig: Figures) -> list[Block]:
    """Per layer: the headline probe against its strongest control (selectivity with its
    paired CI and verdict); then the learning curve at the headline layer."""
    name, sweep = headline_sweep(run.layout.probing_probe_sweeps())
    runs = sorted(
        (r for r in sweep["runs"] if r["stage"] == HEADLINE_STAGE), key=lambda r: r["layer"]
    )
    if not runs:
        raise MissingInput(f"the probing-set sweep {name} has no {HEADLINE_STAGE} run")
    rows = []
    for r in runs:
        m = r["metrics"]
        for key, label in METRICS:
            sel = m.get("selectivity", {}).get(key)
            if not sel:
                continue
            rows.append(
                (
                    f"L{r['layer']} (best epoch {r.get('best_epoch') or '–'})",
                    label,
                    stat_text(metric(m, "probe", key)),
                    f"{sel['baseline']} {stat_text(metric(m, sel['baseline'], key))}",
                    stat_text(sel),
                    "yes" if sel["above_baseline"] else "no",
                )
            )
    first = runs[0]
    blocks: list[Block] = [
        table(
            ("layer", "metric", "probe", "strongest control", "probe - control", "above?"),
            rows,
            caption=(
                f"{name.removeprefix('cell_').replace('_', ' ')} probe at the {HEADLINE_STAGE} "
                f"anchors of the probing set ({first['n_train_grids']} training and "
                f"{first['n_test_grids']} test grids, split by grid; prompt-only states, no "
                "rollout). The strongest control is the best of the per-cell majority, the "
                "size and size-and-density priors, shuffled labels and (localisation) a uniform "
                "guess; the difference has a paired grid-bootstrap 95% CI, and 'above?' says "
                "whether that interval excludes 0. The best epoch is the one early stopping kept "
                "(validation grids carved from the training grids); one close to the epoch limit "
                "means the probe had not converged (each card holds its loss history)."
            ),
        )
    ]
    curve = run.optional_json(run.layout.learning_curve)
    if curve is None:
        return blocks
    blocks.append(fig(learning_curve_figure(curve)))
    last = curve["points"][-1]
    verdicts = ", ".join(
        f"{key}: {'above' if sel['above_baseline'] else 'not above'} {sel['baseline']}"
        for key, sel in last.get("selectivity", {}).items()
    )
    blocks.append(
        table(
            ("training grids", "probe accuracy", "strongest prior", "verdicts at this size"),
            [
                (
                    p["n_train_grids"],
                    stat_text(p["models"]["probe"].get(ACCURACY)),
                    stat_text(
                        metric(p, p["selectivity"].get(ACCURACY, {}).get("baseline", ""), ACCURACY)
                    ),
                    ", ".join(
                        f"{k} {'yes' if s['above_baseline'] else 'no'}"
                        for k, s in p["selectivity"].items()
                    ),
                )
                for p in curve["points"]
            ],
            caption=(
                "Learning curve: the probe and its controls refit on nested, size-balanced "
                "subsets of the training grids, scored on the same test grids. A curve still "
                "rising at the right says more data would change the numbers; a flat curve at "
                f"the prior says it would not. At every training grid: {verdicts}."
            ),
        )
    )
    return blocks
