"""Plan decoding: the decoded plan against the executed moves, prefix accuracy vs N."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from activations.gridworld.core import PLAN_PAD
from viewer.figures.style import (
    ACTION_ARROWS,
    QUALITATIVE,
    apply_layout,
    figure_layout,
    percent_label,
    rgba,
)

if TYPE_CHECKING:
    from probes.plan_sweep import PlanSweepResult


def plan_strip_figure(
    predicted: Sequence[int],
    target: Sequence[int],
    *,
    title: str = "",
    height: int | None = 150,
) -> go.Figure:
    """Predicted plan tokens above the executed ones, step by step.

    A predicted token is green where it equals the executed token, red where it does not;
    the executed row is grey (positions past the episode's end are blank). The title gives
    the matched prefix length ``N`` (the prefix-accuracy hit).

    Args:
        predicted: ``(T,)`` predicted plan tokens (plan format).
        target: ``(T,)`` executed plan tokens (the plan label).
        title: figure title (default: the matched prefix).
        height: figure height in pixels.

    Returns:
        the figure.
    """
    pred = [int(x) for x in predicted]
    tgt = [int(x) for x in target]
    if len(pred) != len(tgt):
        raise ValueError(f"predicted ({len(pred)}) and target ({len(tgt)}) lengths differ")
    horizon = len(tgt)
    match = [p == t or t == PLAN_PAD for p, t in zip(pred, tgt, strict=True)]
    prefix = next((i for i, m in enumerate(match) if not m), horizon)
    z = [
        [1.0 if m else 0.0 for m in match],
        [0.5 if t != PLAN_PAD else None for t in tgt],
    ]
    text = [[ACTION_ARROWS.get(p, "?") for p in pred], [ACTION_ARROWS.get(t, "?") for t in tgt]]
    steps = ["t" if i == 0 else f"t+{i}" for i in range(horizon)]
    trace = {
        "type": "heatmap",
        "z": z,
        "x": steps,
        "y": ["decoded", "executed"],
        "zmin": 0,
        "zmax": 1,
        "colorscale": [
            [0.0, "#f8d7da"],
            [0.33, "#f8d7da"],
            [0.34, "#e9ecef"],
            [0.66, "#e9ecef"],
            [0.67, "#d8f3dc"],
            [1.0, "#d8f3dc"],
        ],
        "showscale": False,
        "xgap": 2,
        "ygap": 2,
        "text": text,
        "texttemplate": "%{text}",
        "textfont": {"size": 16, "color": "#1f2933"},
        "hovertemplate": "%{y} action at %{x}: %{text}<extra></extra>",
    }
    default = (
        f"Plan: the first {prefix} of {horizon} tokens match"
        if prefix < horizon
        else "Plan: all tokens match"
    )
    layout = figure_layout(
        title or default,
        height,
        yaxis={"autorange": "reversed", "showgrid": False, "zeroline": False},
        xaxis={"showgrid": False, "zeroline": False, "side": "top"},
        margin={"l": 70, "r": 16, "t": 64, "b": 8},
    )
    return go.Figure(data=[trace], layout=layout)


def prefix_accuracy_figure(
    curves: Mapping[str, Sequence[float]],
    *,
    ci: Mapping[str, Sequence[Sequence[float]]] | None = None,
    ci_level: float = 0.95,
    baseline: bool = True,
    log_y: bool = False,
    title: str = "Prefix accuracy of one-shot plan decoding",
    height: int | None = 420,
) -> go.Figure:
    """Prefix accuracy against prefix length ``N``, with the ``0.25^N`` random baseline.

    Args:
        curves: name -> ``(T,)`` accuracy at ``N = 1..T``.
        ci: name -> ``(2, T)`` lower and upper bounds (drawn as a band), optional.
        ci_level: coverage of the intervals (for the band's name).
        baseline: draw ``0.25^N``.
        log_y: logarithmic y axis (long prefixes become readable).
        title: figure title.
        height: figure height in pixels.

    Returns:
        the figure.
    """
    fig = go.Figure()
    horizon = max((len(v) for v in curves.values()), default=0)
    for i, (name, values) in enumerate(curves.items()):
        acc = np.asarray(values, dtype=np.float64)
        n = np.arange(1, len(acc) + 1)
        colour = QUALITATIVE[i % len(QUALITATIVE)]
        bounds = None if ci is None else ci.get(name)
        if bounds is not None:
            lo, hi = (np.asarray(b, dtype=np.float64) for b in bounds)
            ok = np.isfinite(lo) & np.isfinite(hi)
            if ok.any():
                fig.add_trace(
                    go.Scatter(
                        x=np.concatenate([n[ok], n[ok][::-1]]),
                        y=np.concatenate([hi[ok], lo[ok][::-1]]),
                        fill="toself",
                        name=f"{name} {percent_label(ci_level)} CI",
                        fillcolor=rgba(colour, 0.15),
                        line={"width": 0},
                        hoverinfo="skip",
                        showlegend=False,
                    )
                )
        fig.add_trace(
            go.Scatter(
                x=n,
                y=acc,
                mode="lines+markers",
                name=name,
                line={"color": colour, "width": 2.5},
                hovertemplate=f"{name}<br>N = %{{x}}<br>accuracy = %{{y:.3f}}<extra></extra>",
            )
        )
    if baseline and horizon:
        n = np.arange(1, horizon + 1)
        fig.add_trace(
            go.Scatter(
                x=n,
                y=0.25**n,
                mode="lines",
                name="random 0.25^N",
                line={"color": "#6c757d", "dash": "dash", "width": 2},
                hovertemplate="random<br>N = %{x}<br>0.25^N = %{y:.2e}<extra></extra>",
            )
        )
    apply_layout(fig, title, height)
    fig.update_xaxes(title="prefix length N", dtick=1, showgrid=True, gridcolor="#eceff1")
    fig.update_yaxes(
        title="prefix accuracy",
        type="log" if log_y else "linear",
        range=None if log_y else [0, 1.02],
        showgrid=True,
        gridcolor="#eceff1",
    )
    fig.update_layout(legend={"x": 0.98, "xanchor": "right", "y": 0.98})
    return fig


def plan_sweep_figure(result: PlanSweepResult) -> go.Figure:
    """Prefix accuracy against N of a whole plan-decoder sweep, one panel per layer: decoders
    (colour: stage, dash: depth, error bars: grid-bootstrap 95% CI), shuffled controls, majority
    plan and ``0.25^N`` (``goalprobe train-plan-decoder``'s ``prefix_accuracy.html``).

    Args:
        result: the sweep (``probes.plan_sweep.PlanSweepResult``).
    """
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    layers = list(result.config.layers)
    fig = make_subplots(
        rows=1, cols=len(layers), subplot_titles=[f"layer {x}" for x in layers], shared_yaxes=True
    )
    colours = {s: qualitative.Plotly[i % 10] for i, s in enumerate(result.config.stages)}
    dashes = ["solid", "dash", "dot", "dashdot", "longdash"]
    depths = sorted({r.decoder_layers for r in result.runs if r.decoder_layers is not None})
    shown: set[str] = set()
    for run in result.runs:
        col = layers.index(run.layer) + 1
        m = run.metrics
        ns = np.arange(1, m.horizon + 1)
        if run.kind == "decoder":
            legend = f"{run.stage}, {run.decoder_layers}-layer decoder"
            line = dict(color=colours[run.stage], dash=dashes[depths.index(run.decoder_layers) % 5])
            error = dict(
                type="data",
                symmetric=False,
                array=m.prefix_accuracy_ci[1] - m.prefix_accuracy,
                arrayminus=m.prefix_accuracy - m.prefix_accuracy_ci[0],
                thickness=1,
            )
        elif run.kind == "shuffled_control":
            legend = f"{run.stage}, shuffled control ({run.decoder_layers}-layer)"
            line, error = dict(color=colours[run.stage], dash="dot", width=1), None
        else:
            legend = f"{run.stage}, majority plan"
            line, error = dict(color="grey", dash="dot", width=1), None
        fig.add_trace(
            go.Scatter(
                x=ns,
                y=m.prefix_accuracy,
                error_y=error,
                mode="lines+markers",
                line=line,
                name=legend,
                legendgroup=legend,
                showlegend=legend not in shown,
                hovertemplate=f"{run.name}<br>N=%{{x}}<br>accuracy=%{{y:.3f}}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        shown.add(legend)
    if result.runs:
        horizon = result.runs[0].metrics.horizon
        for col in range(1, len(layers) + 1):
            fig.add_trace(
                go.Scatter(
                    x=np.arange(1, horizon + 1),
                    y=result.runs[0].metrics.random_baseline,
                    mode="lines",
                    line=dict(color="black", dash="dash", width=1),
                    name="0.25^N baseline",
                    legendgroup="baseline",
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="prefix length N", dtick=1)
    fig.update_yaxes(title_text="prefix accuracy (test grids)", row=1, col=1)
    fig.update_layout(
        title="One-shot plan decoding: prefix accuracy vs N",
        template="plotly_white",
        updatemenus=[
            dict(
                type="buttons",
                direction="right",
                x=1.0,
                y=1.15,
                buttons=[
                    dict(label="linear", method="relayout", args=[_yaxis_type(layers, "linear")]),
                    dict(label="log", method="relayout", args=[_yaxis_type(layers, "log")]),
                ],
            )
        ],
    )
    return fig


def _yaxis_type(layers: list, kind: str) -> dict:
    return {("yaxis" if i == 0 else f"yaxis{i + 1}") + ".type": kind for i in range(len(layers))}
