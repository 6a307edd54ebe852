"""Learning curves: a probe and its controls against the number of training grids."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from goalprobe.viewer.figures.style import band_trace, empty_figure, figure_layout
from plotly.subplots import make_subplots

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
