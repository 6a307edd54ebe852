"""Decision time: the logit lens's agreement with the final action against reasoning progress,
one line per layer (the input is the parsed ``decision/lens.json`` of the demo's ``decision``
stage)."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from goalprobe.viewer.figures.style import empty_figure, figure_layout


def decision_time_figure(curves: Mapping, *, height: int = 380) -> go.Figure:
    """Share of steps whose lens top choice is the final action, per reasoning-progress bin
    (x: the bin's upper edge; the answer position last), one line per layer with its 95%
    grid-bootstrap interval as error bars, and the majority action and chance as lines."""
    rows = curves.get("progress_by_layer") or []
    if not rows:
        return empty_figure("no decision-time curves: run the demo's decision stage", height=height)
    fig = go.Figure()
    for layer, (bins, answer) in enumerate(zip(rows, curves["answer_by_layer"], strict=True)):
        points = [*bins, {**answer, "bin": [1.0, 1.1]}]
        x = [p["bin"][1] for p in points]
        y = [p["value"] for p in points]
        upper = [(p["ci_high"] - p["value"]) if p.get("ci_high") is not None else 0 for p in points]
        lower = [(p["value"] - p["ci_low"]) if p.get("ci_low") is not None else 0 for p in points]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines+markers",
                name=f"block {layer}",
                error_y={"type": "data", "array": upper, "arrayminus": lower, "visible": True},
            )
        )
    for name, value, dash in (
        ("majority action", (curves.get("majority") or {}).get("value"), "dash"),
        ("chance", curves.get("chance"), "dot"),
    ):
        if value is not None:
            fig.add_hline(y=value, line_dash=dash, annotation_text=name)
    fig.update_layout(
        **figure_layout(
            "Decision time: the lens names the final action",
            height,
            xaxis={
                "title": "reasoning progress (share of reasoning tokens; 1.1 = answer position)",
                "range": [0, 1.15],
            },
            yaxis={"title": "share of steps", "range": [0, 1.05]},
        )
    )
    return fig
