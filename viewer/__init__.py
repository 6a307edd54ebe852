"""goalprobe: viewer.

Plotly figures and the interactive cognitive-map viewer over a run directory:

* :mod:`goalprobe.viewer.figures`: every figure of the project as pure functions (grids, decoded maps,
  plans, behaviour, probes, scoring, patching), one package shared with the report;
* :mod:`goalprobe.viewer.data`: lazy, per-episode access to a run directory, with allow-lists and path
  checks;
* :mod:`goalprobe.viewer.step`: what one step shows (true and decoded grid, optimal sets, plan, patching);
* :mod:`goalprobe.viewer.app`: the Dash app (``create_app(run_dir)``);
* :mod:`goalprobe.viewer.export`: the self-contained static HTML export.

Nothing is imported here, so ``import goalprobe.viewer.figures`` does not load Dash.
"""
