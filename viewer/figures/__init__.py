"""Every plotly figure of goalprobe, as pure functions (the one implementation of each).

Every function takes plain data (numpy arrays, sequences, parsed JSON) and returns a new
``plotly.graph_objects.Figure``; nothing reads files or keeps state, so the Dash viewer, the
static export, the report (:mod:`goalprobe.report`) and the files the application writes
(``patch_heatmap.html``, ``scoring/figures/*.json``) all draw with the same code. Coordinates
are ``(row, col)``: row 0 is the top row, drawn at the top (the y axis is reversed), and each
cell is a unit square centred on its integer coordinates.

=====================  ========================================================================
module                 figures
=====================  ========================================================================
:mod:`.style`          colours and symbols (:data:`CELL_COLOURS`, :data:`LEGEND`), layout,
                       :func:`empty_figure`
:mod:`.maps`           grids and decoded maps (:func:`cell_map_figure`,
                       :func:`probability_figure`, :func:`plan_figure`)
:mod:`.plans`          :func:`plan_strip_figure`, :func:`prefix_accuracy_grid_figure`,
                       :func:`prefix_accuracy_grid_figure` (stage x layer small multiples),
                       :func:`plan_sweep_figure` (a whole decoder sweep)
:mod:`.episodes`       :func:`episode_timeline_figure`
:mod:`.false_belief`   :func:`false_belief_maps_figure` (true, shown, decoded side by side),
                       :func:`oracle_rates_figure`
:mod:`.behaviour`      behaviour by size x density and distance, iso-difficulty bars
:mod:`.harm`           reward against harm on harm grids
:mod:`.probes`         :func:`probe_comparison_figure`, per-class and localisation bars,
                       :func:`sweep_comparison_figure` (a probe sweep)
:mod:`.scoring`        policy against belief, top-k, MEG
:mod:`.patching`       :func:`patching_heatmap_figure` (records), :func:`patch_summary_figure`
:mod:`.attribution`    :func:`attribution_map_figure` (prompt positions x blocks, cells as the grid)
:mod:`.decision`       :func:`decision_time_figure` (the logit lens along the reasoning),
                       :func:`reasoning_readout_figure` (the store's read-out over reasoning time)
=====================  ========================================================================

The names below are re-exported here, so ``from goalprobe.viewer.figures import cell_map_figure`` works.
"""

from goalprobe.viewer.figures.attribution import attribution_map_figure
from goalprobe.viewer.figures.behaviour import (
    behaviour_by_distance_figure,
    behaviour_grid_figure,
    iso_accuracy_figure,
)
from goalprobe.viewer.figures.decision import decision_time_figure, reasoning_readout_figure
from goalprobe.viewer.figures.episodes import episode_timeline_figure
from goalprobe.viewer.figures.false_belief import false_belief_maps_figure, oracle_rates_figure
from goalprobe.viewer.figures.harm import reward_harm_figure
from goalprobe.viewer.figures.learning import learning_curve_figure
from goalprobe.viewer.figures.maps import (
    cell_hover_text,
    cell_map_figure,
    plan_figure,
    probability_figure,
)
from goalprobe.viewer.figures.patching import patch_summary_figure, patching_heatmap_figure
from goalprobe.viewer.figures.plans import (
    plan_strip_categories,
    plan_strip_figure,
    plan_sweep_figure,
    prefix_accuracy_grid_figure,
    sweep_runs,
)
from goalprobe.viewer.figures.probes import (
    BASELINES,
    baseline_values,
    localisation_figure,
    per_class_figure,
    probe_comparison_figure,
    sweep_comparison_figure,
)
from goalprobe.viewer.figures.scoring import belief_figure, meg_figure, topk_figure
from goalprobe.viewer.figures.style import (
    ACTION_ARROWS,
    CELL_COLOURS,
    CELL_SYMBOLS,
    DECODED_COLOUR,
    EXECUTED_COLOUR,
    LEGEND,
    MISMATCH_COLOUR,
    OPTIMAL_COLOUR,
    class_name,
    empty_figure,
)

__all__ = [
    "BASELINES",
    "decision_time_figure",
    "reasoning_readout_figure",
    "baseline_values",
    "plan_strip_categories",
    "prefix_accuracy_grid_figure",
    "reward_harm_figure",
    "learning_curve_figure",
    "ACTION_ARROWS",
    "CELL_COLOURS",
    "CELL_SYMBOLS",
    "DECODED_COLOUR",
    "EXECUTED_COLOUR",
    "LEGEND",
    "MISMATCH_COLOUR",
    "OPTIMAL_COLOUR",
    "behaviour_by_distance_figure",
    "behaviour_grid_figure",
    "belief_figure",
    "cell_hover_text",
    "cell_map_figure",
    "class_name",
    "empty_figure",
    "episode_timeline_figure",
    "false_belief_maps_figure",
    "oracle_rates_figure",
    "iso_accuracy_figure",
    "localisation_figure",
    "meg_figure",
    "patch_summary_figure",
    "patching_heatmap_figure",
    "attribution_map_figure",
    "per_class_figure",
    "plan_figure",
    "plan_strip_figure",
    "plan_sweep_figure",
    "sweep_runs",
    "probability_figure",
    "probe_comparison_figure",
    "sweep_comparison_figure",
    "topk_figure",
]
