"""Shape aliases of the arrays that cross room boundaries (jaxtyping over numpy).

One name per array contract (``acts: ResidualActs`` rather than ``np.ndarray`` plus prose).
mypy reads each as ``np.ndarray``; at run time ``isinstance(x, ResidualActs)`` checks rank and
dtype kind (the tests do; library code imports the aliases under ``TYPE_CHECKING``). Imports
numpy and jaxtyping only. Dimension names, the same in every docstring:

``n_rows``: store rows (one per step) or batch examples; ``k``: tokens per row of a stage (3
for the anchors, 225 for ``grid_cells``); ``d_model``: residual width; ``features``:
``k * d_model``; ``side``: a cell map's side (the 15 x 15 ``LABEL_CANVAS``, or the grid side
``n``); ``n_classes``: probability columns (a probe's ``classes_``, or every ``CellType``);
``horizon``: plan steps; ``n_plan_classes``: 5 (UP, DOWN, LEFT, RIGHT, END).
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Float, Integer, Shaped, UInt8

ResidualActs = Float[np.ndarray, "n_rows k d_model"]
"""Residual-stream activations of one stage and layer, as the store holds them
(``ActivationStore.read``; float16 unless a dtype was asked for) and as probes and plan decoders
take them."""

FeatureMatrix = Float[np.ndarray, "n_rows features"]
"""Activations flattened per row (``k * d_model`` features), which the cell probes also accept."""

TokenPositions = Integer[np.ndarray, "n_rows k"]
"""int32 token positions of a stage's tokens in each row's replayed sequence."""

RowIndex = Integer[np.ndarray, " n_rows"]
"""int64 store rows (``ActivationStore.select``), ascending unless shuffled."""

RowMask = Bool[np.ndarray, " n_rows"]
"""One bool per store row (``ActivationStore.present``)."""

GridIds = Shaped[np.ndarray, " n_rows"]
"""The grid id of every row (str or object array): what every split and bootstrap groups by."""

CellLabels = UInt8[np.ndarray, "n_rows side side"]
"""``CellType`` value of every cell of every row's state (the store's ``cell_types`` label,
``PADDING`` outside the grid), and a probe's decoded map (``predict``)."""

CellProbs = Float[np.ndarray, "n_rows side side n_classes"]
"""Decoded-map probabilities of a cell probe (``predict_proba``; float32)."""

PlanTargets = Integer[np.ndarray, "n_rows horizon"]
"""Plan labels: the next executed actions, then ``PLAN_END``, then ``PLAN_PAD`` (the store's
``plan`` label, uint8; a plan decoder's ``predict``, int8)."""

PlanProbs = Float[np.ndarray, "n_rows horizon n_plan_classes"]
"""Per-step class probabilities of a plan decoder (``predict_proba``; float32)."""
