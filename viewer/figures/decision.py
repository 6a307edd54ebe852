"""Decision time: the logit lens's agreement with the final action against reasoning progress,
one line per layer (the input is the parsed ``decision/lens.json`` of the demo's ``decision``
stage)."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from goalprobe.viewer.figures.style import ci_error_y, empty_figure, figure_layout


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
        fig.add_trace(
            go.Scatter(
                x=[p["bin"][1] for p in points],
                y=[p["value"] for p in points],
                mode="lines+markers",
                name=f"block {layer}",
                error_y=ci_error_y(points, visible=True),
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


_LAYER_COLOURS = ("#1d3557", "#e76f51", "#2a9d8f", "#7b2cbf", "#e9c46a", "#8d6e63")


def reasoning_readout_figure(readout: Mapping | None, *, height: int = 520) -> go.Figure:
    """Decision time from the store: per target (action, the plan's first move, the agent's and
    the goal's cell), the read-out's held-out accuracy at each bin of the reasoning (the
    pre-reasoning anchor, fifths of the reasoning, the post-reasoning anchor), one line per
    stored layer with its 95% interval, and the strongest baseline as a dashed line; a filled
    marker where the margin over it excludes 0 (the input is ``reasoning_readout`` of the
    decision stage's ``lens.json``)."""
    from plotly.subplots import make_subplots

    readout = readout or {}
    targets = readout.get("targets") or {}
    if not targets:
        return empty_figure(
            "no read-out over reasoning time: run the demo's activations and decision stages",
            height=height,
        )
    names = list(targets)
    fig = make_subplots(
        rows=2, cols=2, subplot_titles=names, vertical_spacing=0.2, horizontal_spacing=0.08
    )
    bins = list(readout["bins"])
    short = ["pre" if i == 0 else "post" if i == len(bins) - 1 else b for i, b in enumerate(bins)]
    for k, name in enumerate(names):
        target = targets[name]
        row, col = k // 2 + 1, k % 2 + 1
        for j, cells in enumerate(target["by_layer"]):
            colour = _LAYER_COLOURS[j % len(_LAYER_COLOURS)]
            y = [c.get("value") for c in cells]
            symbols = ["circle" if c.get("verdict") == "yes" else "circle-open" for c in cells]
            fig.add_trace(
                go.Scatter(
                    x=short,
                    y=y,
                    mode="lines+markers",
                    name=f"block {readout['layers'][j]}",
                    legendgroup=f"layer{j}",
                    showlegend=k == 0,
                    line={"color": colour},
                    marker={"symbol": symbols, "size": 8, "color": colour},
                    error_y=ci_error_y(cells),
                ),
                row=row,
                col=col,
            )
        strongest = target["strongest"]
        value = target["baselines"][strongest]["value"]
        if value is not None:
            fig.add_trace(
                go.Scatter(
                    x=[short[0], short[-1]],
                    y=[value, value],
                    mode="lines",
                    line={"dash": "dash", "color": "#6c757d"},
                    name=f"strongest baseline ({name}: {strongest})",
                    showlegend=False,
                    hovertemplate=f"{strongest}: {value:.2f}<extra></extra>",
                ),
                row=row,
                col=col,
            )
        fig.update_yaxes(range=[0, 1.05], row=row, col=col)
    fig.update_layout(
        **figure_layout(
            "Decision time from the store: held-out read-out accuracy along the reasoning "
            "(dashed: strongest baseline; filled: margin over it excludes 0)",
            height,
        )
    )
    return fig
