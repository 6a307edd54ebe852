"""Probe results: grouped bars with confidence intervals and baselines, and learning curves (a
probe and its controls against the number of training grids)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from goalprobe.viewer.figures.style import (
    QUALITATIVE,
    band_trace,
    ci_error_y,
    empty_figure,
    figure_layout,
    is_finite_number,
)
from plotly.subplots import make_subplots

BASELINES: dict[str, tuple[str, str]] = {
    "majority": ("majority class per cell", "#000000"),
    "prior_size": ("prior by grid size", "#ff006e"),
    "prior_size_density": ("prior by size and density", "#00b4d8"),
    "shuffled": ("same probe, shuffled labels", "#868e96"),
}
"""Controls a probe sweep computes (``goalprobe.probes.probe_sweep`` ``controls``; the keys of
``metrics.models``) that every accuracy chart draws: model key -> (legend label, colour; none
of them a bar colour)."""


def baseline_values(models: Mapping, metric: str) -> dict[str, float]:
    """The baselines of one probe run: model key -> value of ``metric`` (missing ones left out)
    in an ``evaluate_cell_maps`` ``models`` mapping (model -> metric -> statistic)."""
    out = {}
    for key in BASELINES:
        stat = (models.get(key) or {}).get(metric) if isinstance(models, Mapping) else None
        value = stat.get("value") if isinstance(stat, Mapping) else None
        if is_finite_number(value):
            out[key] = float(value)
    return out


def probe_comparison_figure(
    rows: Sequence[Mapping],
    *,
    y_title: str = "accuracy",
    baseline: float | None = None,
    title: str = "",
    height: int | None = 420,
) -> go.Figure:
    """Grouped bars with confidence intervals (e.g. probe accuracy by family and stage), with
    each bar's own baselines drawn on it as short horizontal marks.

    ``rows``: mappings with ``name`` (x position), ``group`` (bar colour), ``value``, optional
    ``ci_low`` / ``ci_high`` and ``baselines`` (model key of :data:`BASELINES` -> value, drawn
    over that bar); ``baseline``: one reference line for the whole chart, or None.
    """
    if not rows:
        raise ValueError("no rows to draw")
    groups = list(dict.fromkeys(str(r["group"]) for r in rows))
    names = list(dict.fromkeys(str(r["name"]) for r in rows))
    fig = go.Figure()
    marks = []
    for i, group in enumerate(groups):
        by_name = {str(r["name"]): r for r in rows if str(r["group"]) == group}
        values = [by_name[n]["value"] if n in by_name else None for n in names]
        plus, minus = [], []
        for n, v in zip(names, values, strict=True):
            r = by_name.get(n, {})
            lo, hi = r.get("ci_low"), r.get("ci_high")
            plus.append(hi - v if is_finite_number(hi) and v is not None else 0.0)
            minus.append(v - lo if is_finite_number(lo) and v is not None else 0.0)
        fig.add_trace(
            go.Bar(
                x=names,
                y=values,
                name=group,
                offsetgroup=group,
                alignmentgroup="bars",
                marker_color=QUALITATIVE[i % len(QUALITATIVE)],
                error_y={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
                hovertemplate=f"{group}<br>%{{x}}: %{{y:.3f}}<extra></extra>",
            )
        )
        for key, (label, colour) in BASELINES.items():
            ys = [(by_name.get(n, {}).get("baselines") or {}).get(key) for n in names]
            if any(y is not None for y in ys):
                marks.append((group, key, label, colour, ys))
    shown: set[str] = set()
    for group, key, label, colour, ys in marks:
        fig.add_trace(
            go.Scatter(
                x=names,
                y=ys,
                mode="markers",
                name=label,
                legendgroup=key,
                showlegend=key not in shown,
                offsetgroup=group,
                alignmentgroup="bars",
                marker={
                    "symbol": "line-ew",
                    "size": 22,
                    "line": {"width": 3 if key != "shuffled" else 2, "color": colour},
                },
                hovertemplate=f"{label} ({group})<br>%{{x}}: %{{y:.3f}}<extra></extra>",
            )
        )
        shown.add(key)
    if baseline is not None:
        fig.add_hline(
            y=baseline,
            line={"color": "#6c757d", "dash": "dash"},
            annotation_text="baseline",
            annotation_position="top left",
        )
    fig.update_layout(
        figure_layout(title, height, barmode="group", scattermode="group", bargap=0.25)
    )
    fig.update_yaxes(title=y_title, showgrid=True, gridcolor="#eceff1", rangemode="tozero")
    return fig


def per_class_figure(by_size: Mapping[str, Mapping], probe_name: str) -> go.Figure:
    """Per-class recall (shown) and precision (in the legend) of one probe by grid size (Fig. 6);
    ``by_size``: a sweep run's ``metrics.by_grid_size`` (size -> ``models.probe[...]``)."""
    first = next(iter(by_size.values()), {})
    classes = [
        k.split("/", 1)[1]
        for k in first.get("models", {}).get("probe", {})
        if k.startswith("recall/") and k != "recall/padding"
    ]
    fig = go.Figure()
    for kind in ("recall", "precision"):
        for cls in classes:
            fig.add_trace(
                go.Bar(
                    name=f"{kind} {cls}",
                    x=[f"{s}×{s}" for s in by_size],
                    y=[
                        (by_size[s]["models"]["probe"].get(f"{kind}/{cls}") or {}).get("value")
                        for s in by_size
                    ],
                    visible=True if kind == "recall" else "legendonly",
                )
            )
    fig.update_layout(
        title=f"Fig. 6 (centre): per-class recall and precision by grid size — {probe_name}",
        barmode="group",
        template="plotly_white",
        height=360,
        yaxis={"range": [0, 1.02]},
    )
    return fig


