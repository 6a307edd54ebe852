"""goalprobe: viewer.

Plotly figures (:mod:`goalprobe.viewer.figures`, shared with the report), lazy per-episode
access to a run directory (:mod:`goalprobe.viewer.data`), what one step shows
(:mod:`goalprobe.viewer.step`), the Dash app (:mod:`goalprobe.viewer.app`; the explorer and the
stage-episode tabs in modules of their own) and the static HTML export
(:mod:`goalprobe.viewer.export`). Nothing is imported here, so ``import goalprobe.viewer.figures``
does not load Dash.
"""
