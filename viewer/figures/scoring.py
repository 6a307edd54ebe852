"""Belief scoring and MEG: figures of the parsed ``scoring/belief.json`` and ``scoring/meg.json``
(layout: :mod:`goalprobe.probes.scoring.config`). ``goalprobe score``, the demo's scoring stage and the
report draw these same figures. Error bars are the JSON's grid-bootstrap intervals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from goalprobe.viewer.figures.style import ci_error_y
from plotly.subplots import make_subplots

TABLE2_METRICS: tuple[tuple[str, str], ...] = (
    ("acc_gt", "Acc. GT"),
    ("acc_dec", "Acc. Dec."),
    ("agreement", "Agreement"),
    ("recovery", "Recovery"),
)
"""Metric key and label of the study's Table 2 columns."""

COLOURS = ("#1d3557", "#7b2cbf", "#2a9d8f", "#e76f51", "#e9c46a", "#8d6e63", "#457b9d")
"""Series colours, in order."""


def probe_entry(summary: Mapping, probe: str | None = None) -> tuple[str, dict]:
    """``(key, entry)`` of the probe ``probe`` in a parsed ``belief.json`` (default:
    ``default_probe``, else the first)."""
    probes = summary.get("probes") or {}
    if not probes:
        raise ValueError("belief summary holds no probe")
    key = probe or summary.get("default_probe") or next(iter(probes))
    if key not in probes:
        raise ValueError(f"probe {key!r} is not in the belief summary (has {sorted(probes)})")
    return key, probes[key]


def _errors(stats: Sequence[dict | None]) -> dict:
    """``error_y`` of a bar/scatter trace from ``{value, ci_low, ci_high}`` stats (percent)."""
    plus, minus = [], []
    for stat in stats:
        s = stat or {}
        ok = None not in (s.get("value"), s.get("ci_low"), s.get("ci_high"))
        plus.append(100 * (s["ci_high"] - s["value"]) if ok else None)
        minus.append(100 * (s["value"] - s["ci_low"]) if ok else None)
    return {"type": "data", "array": plus, "arrayminus": minus, "visible": True}


def _percent(stats: Sequence[dict | None]) -> list[float | None]:
    return [None if s is None or s.get("value") is None else 100 * s["value"] for s in stats]


def _hover(s: dict | None) -> str:
    if not s or s.get("value") is None:
        return "undefined (no step)"
    ci = "" if s.get("ci_low") is None else f" [{100 * s['ci_low']:.1f}, {100 * s['ci_high']:.1f}]"
    return f"{100 * s['value']:.1f}%{ci}<br>n = {s['n']} steps, {s['n_grids']} grids"


def _title(key: str, entry: dict) -> str:
    where = ", ".join(
        str(x)
        for x in (entry.get("family"), entry.get("stage"), entry.get("layer"))
        if x is not None
    )
    return f"{key} ({where})" if where else key


def _by_size(entry: dict, series: Sequence[tuple[str, str]]) -> list[dict]:
    """Per ``(metric, label)`` of ``series``, the properties of its trace by grid size (one x per
    size, then ``all``) from a probe's entry: percent, intervals and hover text."""
    sizes = list(entry["by_size"])
    blocks = [*(entry["by_size"][s] for s in sizes), entry["overall"]]
    traces = []
    for metric, label in series:
        stats = [b.get(metric) for b in blocks]
        traces.append(
            {
                "name": label,
                "x": [f"{s} × {s}" for s in sizes] + ["all"],
                "y": _percent(stats),
                "error_y": _errors(stats),
                "hovertext": [_hover(s) for s in stats],
                "hoverinfo": "text+name",
            }
        )
    return traces


def belief_figure(summary: dict, probe: str | None = None) -> go.Figure:
    """Acc. GT, Acc. Dec., Agreement and Recovery by grid size (Table 2, top), with intervals,
    of the parsed ``belief.json``'s ``probe`` (decoded-map key; default
    ``summary["default_probe"]``)."""
    key, entry = probe_entry(summary, probe)
    traces = _by_size(entry, TABLE2_METRICS)
    fig = go.Figure([go.Bar(marker_color=COLOURS[i], **t) for i, t in enumerate(traces)])
    fig.update_layout(
        title=f"Policy against decoded belief by grid size — {_title(key, entry)}",
        barmode="group",
        yaxis={"title": "% of actions", "range": [0, 105]},
        xaxis={"title": "grid size", "type": "category"},
        legend={"orientation": "h", "y": -0.2},
        template="plotly_white",
    )
    return fig