def localisation_figure(groups: Mapping[str, Mapping], probe_name: str) -> go.Figure:
    """Agent and goal top-1 accuracy and Manhattan distance of one probe, per group (Fig. 7);
    ``groups``: group label (``"all"``, grid sizes) -> probe-run metrics."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("top-1 localisation accuracy", "mean Manhattan distance")
    )
    for obj in ("agent", "goal"):
        for col, metric in ((1, f"{obj}_top1"), (2, f"{obj}_manhattan")):
            stats = [
                (g.get("models", {}).get("probe", {}).get(metric) or {}) for g in groups.values()
            ]
            fig.add_trace(
                go.Bar(name=f"{obj}", x=list(groups), y=[s.get("value") for s in stats]),
                row=1,
                col=col,
            )
    fig.update_layout(
        title=f"Fig. 7: locating the agent and the goal — {probe_name}",
        barmode="group",
        template="plotly_white",
        height=340,
    )
    return fig


def sweep_main_metric(result: Mapping) -> str:
    """The metric a probe sweep is judged on: accuracy on grid cells, or R² for distances."""
    return "accuracy_no_padding" if result["config"]["target"] == "cell_type" else "r2"


def sweep_comparison_figure(result: Mapping) -> go.Figure:
    """A probe sweep's main test metric per layer (x) and stage (colour), with 95% intervals
    and its controls (``goalprobe train-probe``'s ``sweep_figure.html``), from a parsed sweep
    table (``probes/sweeps/<name>.json``: ``config.target``, ``estimator.class``, ``runs``)."""
    main = sweep_main_metric(result)
    figure = go.Figure()
    stages = list(dict.fromkeys(run["stage"] for run in result["runs"]))
    for stage in stages:
        runs = [run for run in result["runs"] if run["stage"] == stage]
        for model in ("probe", "shuffled", "majority", "mean"):
            values = [run["metrics"]["models"].get(model, {}).get(main) for run in runs]
            if not any(v and v.get("value") is not None for v in values):
                continue
            y = [v["value"] if v else None for v in values]
            figure.add_trace(
                go.Bar(
                    name=f"{stage} {model}",
                    x=[str(run["layer"]) for run in runs],
                    y=y,
                    error_y=ci_error_y(values),
                    opacity=1.0 if model == "probe" else 0.45,
                )
            )
    figure.update_layout(
        barmode="group",
        title=f"{result['estimator']['class']}: test {main} (95% grid-bootstrap intervals)",
        xaxis_title="layer",
        yaxis_title=main,
        template="plotly_white",
    )
    return figure


MODEL_STYLE: dict[str, tuple[str, str, str]] = {
    "probe": ("probe", "#1d3557", "solid"),
    "prior_size_density": ("size-and-density prior", "#e76f51", "dash"),
    "prior_size": ("size prior", "#f4a261", "dot"),
    "majority": ("per-cell majority", "#8d99ae", "dot"),
    "shuffled": ("shuffled labels", "#adb5bd", "dashdot"),
    "uniform": ("uniform guess", "#ced4da", "dot"),
    "mean_size_density": ("size-and-density mean", "#e76f51", "dash"),
    "mean_size": ("size mean", "#f4a261", "dot"),
    "mean": ("mean", "#8d99ae", "dot"),
}
"""Model -> (legend label, colour, line dash); models not listed are not drawn."""

METRIC_TITLES: dict[str, str] = {
    "accuracy_no_padding": "accuracy on grid cells",
    "auc/wall": "wall AUC",
    "agent_top1": "agent top-1",
    "goal_top1": "goal top-1",
    "r2": "R²",
    "mae": "mean absolute error",
}
"""Metric -> panel title."""


def learning_curve_figure(curve: Mapping, title: str | None = None) -> go.Figure:
    """One panel per metric of ``curve`` (:func:`goalprobe.probes.probe_sweep.learning_curve`'s
    output): every model's value with its 95% grid-bootstrap band against the number of
    training grids (log axis)."""
    points = curve.get("points") or []
    metrics = [m for m in curve.get("metrics", []) if m in METRIC_TITLES]
    if not points or not metrics:
        return empty_figure("no learning curve in this run")
    fig = make_subplots(
        rows=1, cols=len(metrics), subplot_titles=[METRIC_TITLES[m] for m in metrics]
    )
    x = [p["n_train_grids"] for p in points]
    for col, name in enumerate(metrics, start=1):
        for model, (label, colour, dash) in MODEL_STYLE.items():
            stats = [p["models"].get(model, {}).get(name) for p in points]
            if not all(s and s.get("value") is not None for s in stats):
                continue
            low = [s["ci_low"] if s.get("ci_low") is not None else s["value"] for s in stats]
            high = [s["ci_high"] if s.get("ci_high") is not None else s["value"] for s in stats]
            fig.add_trace(band_trace(x + x[::-1], high + low[::-1], colour, model), row=1, col=col)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[s["value"] for s in stats],
                    mode="lines+markers",
                    name=label,
                    legendgroup=model,
                    showlegend=col == 1,
                    line={"color": colour, "dash": dash},
                    hovertemplate=f"{label}<br>%{{x}} training grids: %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(type="log", title_text="training grids", row=1, col=col)
    title = title or (
        f"Learning curve at {curve.get('stage', '?')} L{curve.get('layer', '?')} "
        f"({curve.get('n_test_grids', '?')} test grids; 95% grid-bootstrap bands)"
    )
    fig.update_layout(figure_layout(title, 360))
    fig.update_layout(legend={"orientation": "h", "y": -0.25})
    return fig
