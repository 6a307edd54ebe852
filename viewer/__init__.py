"""goalprobe: viewer.

Plotly figures and the interactive cognitive-map viewer over a run directory:

* :mod:`goalprobe.viewer.figures`: every figure of the project as pure functions (grids, decoded maps,
  plans, behaviour, probes, scoring, patching), one package shared with the report;
* :mod:`goalprobe.viewer.data`: lazy, per-episode access to a run directory (``RunData``), composing the
  readers of the rooms that own each format, with :mod:`~goalprobe.viewer.run_files` (path checks,
  missing artefacts), :mod:`~goalprobe.viewer.sources` (decoded-map and plan sources, the allow-lists)
  and :mod:`~goalprobe.viewer.false_belief_data` (the false_belief stage's outputs);
* :mod:`goalprobe.viewer.step`: what one step shows (true and decoded grid, optimal sets, plan, patching);
* :mod:`goalprobe.viewer.app`: the Dash app (``create_app(run_dir)``), composing one module per tab
  (:mod:`~goalprobe.viewer.explorer_tab`, :mod:`~goalprobe.viewer.overview_tab`,
  :mod:`~goalprobe.viewer.false_belief_tab`, each with its layout and callbacks) in the page of
  :mod:`~goalprobe.viewer.page`;
* :mod:`goalprobe.viewer.export`: the self-contained static HTML export.

Nothing is imported here, so ``import goalprobe.viewer.figures`` does not load Dash.
"""
