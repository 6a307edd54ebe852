"""``RUN/report.html``: the study's figures and tables from one run directory, in one file.

Self-contained (plotly.js inlined once), so it opens offline. Sections follow the study
(sections 4-5, appendices C-F) and go beyond it; each states its configuration and baselines
with 95% intervals, and a section whose inputs are missing or whose stage failed shows a "not
run" / "failed: reason" box (missing data never fails the report). :mod:`.run` reads the
run, :mod:`.blocks` holds tables, figures, boxes and number formats, the section modules build
the sections (figures from :mod:`goalprobe.viewer.figures`), :mod:`.headline` the headline
table, and :mod:`.page` renders the Jinja2 templates in ``templates/``.
"""

from goalprobe.report.blocks import stat_text
from goalprobe.report.headline import HeadlineRow, headline_rows
from goalprobe.report.page import SECTION_TITLES, STAGE_OF_SECTION, render_report, write_report
from goalprobe.report.run import MissingInput

__all__ = [
    "SECTION_TITLES",
    "STAGE_OF_SECTION",
    "HeadlineRow",
    "MissingInput",
    "headline_rows",
    "render_report",
    "stat_text",
    "write_report",
]
