"""Plan decoding: the decoded plan against the executed moves, prefix accuracy vs N."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from goalprobe.gridworld.core import PLAN_END, PLAN_PAD
from goalprobe.viewer.figures.style import (
    ACTION_ARROWS,
    QUALITATIVE,
    band_trace,
    figure_layout,
    stage_rank,
)

STRIP_COLOURS: dict[str, str] = {
    "match": "#95d5b2",
    "miss": "#f4a3a8",
    "after_miss": "#e9f5ec",
    "padding": "#ffffff",
    "executed": "#e9ecef",
    "end": "#adb5bd",
}
"""Cell fill of every plan-strip category (see :func:`plan_strip_categories`)."""


def plan_strip_categories(
    predicted: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray
) -> dict:
    """What each position of a plan strip shows, by the prefix-accuracy rule of
    :mod:`goalprobe.probes.plan_metrics` (``PAD`` target positions are not scored), for
    ``(T,)`` ``predicted`` and ``target`` (executed, the plan label) plan tokens.

    Returns:
        ``{"decoded": [...], "executed": [...], "prefix": int, "scored": int}``: per position,
        the decoded row's category (``match``: inside the matched prefix; ``miss``: differs from
        the executed token; ``after_miss``: equal, but after the first miss, so not counted;
        ``padding``: past the executed plan's ``END``, nothing to compare), the executed row's
        (``executed`` action, ``end``, ``padding``), the matched prefix length and the number
        of scored positions (the executed actions and their ``END``).
    """
    pred = [int(x) for x in predicted]
    tgt = [int(x) for x in target]
    if len(pred) != len(tgt):
        raise ValueError(f"predicted ({len(pred)}) and target ({len(tgt)}) lengths differ")
    scored = sum(t != PLAN_PAD for t in tgt)
    pairs = list(enumerate(zip(pred, tgt, strict=True)))
    prefix = next((i for i, (p, t) in pairs if t == PLAN_PAD or p != t), len(tgt))
    decoded = []
    for i, (p, t) in pairs:
        if t == PLAN_PAD:
            decoded.append("padding")
        elif i < prefix:
            decoded.append("match")
        else:
            decoded.append("miss" if p != t else "after_miss")
    executed = ["padding" if t == PLAN_PAD else "end" if t == PLAN_END else "executed" for t in tgt]
    return {"decoded": decoded, "executed": executed, "prefix": prefix, "scored": scored}


def plan_strip_figure(
    predicted: Sequence[int] | np.ndarray,
    target: Sequence[int] | np.ndarray,
    *,
    title: str = "",
    height: int | None = 170,
) -> go.Figure:
    """Predicted plan tokens above the executed ones, step by step, each cell coloured by its
    :func:`plan_strip_categories` category (:data:`STRIP_COLOURS`: only the matched prefix is
    green); the title gives the matched prefix out of the scored positions, so it always agrees
    with the number of green cells."""
    cats = plan_strip_categories(predicted, target)
    pred = [int(x) for x in predicted]
    tgt = [int(x) for x in target]
    horizon = len(tgt)
    order = list(STRIP_COLOURS)
    top = len(order) - 1
    z = [[order.index(c) for c in cats["decoded"]], [order.index(c) for c in cats["executed"]]]
    glyph = {**ACTION_ARROWS, PLAN_PAD: "·"}
    text = [[glyph.get(p, "?") for p in pred], [glyph.get(t, "?") for t in tgt]]
    labels = {
        "match": "match (in the matched prefix)",
        "miss": "differs from the executed token",
        "after_miss": "equal, but after the first miss (not counted)",
        "padding": "past the executed END (padding, not scored)",
        "executed": "executed action",
        "end": "END of the executed plan",
    }
    hover = [[labels[c] for c in cats["decoded"]], [labels[c] for c in cats["executed"]]]
    steps = ["t" if i == 0 else f"t+{i}" for i in range(horizon)]
    scale = [  # the integers 0 .. top to their categories' colours
        [min(1.0, max(0.0, (i + half) / top)), STRIP_COLOURS[name]]
        for i, name in enumerate(order)
        for half in (-0.5, 0.5)
    ]
    trace = {
        "type": "heatmap",
        "z": z,
        "x": steps,
        "y": ["decoded", "executed"],
        "zmin": 0,
        "zmax": top,
        "colorscale": scale,
        "showscale": False,
        "xgap": 2,
        "ygap": 2,
        "text": text,
        "customdata": hover,
        "texttemplate": "%{text}",
        "textfont": {"size": 15, "color": "#1f2933"},
        "hovertemplate": "%{y} token at %{x}: %{text}<br>%{customdata}<extra></extra>",
    }
    prefix, scored = cats["prefix"], cats["scored"]
    if prefix == scored:
        headline = f"Plan: all {scored} executed tokens match (END included)"
    else:
        headline = f"Plan: the first {prefix} of {scored} executed tokens match"
    default = (
        f"{headline}<br><span style='font-size:11px;color:#52606d'>green: matched prefix · "
        "red: differs · white: past the executed END (not scored)</span>"
    )
    layout = figure_layout(
        title or default,
        height,
        yaxis={"autorange": "reversed", "showgrid": False, "zeroline": False},
        xaxis={"showgrid": False, "zeroline": False, "side": "top"},
        margin={"l": 70, "r": 16, "t": 78, "b": 8},
        plot_bgcolor="#f8f9fa",
    )
    return go.Figure(data=[trace], layout=layout)


CAPACITY_COLOURS = ("#2a9d8f", "#1d3557", "#e76f51", "#7b2cbf", "#e9c46a")
"""Colour of each decoder capacity (1, 2, ... Transformer layers, in increasing order)."""

_REFERENCES = {
    "shuffled_control": ("shuffled control", "#868e96", "dot"),
    "state_only": ("state only", "#e8590c", "dash"),
    "optimal_policy": ("optimal policy", "#5f3dc4", "dash"),
}
"""Name, colour and dash of each reference curve (any other kind: grey, dash-dotted)."""


def prefix_accuracy_grid_figure(
    runs: Sequence[Mapping],
    *,
    title: str = "Prefix accuracy of one-shot plan decoding (test grids)",
) -> go.Figure:
    """Prefix accuracy against ``N`` as small multiples: one panel per stage (row) and layer
    (column); in each, the trained decoders (colour: capacity, band: confidence interval), the
    shuffled control (dotted) and the ``0.25^N`` baseline (dashed).

    ``runs``: mappings with ``stage``, ``layer``, ``kind`` (``decoder``, ``shuffled_control``,
    ``majority_plan``, ``state_only``, ``optimal_policy``), ``n_layers`` (decoder capacity or
    None), ``accuracy`` ``(T,)`` and optional ``ci`` ``(2, T)``. One legend entry per capacity
    and per reference curve.
    """
    from plotly.subplots import make_subplots

    if not runs:
        raise ValueError("no plan-decoder runs to draw")
    stages = sorted({str(r["stage"]) for r in runs}, key=lambda s: (stage_rank(s), s))
    layers = sorted({int(r["layer"]) for r in runs})
    capacities = sorted({int(r["n_layers"]) for r in runs if r.get("n_layers") is not None})
    colour: dict[int | None, str] = {
        c: CAPACITY_COLOURS[i % len(CAPACITY_COLOURS)] for i, c in enumerate(capacities)
    }
    fig = make_subplots(
        rows=len(stages),
        cols=len(layers),
        shared_xaxes=True,
        shared_yaxes=True,
        subplot_titles=[f"{s.split('_')[0]}-reasoning · layer {x}" for s in stages for x in layers],
        horizontal_spacing=0.03,
        vertical_spacing=0.12 if len(stages) > 1 else 0.0,
    )
    shown: set[str] = set()
    horizon = max(len(r["accuracy"]) for r in runs)
    for r in runs:
        row = stages.index(str(r["stage"])) + 1
        col = layers.index(int(r["layer"])) + 1
        acc = np.asarray(r["accuracy"], dtype=np.float64)
        n = np.arange(1, len(acc) + 1)
        cap = r.get("n_layers")
        if r["kind"] == "decoder":
            name = "decoder" if cap is None else f"{cap}-layer decoder"
            line: dict[str, Any] = {"color": colour.get(cap, QUALITATIVE[0]), "width": 2.5}
            mode = "lines+markers"
        else:
            other = (str(r["kind"]).replace("_", " "), "#adb5bd", "dashdot")
            name, line_colour, dash = _REFERENCES.get(r["kind"], other)
            line = {"color": line_colour, "width": 1.5, "dash": dash}
            mode = "lines"
        bounds = r.get("ci")
        if r["kind"] == "decoder" and bounds is not None:
            lo, hi = (np.asarray(b, dtype=np.float64) for b in bounds)
            ok = np.isfinite(lo) & np.isfinite(hi)
            if ok.any():
                x, y = np.concatenate([n[ok], n[ok][::-1]]), np.concatenate([hi[ok], lo[ok][::-1]])
                fig.add_trace(band_trace(x, y, line["color"], name, f"{name} CI"), row=row, col=col)
        fig.add_trace(
            go.Scatter(
                x=n,
                y=acc,
                mode=mode,
                name=name,
                legendgroup=name,
                showlegend=name not in shown,
                line=line,
                marker={"size": 5},
                hovertemplate=f"{name}<br>N = %{{x}}<br>accuracy = %{{y:.3f}}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        shown.add(name)
    ns = np.arange(1, horizon + 1)
    for row in range(1, len(stages) + 1):
        for col in range(1, len(layers) + 1):
            fig.add_trace(
                go.Scatter(
                    x=ns,
                    y=0.25**ns,
                    mode="lines",
                    name="random 0.25^N",
                    legendgroup="random",
                    showlegend=row == 1 and col == 1,
                    line={"color": "#1f2933", "dash": "dash", "width": 1.2},
                    hovertemplate="random<br>N = %{x}<br>0.25^N = %{y:.2e}<extra></extra>",
                ),
                row=row,
                col=col,
            )
    fig.update_layout(
        figure_layout(
            title,
            210 * len(stages) + 120,
            margin={"l": 56, "r": 16, "t": 72, "b": 96},
            legend={
                "orientation": "h",
                "x": 0,
                "y": 0.0,
                "yref": "container",
                "yanchor": "bottom",
            },
        )
    )
    fig.update_xaxes(dtick=2, showgrid=True, gridcolor="#eceff1", range=[0.5, horizon + 0.5])
    fig.update_yaxes(range=[0, 1.02], showgrid=True, gridcolor="#eceff1")
    for col in range(1, len(layers) + 1):
        fig.update_xaxes(title_text="prefix length N", row=len(stages), col=col)
    for row in range(1, len(stages) + 1):
        fig.update_yaxes(title_text="accuracy", row=row, col=1)
    fig.update_annotations(font_size=12)
    return fig


def sweep_runs(runs: Sequence[Mapping]) -> list[dict]:
    """The runs of a plan-decoder sweep (``sweep.json``'s ``runs``, or
    ``PlanSweepResult.to_dict()["runs"]``) as :func:`prefix_accuracy_grid_figure` takes them."""
    return [
        {
            "stage": r["stage"],
            "layer": r["layer"],
            "kind": r["kind"],
            "n_layers": r.get("decoder_layers"),
            "accuracy": r["metrics"]["prefix_accuracy"],
            "ci": r["metrics"].get("prefix_accuracy_ci") if r["kind"] == "decoder" else None,
        }
        for r in runs
    ]
