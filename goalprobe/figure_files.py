"""The figure files a run directory holds beside its tables, drawn by :mod:`goalprobe.viewer.figures`.

The library (``probes/``) computes and writes tables; drawing is the viewer's and writing the
drawings is the application's: ``goalprobe patch`` and the demo's ``patching`` stage write
``patch_heatmap.html``, ``goalprobe score`` and the ``scoring`` stage write
``scoring/figures/*.json``, both through these functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path

from goalprobe.run_layout import ARTEFACTS, RunLayout, write_atomic
from goalprobe.viewer.figures.patching import patch_summary_figure
from goalprobe.viewer.figures.scoring import belief_figure, meg_figure, topk_figure


def write_patch_heatmap(out_dir: Path, summary: Sequence) -> Path:
    """Write the site x layers heatmaps of a patching ``summary`` (``SummaryRow`` objects or
    their mappings) as self-contained HTML into ``out_dir`` (``patch_heatmap.html``)."""
    path = Path(out_dir) / Path(ARTEFACTS["patching heatmap"].relative).name
    rows = [asdict(r) if is_dataclass(r) and not isinstance(r, type) else r for r in summary]
    # a fixed div id: the same summary gives the same bytes (plotly draws a random one)
    patch_summary_figure(rows).write_html(path, include_plotlyjs=True, div_id="patch-heatmap")
    return path


def write_scoring_figures(layout: RunLayout, belief: Mapping, meg: Mapping) -> dict[str, Path]:
    """Write the scoring figures (``fig.to_json()``) into ``scoring/figures/``; returns
    ``figure_<name>`` -> written path."""
    figures = {
        "belief_by_size": belief_figure(dict(belief)),
        "topk": topk_figure(dict(belief)),
        "meg": meg_figure(dict(meg)),
    }
    out = {}
    for name, fig in figures.items():
        path = layout.scoring_figure(name)
        out[f"figure_{name}"] = write_atomic(path, fig.to_json())
    return out
