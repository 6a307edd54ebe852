"""Activation patching: outcomes by site x layer set."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from goalprobe.viewer.figures.style import (
    figure_layout,
    heat_trace,
    is_finite_number,
    layer_key,
)


def patching_heatmap_figure(
    records: Sequence[Mapping],
    *,
    value: str = "recovered",
    rows: str = "site",
    cols: str = "layers",
    facet: str | None = "direction",
    title: str = "",
    height: int | None = None,
) -> go.Figure:
    """Mean of the field ``value`` of patch records (mappings of
    ``goalprobe.probes.patching.patched_runs.PatchRecord`` fields) as ``rows x cols`` heatmaps,
    one panel per value of ``facet`` (or one panel). Booleans average to a rate; non-finite
    values (``recovered`` of a control pair) are left out; the hover gives the mean and ``n``.
    """
    from plotly.subplots import make_subplots

    if not records:
        raise ValueError("no records to draw")
    facets = sorted({str(r.get(facet)) for r in records}) if facet else [""]
    row_values = list(dict.fromkeys(str(r[rows]) for r in records))
    col_values = sorted({str(r[cols]) for r in records}, key=layer_key)
    diverging = value == "recovered"
    longest = max(len(v) for v in row_values)
    fig = make_subplots(
        rows=1,
        cols=len(facets),
        subplot_titles=facets if facet else None,
        horizontal_spacing=min(0.3, 0.04 + 0.012 * longest) if len(facets) > 1 else 0.0,
    )
    for i, f in enumerate(facets):

        def cell(rv, cv, f=f):
            vals = [
                float(r[value])
                for r in records
                if str(r[rows]) == rv
                and str(r[cols]) == cv
                and (facet is None or str(r.get(facet)) == f)
                and (is_finite_number(r.get(value)) or isinstance(r.get(value), bool))
            ]
            mean = float(np.mean(vals)) if vals else None
            shown = "n/a" if mean is None else f"{mean:.2f}"
            return mean, f"{rows}={rv}, {cols}={cv}<br>{value} = {shown}<br>n = {len(vals)}"

        fig.add_trace(
            heat_trace(
                row_values,
                col_values,
                cell,
                colorscale="RdBu" if diverging else "Viridis",
                zmid=0.0 if diverging else None,
                zmin=None if diverging else 0.0,
                zmax=None if diverging else 1.0,
                showscale=i == 0,
                colorbar={"title": {"text": value}, "thickness": 12},
                xgap=1,
                ygap=1,
            ),
            row=1,
            col=i + 1,
        )
        fig.update_xaxes(type="category", title={"text": cols}, row=1, col=i + 1)
        fig.update_yaxes(type="category", autorange="reversed", row=1, col=i + 1)
    height = height or 130 + 36 * len(row_values)
    margin = {"t": 78, "l": 16 + 7 * longest}
    fig.update_layout(figure_layout(title or f"Patching: mean {value}", height, margin=margin))
    fig.update_annotations(font={"size": 13}, yshift=4)
    return fig


SUMMARY_PANELS: tuple[tuple[str, str, str], ...] = (
    ("disjoint", "into_source_optimal_rate", "into source's optimal set (disjoint)"),
    ("disjoint", "recovered_mean", "logit diff. recovered (disjoint)"),
    ("control", "stable_rate", "stable (control)"),
)
"""``(kind, metric, title)`` of the columns of :func:`patch_summary_figure`."""

SITE_ORDER = ("grid", "changed_cells", "pre_reasoning", "post_reasoning", "answer", "all")
"""Patching sites in the order the summary heatmap lists them."""


def patch_summary_figure(summary: Sequence[Mapping], mode: str = "teacher_forced") -> go.Figure:
    """Site x layers heatmaps of a patching summary: one row per direction, one column per
    :data:`SUMMARY_PANELS` (``patch_heatmap.html``).

    ``summary``: rows of ``patch_results.json``'s ``summary`` (``SummaryRow`` fields) as
    mappings; ``mode``: the reasoning mode drawn. Hovering a cell shows the rate, CI and ``n``.
    """
    from plotly.subplots import make_subplots

    rows = [r for r in summary if r["mode"] == mode]
    directions = sorted({r["direction"] for r in rows}) or ["base_to_cf"]
    sites = [s for s in SITE_ORDER if any(r["site"] == s for r in rows)]
    layers = sorted({r["layers"] for r in rows}, key=layer_key)
    titles = [f"{d}: {t}" for d in directions for _, _, t in SUMMARY_PANELS]
    fig = make_subplots(
        rows=len(directions),
        cols=len(SUMMARY_PANELS),
        subplot_titles=titles,
        horizontal_spacing=0.06,
        vertical_spacing=0.12,
    )
    index = {(r["kind"], r["direction"], r["site"], r["layers"]): r for r in rows}
    for i, direction in enumerate(directions):
        for j, (kind, metric, _) in enumerate(SUMMARY_PANELS):

            def cell(site, layer, kind=kind, metric=metric, direction=direction):
                r = index.get((kind, direction, site, layer))
                return (None if r is None else r[metric]), _summary_hover(r, metric)

            fig.add_trace(
                heat_trace(
                    sites,
                    layers,
                    cell,
                    hovertext=True,
                    zmin=0.0,
                    zmax=1.0,
                    colorscale="Viridis",
                    showscale=(i == 0 and j == 0),
                ),
                row=i + 1,
                col=j + 1,
            )
            fig.update_xaxes(title_text="layers", type="category", row=i + 1, col=j + 1)
    fig.update_layout(
        title=f"Activation patching ({mode.replace('_', ' ')})",
        height=320 * len(directions) + 120,
        width=420 * len(SUMMARY_PANELS),
    )
    return fig


def _summary_hover(row: Mapping | None, metric: str) -> str:
    if row is None:
        return "no runs"
    changed_ci = row["action_changed_ci"]
    ci = {
        "action_changed_rate": changed_ci,
        "into_source_optimal_rate": row["into_source_optimal_ci"],
        "stable_rate": tuple(None if v is None else 1 - v for v in changed_ci[::-1]),
        "recovered_mean": row["recovered_ci"],
    }[metric]
    value = row[metric]
    return (
        f"{row['kind']} {row['direction']} site={row['site']} layers={row['layers']}<br>"
        f"{metric}={_three(value)} CI [{_three(ci[0])}, {_three(ci[1])}]<br>"
        f"n={row['n_runs']} runs, {row['n_grids']} grids"
    )


def _three(value: float | None) -> str:
    """Three decimals; an undefined value (NaN in memory, null in JSON) reads ``nan``."""
    return "nan" if value is None else f"{value:.3f}"
