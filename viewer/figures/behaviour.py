"""Behaviour of the agent over many grids: metrics by grid size x obstacle density, against the
distance to the goal (study, Fig. 4 and Fig. 12), and on iso-difficulty transforms (Fig. 14).

The inputs are the parsed ``behaviour/metrics.json`` and ``iso/results.json`` (statistics as
``{value, ci_low, ci_high}`` dicts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from goalprobe.viewer.figures.style import ci_error_y
from plotly.subplots import make_subplots

BEHAVIOUR_PANELS: tuple[tuple[str, str], ...] = (
    ("accuracy", "per-action accuracy"),
    ("success_rate", "goal success rate"),
    ("jsd", "JSD from π*"),
    ("entropy", "policy entropy"),
)
"""``(metric, title)`` of the panels of :func:`behaviour_grid_figure`."""


def behaviour_grid_figure(cells: Sequence[Mapping]) -> go.Figure:
    """One heatmap per :data:`BEHAVIOUR_PANELS` metric: grid size (rows) x density (columns),
    from the ``by_size_density`` rows of ``behaviour/metrics.json``."""
    sizes = sorted({c["size"] for c in cells})
    densities = sorted({c["density"] for c in cells})
    fig = make_subplots(
        rows=1, cols=len(BEHAVIOUR_PANELS), subplot_titles=[t for _, t in BEHAVIOUR_PANELS]
    )
    for i, (metric, title) in enumerate(BEHAVIOUR_PANELS, start=1):
        values = {(c["size"], c["density"]): c[metric]["value"] for c in reversed(cells)}
        z = [[values.get((s, d)) for d in densities] for s in sizes]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[f"d={d:g}" for d in densities],
                y=[f"{s}×{s}" for s in sizes],
                colorscale="Viridis",
                showscale=False,
                texttemplate="%{z:.2f}",
                hovertemplate=f"{title}<br>%{{y}}, %{{x}}: %{{z:.3f}}<extra></extra>",
            ),
            row=1,
            col=i,
        )
    fig.update_layout(
        title="Behaviour by grid size (rows) and obstacle density (columns); mean over grids",
        template="plotly_white",
        height=360,
    )
    return fig


def behaviour_by_distance_figure(rows: Sequence[Mapping]) -> go.Figure:
    """Per-action accuracy and JSD against the distance to the goal, with 95% CIs (Fig. 4 top),
    from the ``by_distance`` rows of ``behaviour/metrics.json``."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per-action accuracy", "JSD from π*"))
    for col, metric in enumerate(("accuracy", "jsd"), start=1):
        shown = [r for r in rows if r[metric]["value"] is not None]
        stats = [r[metric] for r in shown]
        fig.add_trace(
            go.Scatter(
                x=[r["distance"] for r in shown],
                y=[s["value"] for s in stats],
                mode="lines+markers",
                name=metric,
                error_y=ci_error_y(stats),
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="distance to goal (steps)", row=1, col=col)
    fig.update_layout(
        title="Fig. 4 (top): against the agent's distance to the goal (95% CI over grids)",
        template="plotly_white",
        height=360,
        showlegend=False,
    )
    return fig


def iso_accuracy_figure(tests: Sequence[Mapping]) -> go.Figure:
    """Mean per-action accuracy on base and transformed grids, per transform (Fig. 14), from
    the accuracy ``tests`` of ``iso/results.json`` that have a base mean."""
    acc = [t for t in tests if t["metric"] == "accuracy" and t.get("base_mean") is not None]
    fig = go.Figure(
        [
            go.Bar(name="base", x=[t["transform"] for t in acc], y=[t["base_mean"] for t in acc]),
            go.Bar(
                name="transformed",
                x=[t["transform"] for t in acc],
                y=[t["transformed_mean"] for t in acc],
            ),
        ]
    )
    fig.update_layout(
        title="Fig. 14: mean per-action accuracy on base and transformed grids",
        barmode="group",
        template="plotly_white",
        height=340,
        yaxis={"title": "accuracy", "range": [0, 1.02]},
    )
    return fig
