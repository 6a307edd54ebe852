"""Attribution patching: where in the prompt, and at which block, a metric is read from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from goalprobe.viewer.figures.style import figure_layout


def attribution_map_figure(
    values: np.ndarray,
    positions: Sequence[int],
    cell_positions: np.ndarray,
    *,
    anchors: Sequence[int] = (),
    changed_cells: Sequence[Sequence[int]] = (),
    layers: Sequence[int] | None = None,
    title: str = "",
    height: int | None = None,
) -> go.Figure:
    """One pair's attribution over prompt positions x blocks.

    Top row: one small map per block with each grid cell's value (at the cell's token) laid out
    as the grid (row 0 at the top), the changed cells outlined. Bottom: every attributed
    position (columns) x block (rows), the grid's span shaded and the anchors marked, so the
    instructions, the grid and the anchors read left to right.

    ``values``: ``(n_layers, k)`` attribution (signed ``atp`` or the GradDrop magnitude) at the
    token ``positions`` ``(k,)``; ``cell_positions``: ``(n, n)`` token position of every grid
    cell; ``changed_cells``: the cells base and counterfactual differ in. ``ValueError`` for
    shapes that disagree or a grid cell whose position was not attributed.
    """
    from plotly.subplots import make_subplots

    values = np.asarray(values, dtype=np.float64)
    columns = np.asarray(positions, dtype=np.int64)
    cells = np.asarray(cell_positions, dtype=np.int64)
    if values.ndim != 2 or values.shape[1] != len(columns):
        raise ValueError(f"values {values.shape} do not match {len(columns)} positions")
    if cells.ndim != 2 or cells.shape[0] != cells.shape[1]:
        raise ValueError(f"cell_positions must be (n, n), got {cells.shape}")
    n_layers = values.shape[0]
    labels = [str(x) for x in (layers if layers is not None else range(n_layers))]
    if len(labels) != n_layers:
        raise ValueError(f"{len(labels)} layer labels for {n_layers} rows")
    column = np.searchsorted(columns, cells)
    if np.any(column >= len(columns)) or np.any(
        columns[np.minimum(column, len(columns) - 1)] != cells
    ):
        raise ValueError("a grid cell's token position was not attributed")
    bound = float(np.max(np.abs(values))) or 1.0
    scale = {"colorscale": "RdBu", "zmin": -bound, "zmax": bound, "zmid": 0.0}
    if np.all(values >= 0):
        scale = {"colorscale": "Viridis", "zmin": 0.0, "zmax": bound}
    fig = make_subplots(
        rows=2,
        cols=n_layers,
        specs=[[{}] * n_layers, [{"colspan": n_layers}] + [None] * (n_layers - 1)],
        subplot_titles=[f"block {label}" for label in labels] + ["every prompt position"],
        row_heights=[0.55, 0.45],
        vertical_spacing=0.12,
    )
    n = cells.shape[0]
    for i in range(n_layers):
        grid = values[i][column]
        hover = [
            [f"cell ({r}, {c}), token {cells[r, c]}<br>{grid[r, c]:.4g}" for c in range(n)]
            for r in range(n)
        ]
        fig.add_trace(
            go.Heatmap(
                z=grid, text=hover, hoverinfo="text", showscale=i == 0,
                colorbar={"len": 0.5, "y": 0.78}, **scale,
            ),
            row=1, col=i + 1,
        )  # fmt: skip
        for r, c in changed_cells:
            fig.add_shape(
                type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5,
                line={"color": "black", "width": 2}, row=1, col=i + 1,
            )  # fmt: skip
        fig.update_yaxes(autorange="reversed", row=1, col=i + 1, showticklabels=i == 0)
    fig.add_trace(
        go.Heatmap(
            z=values, x=columns, y=labels, showscale=False, hovertemplate=(
                "position %{x}, block %{y}<br>%{z:.4g}<extra></extra>"
            ), **scale,
        ),
        row=2, col=1,
    )  # fmt: skip
    fig.add_vrect(
        x0=float(cells.min()) - 0.5, x1=float(cells.max()) + 0.5, fillcolor="grey",
        opacity=0.15, line_width=0, row=2, col=1, annotation_text="grid",
    )  # fmt: skip
    for anchor in anchors:
        fig.add_vline(x=float(anchor), line={"color": "black", "dash": "dot"}, row=2, col=1)
    fig.update_xaxes(title_text="token position", row=2, col=1)
    fig.update_yaxes(title_text="block", row=2, col=1)
    fig.update_layout(figure_layout(title, height or 560))
    return fig
