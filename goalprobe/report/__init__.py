"""``RUN/report.html``: the study's figures and tables from one run directory, in one file.

Self-contained (plotly.js inlined once), so it opens offline. Sections follow the study
(sections 4-5, appendices C-F) and go beyond it; each states its configuration and baselines
with 95% intervals, and a section whose inputs are missing or whose stage failed shows a "not
run" / "failed: reason" box (missing data never fails the report). :mod:`.run` reads the
run, :mod:`.blocks` holds tables, figures, boxes and number formats, the section modules build
the sections (figures from :mod:`goalprobe.viewer.figures`), :mod:`.headline` the headline
table, and :mod:`.page` renders the Jinja2 templates in ``templates/``.
"""

from goalprobe.report.page import write_report

__all__ = ["write_report"]