def topk_figure(summary: dict, probe: str | None = None) -> go.Figure:
    """Accuracy against the true grid and against top-k decoded grids by size (Figure 9;
    arguments as :func:`belief_figure`)."""
    key, entry = probe_entry(summary, probe)
    ks = sorted(int(m.removeprefix("acc_top")) for m in entry["overall"] if m.startswith("acc_top"))
    series = [("acc_gt", "ground truth"), *((f"acc_top{k}", f"top-{k} decoded") for k in ks)]
    fig = go.Figure()
    for i, trace in enumerate(_by_size(entry, series)):
        line = {"color": COLOURS[i % len(COLOURS)], "dash": "dash" if i == 0 else "solid"}
        fig.add_trace(go.Scatter(mode="lines+markers", line=line, **trace))
    fig.update_layout(
        title=f"Accuracy against top-k decoded grids — {_title(key, entry)}",
        yaxis={"title": "% of actions optimal", "range": [0, 105]},
        xaxis={"title": "grid size", "type": "category"},
        legend={"orientation": "h", "y": -0.2},
        template="plotly_white",
    )
    return fig


def _meg_bars(fig: go.Figure, groups: dict, col: int, label: str, show_legend: bool) -> None:
    """Paired true / subjective mean MEG per decision of each group, with intervals."""
    keys = [k for k, g in groups.items() if g["paired"]["n_grids"] > 0]
    x = [f"{label}={k}" for k in keys]
    for i, part in enumerate(("true", "subjective")):
        stats = [groups[k]["paired"][part]["meg_per_decision"] for k in keys]
        fig.add_trace(
            go.Bar(
                name=f"{part} grid",
                x=x,
                y=[s["value"] for s in stats],
                error_y=ci_error_y(stats, missing=None),
                marker_color=COLOURS[i],
                legendgroup=part,
                showlegend=show_legend,
                hovertext=[f"n = {groups[k]['paired']['n_grids']} grids" for k in keys],
            ),
            row=1,
            col=col,
        )


def meg_figure(meg_summary: dict) -> go.Figure:
    """True vs subjective known-utility MEG: per-grid scatter, and means by size and density.

    MEG is shown per decision (nats / H, at most log 4 ≈ 1.39) so that grids of different
    horizons compare. Grids without a decoded map (not the probe's test grids) only have a true
    MEG and are left out of the scatter and the paired bars. ``meg_summary``: parsed ``meg.json``.
    """
    grids = [g for g in meg_summary["grids"] if g.get("subjective") is not None]
    fig = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.4, 0.3, 0.3],
        subplot_titles=("per grid", "by grid size", "by density"),
    )
    sizes = sorted({g["size"] for g in grids})
    for i, size in enumerate(sizes):
        sel = [g for g in grids if g["size"] == size]
        fig.add_trace(
            go.Scatter(
                x=[g["true"]["meg_per_decision"] for g in sel],
                y=[g["subjective"]["meg_per_decision"] for g in sel],
                mode="markers",
                name=f"{size} × {size}",
                marker={"color": COLOURS[(i + 2) % len(COLOURS)], "size": 8},
                text=[
                    f"{g['grid_id']}<br>goal decoded {'right' if g['subjective']['goal_correct'] else 'wrong'}"
                    for g in sel
                ],
                hoverinfo="text+x+y",
            ),
            row=1,
            col=1,
        )
    top = max([1e-3, *(g[k]["meg_per_decision"] for k in ("true", "subjective") for g in grids)])
    fig.add_trace(
        go.Scatter(
            x=[0, top],
            y=[0, top],
            mode="lines",
            line={"color": "#999", "dash": "dot"},
            name="subjective = true",
            hoverinfo="skip",
        ),
        row=1,
        col=1,
    )
    _meg_bars(fig, meg_summary["by_size"], 2, "n", True)
    _meg_bars(fig, meg_summary["by_density"], 3, "d", False)
    probe = meg_summary.get("probe") or {}
    overall = meg_summary["overall"]["paired"]
    test = overall.get("wilcoxon")
    note = "" if test is None else f" — Wilcoxon p = {test['p_value']:.3g} (n = {test['n_pairs']})"
    fig.update_layout(
        title=f"MEG on the true vs the decoded grid ({probe.get('key', '?')}){note}",
        barmode="group",
        template="plotly_white",
        legend={"orientation": "h", "y": -0.2},
    )
    fig.update_xaxes(title_text="true MEG (nats / decision)", row=1, col=1)
    fig.update_yaxes(title_text="subjective MEG (nats / decision)", row=1, col=1)
    fig.update_yaxes(title_text="mean MEG (nats / decision)", row=1, col=2)
    return fig
