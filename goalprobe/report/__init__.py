"""``RUN/report.html``: the study's figures and tables from one run directory, in one file.

The page is self-contained: plotly.js is inlined once in the head and every figure is a
``<div>`` drawn by it, so the file opens offline in any browser. Sections follow the study
(../shared/papers/002, sections 4-5 and appendices C-F):

=====================  =====================================================================
section                answers
=====================  =====================================================================
behaviour              Fig. 4 (accuracy and JSD vs goal distance; by size x density), Fig. 12
iso-difficulty         Table 3 / Fig. 14 (paired Wilcoxon, rank-biserial effect sizes)
key variants           Table 1 (success, accuracy, stage accuracy, pickup, attraction, Jaccard)
intention              Ward et al. Def. 20: policy change when the key is guaranteed; pi* control
cognitive map          Figs. 6, 8, 15 (probe accuracy by family, stage and layer; per class)
localisation           Fig. 7 (agent and goal top-1, Manhattan distance, by grid size)
walls                  beyond the study (issue 39): conditional wall test, absolute and agent frame
goal distance          Table 4 (MAE, R2 by family, stage and layer)
policy vs belief       Table 2, Fig. 9 (Acc GT, Acc Dec, Agreement, Recovery, top-k), MEG
plan decoder           Fig. 10, Table 5 (prefix accuracy vs N, length analysis)
patching               section 5.2, appendix F (anchor verdicts vs a random grid; dose-response)
attribution            beyond the study (issue 41): where both agents read the coordinates from
false belief           beyond the study: behaviour and the probe against a known (shown) belief
=====================  =====================================================================

Every section states the configuration that produced it (the stage record's resolved config)
and its baselines (majority class, shuffled labels, ``0.25^N``, random walk, chance) with 95%
confidence intervals. A section whose inputs are missing, or whose stage failed, shows a
"not run" / "failed: reason" box instead; writing the report never fails on missing data.

Modules: :mod:`.run` reads the run (only through :class:`~goalprobe.run_layout.RunLayout`),
:mod:`.blocks` holds what a section is made of (tables, figures, boxes) and the number formats,
:mod:`.behaviour`, :mod:`.intention`, :mod:`.probes` and :mod:`.outcomes` build the sections (every figure comes
from :mod:`goalprobe.viewer.figures`), :mod:`.headline` the headline table, and :mod:`.page` renders the
Jinja2 templates in ``templates/`` (``report.html.j2``, ``blocks.html.j2``, ``report.css``).
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
