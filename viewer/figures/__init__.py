"""Every plotly figure of goalprobe, as pure functions (the one implementation of each).

Each takes plain data (arrays, sequences, parsed JSON) and returns a new
``plotly.graph_objects.Figure``, reading no file and keeping no state, so the viewer, the
static export, the report and the application's figure files draw with the same code.
Coordinates are ``(row, col)``, row 0 drawn at the top, each cell a unit square centred on its
integer coordinates. Modules by subject: :mod:`.style` (colours, layout), :mod:`.maps`,
:mod:`.plans`, :mod:`.episodes`, :mod:`.false_belief`, :mod:`.behaviour`, :mod:`.harm`,
:mod:`.probes`, :mod:`.scoring`, :mod:`.patching`, :mod:`.attribution`, :mod:`.decision`;
the names below are re-exported here.
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
