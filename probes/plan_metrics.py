"""Plan labels, the metrics of one-shot plan decoding (prefix accuracy, length analysis) and the
predicted-plans file; torch-free, shared by the plan decoder, its sweep and the viewer.

**Plan format.** A row of ``T`` tokens (``PLAN_HORIZON = 10``): the next executed actions
(``Action``: UP=0 .. RIGHT=3), ``PLAN_END`` (4) after the last one, then ``PLAN_PAD`` (5). A
trajectory with ``T`` or more actions left has no ``END`` (truncated, never dropped). A plan's
*length* is the number of actions before its first ``END`` (``T`` without one), censored at
``T`` for targets and predictions alike.

**Prefix matching.** Predictions are made canonical (every token after the first ``END``
becomes ``PAD``); a prefix hit at ``N`` means the prediction equals the target at every
position ``j <= N`` whose target is not ``PAD``. ``END`` is thus a token to predict, and a
prediction that ends early misses. Over examples with at least ``N`` actions, ``END`` never
enters and a uniform guess hits with probability exactly ``0.25 ** N`` (the study's random
baseline; over all examples it is only a reference line).

Intervals resample *grids* with replacement (examples of one grid are not independent).

**Files.** Predicted plans in HDF5 (schema ``goalprobe.predicted_plans`` version 1; layout in
docs/formats.md, "Plan decoders"): what a plan decoder writes when applied
(:func:`write_predicted_plans`). :func:`read_predicted_plans` reads one run whole; a viewer reads
:func:`read_plan_runs` and :func:`read_plan_row_ids` / :func:`read_plan_rows` (chosen rows
only). Every reader checks the schema and version.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, PLAN_END, PLAN_HORIZON, PLAN_PAD, Action
from goalprobe.probes.decoded_maps import opened_h5
from goalprobe.probes.serialization import check_schema

from goalprobe.stats import GridBootstrap, json_ready, safe_ratio

N_PLAN_CLASSES = N_ACTIONS + 1
"""Classes a decoder predicts per step: the four actions and ``PLAN_END``."""

PLAN_TOKENS: dict[str, int] = {**{a.name: int(a) for a in Action}, "END": PLAN_END, "PAD": PLAN_PAD}
"""Token names and values of the plan format (the actions, then ``END`` and ``PAD``; written
into cards and HDF5 attributes)."""


def validate_plans(plans: np.ndarray, *, name: str = "plans") -> np.ndarray:
    """``plans (N, T)`` as int8 after checking the plan format (``END`` at most once, followed
    only by ``PAD``); a ValueError names the first offending row and position (and ``name``)."""
    arr = np.asarray(plans)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, T), got shape {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} has horizon 0; need at least one plan step")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer tokens, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr > PLAN_PAD)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"{name}[{row}, {col}] = {arr[row, col]} is not a plan token (0-3 actions, "
            f"{PLAN_END} END, {PLAN_PAD} PAD)"
        )
    # a PAD or a second END must follow an END; an action must not
    after_end = _after_end(arr)
    for mask, what in (
        (after_end & (arr < PLAN_END), "an action after END"),
        (after_end & (arr == PLAN_END), "a second END"),
        (~after_end & (arr == PLAN_PAD), "PAD before any END"),
    ):
        if mask.any():
            row, col = np.argwhere(mask)[0]
            raise ValueError(f"{name}[{row}, {col}] is {what}; row {row} = {arr[row].tolist()}")
    return arr.astype(np.int8, copy=False)


def canonical_plans(plans: np.ndarray) -> np.ndarray:
    """Raw decoder argmax ``(N, T)`` in the plan format (int8): every token after the first
    ``END`` becomes ``PAD``."""
    arr = np.asarray(plans)
    if arr.ndim != 2:
        raise ValueError(f"predicted plans must be 2-D (N, T), got shape {arr.shape}")
    out = arr.astype(np.int8, copy=True)
    out[_after_end(out)] = PLAN_PAD
    return validate_plans(out, name="predicted plans")


def _after_end(plans: np.ndarray) -> np.ndarray:
    """``(N, T)`` bool: the position follows an ``END`` of its row."""
    ended = np.cumsum(plans == PLAN_END, axis=1) > 0
    return np.concatenate([np.zeros((plans.shape[0], 1), bool), ended[:, :-1]], axis=1)


def plan_lengths(plans: np.ndarray) -> np.ndarray:
    """``(N,)`` int64 number of actions before the first ``END`` (``T`` when there is none)."""
    arr = np.asarray(plans)
    is_end = arr == PLAN_END
    return np.where(is_end.any(axis=1), is_end.argmax(axis=1), arr.shape[1]).astype(np.int64)


def truncate_plans(plans: np.ndarray, horizon: int) -> np.ndarray:
    """``(N, horizon)`` int8: the first ``horizon`` tokens of each plan (cut, never dropped)."""
    arr = validate_plans(plans)
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if arr.shape[1] < horizon:
        raise ValueError(
            f"plans have {arr.shape[1]} steps but the decoder horizon is {horizon}; "
            "labels shorter than the horizon cannot be extended"
        )
    return np.ascontiguousarray(arr[:, :horizon])


def encode_plans(sequences: Iterable[Sequence[int]], horizon: int = PLAN_HORIZON) -> np.ndarray:
    """``(N, horizon)`` int8 plan rows from action sequences of any length: the actions, then
    ``END``, then ``PAD`` (truncated at ``horizon``)."""
    rows = []
    for i, seq in enumerate(sequences):
        actions = np.asarray(list(seq), dtype=np.int64)
        if actions.size and ((actions < 0) | (actions >= N_ACTIONS)).any():
            raise ValueError(f"sequence {i} holds a non-action token: {actions.tolist()}")
        row = np.full(horizon, PLAN_PAD, dtype=np.int8)
        k = min(actions.size, horizon)
        row[:k] = actions[:k]
        if actions.size < horizon:
            row[actions.size] = PLAN_END
        rows.append(row)
    return np.stack(rows) if rows else np.zeros((0, horizon), np.int8)


def random_baseline(horizon: int = PLAN_HORIZON) -> np.ndarray:
    """The study's chance line ``0.25 ** N`` for ``N = 1..T``: ``(T,)`` float64."""
    return (1.0 / N_ACTIONS) ** np.arange(1, horizon + 1, dtype=np.float64)


def majority_plan(plans: np.ndarray) -> np.ndarray:
    """``(T,)`` int8: the most frequent whole plan row (ties: the lexicographically smallest)."""
    arr = validate_plans(plans)
    if arr.shape[0] == 0:
        raise ValueError("majority_plan needs at least one plan")
    rows, counts = np.unique(arr, axis=0, return_counts=True)
    return rows[int(np.argmax(counts))].astype(np.int8)


def prefix_hits(predicted: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``(N, T)`` bool, column ``n - 1``: the prefix hit at length ``n`` (module docstring) of the
    decoder output ``predicted`` (made canonical here) against ``target``."""
    pred = canonical_plans(predicted)
    tgt = validate_plans(target, name="target plans")
    if pred.shape != tgt.shape:
        raise ValueError(f"predicted plans {pred.shape} and targets {tgt.shape} differ in shape")
    match = (pred == tgt) | (tgt == PLAN_PAD)
    return np.cumprod(match, axis=1).astype(bool)


def _grid_sums(pred: np.ndarray, tgt: np.ndarray, boot: GridBootstrap) -> dict:
    """Per-grid sums from which every metric is a ratio (or a histogram median)."""
    horizon = tgt.shape[1]
    hits = prefix_hits(pred, tgt)
    true_len = plan_lengths(tgt)
    pred_len = plan_lengths(canonical_plans(pred))
    long_enough = true_len[:, None] >= np.arange(1, horizon + 1)[None, :]
    abs_err = np.abs(pred_len - true_len)
    return {
        "n": boot.grid_sums(np.ones(len(tgt))),
        "hits": boot.grid_sums(hits),
        "hits_long": boot.grid_sums(hits & long_enough),
        "n_long": boot.grid_sums(long_enough),
        "exact": boot.grid_sums(pred_len == true_len),
        "pred_len": boot.grid_sums(pred_len),
        "true_len": boot.grid_sums(true_len),
        "err_hist": boot.grid_sums(np.eye(horizon + 1)[abs_err]),
    }


def _hist_median(hist: np.ndarray) -> np.ndarray:
    """Median of integer values 0..K given weighted counts ``hist (..., K+1)``."""
    total = hist.sum(-1)
    cum = np.cumsum(hist, -1)
    lo_rank = np.floor((total - 1) / 2)[..., None]
    hi_rank = np.floor(total / 2)[..., None]
    lo = (cum <= lo_rank).sum(-1)
    hi = (cum <= hi_rank).sum(-1)
    return np.where(total > 0, (lo + hi) / 2.0, np.nan)


def _statistics(sums: dict, boot: GridBootstrap) -> dict[str, np.ndarray]:
    """``(1 + B, ...)`` metrics under every draw of ``boot`` (row 0: the sample itself)."""

    def w(key: str) -> np.ndarray:
        return boot.resample(sums[key])

    n = w("n")
    return {
        "prefix_accuracy": safe_ratio(w("hits"), n[..., None]),
        "prefix_accuracy_min_length": safe_ratio(w("hits_long"), w("n_long")),
        "exact_length_match": safe_ratio(w("exact"), n),
        "mean_predicted_length": safe_ratio(w("pred_len"), n),
        "mean_true_length": safe_ratio(w("true_len"), n),
        "length_bias": safe_ratio(w("pred_len") - w("true_len"), n),
        "median_abs_length_error": _hist_median(w("err_hist")),
    }


@dataclass(frozen=True, eq=False)
class PlanMetrics:
    """Prefix accuracy and length analysis of predicted plans, with grid-bootstrap intervals.

    Every metric ``m`` has a point estimate ``m`` and ``m_ci`` (``(2, ...)``: the percentile
    interval's bounds); ``nan`` marks an empty subset or, in an interval, fewer than 2 grids.
    ``prefix_accuracy`` ``(T,)``: hit rate at ``N = 1..T``; ``prefix_accuracy_min_length``: over
    the ``n_min_length`` examples with ``>= N`` actions (where ``random_baseline = 0.25 ** N``
    is exact chance); the length metrics use lengths censored at ``T``; ``n_grids`` is the
    bootstrap's unit and ``n_bootstrap = 0`` leaves every interval ``nan``.
    """

    horizon: int
    n_examples: int
    n_grids: int
    confidence_level: float
    n_bootstrap: int
    prefix_accuracy: np.ndarray
    prefix_accuracy_ci: np.ndarray
    prefix_accuracy_min_length: np.ndarray
    prefix_accuracy_min_length_ci: np.ndarray
    n_min_length: np.ndarray
    random_baseline: np.ndarray
    exact_length_match: float
    exact_length_match_ci: np.ndarray
    mean_predicted_length: float
    mean_predicted_length_ci: np.ndarray
    mean_true_length: float
    mean_true_length_ci: np.ndarray
    length_bias: float
    length_bias_ci: np.ndarray
    median_abs_length_error: float
    median_abs_length_error_ci: np.ndarray

    def to_dict(self) -> dict:
        """JSON-ready dict (arrays as lists, ``nan`` as ``None``)."""
        return json_ready(self.__dict__)


SCALAR_METRICS = (
    "exact_length_match",
    "mean_predicted_length",
    "mean_true_length",
    "length_bias",
    "median_abs_length_error",
)
"""Names of the scalar length metrics of :class:`PlanMetrics`."""


def plan_metrics(
    predicted: np.ndarray,
    target: np.ndarray,
    grid_ids: np.ndarray,
    *,
    n_bootstrap: int = 1000,
    confidence_level: float = 0.95,
    random_state: int | None = 0,
) -> PlanMetrics:
    """:class:`PlanMetrics` of decoder output ``predicted (N, T)`` (made canonical) against
    ``target``, the bootstrap resampling ``grid_ids`` (``n_bootstrap=0`` skips the intervals)."""
    tgt = validate_plans(target, name="target plans")
    if len(tgt) == 0:
        raise ValueError("plan_metrics needs at least one example")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must lie in (0, 1), got {confidence_level}")
    ids = np.asarray(grid_ids)
    if ids.shape != (len(tgt),):
        raise ValueError(f"grid_ids must have shape ({len(tgt)},), got {ids.shape}")
    boot = GridBootstrap.from_grid_ids(
        ids, n_resamples=n_bootstrap, confidence=confidence_level, random_state=random_state
    )
    sums = _grid_sums(np.asarray(predicted), tgt, boot)
    estimates: dict[str, Any] = {}
    for key, draws in _statistics(sums, boot).items():
        estimates[key] = float(draws[0]) if key in SCALAR_METRICS else draws[0]
        estimates[f"{key}_ci"] = boot.interval(draws)
    return PlanMetrics(
        horizon=tgt.shape[1],
        n_examples=len(tgt),
        n_grids=boot.n_grids,
        confidence_level=confidence_level,
        n_bootstrap=n_bootstrap,
        n_min_length=sums["n_long"].sum(0).astype(np.int64),
        random_baseline=random_baseline(tgt.shape[1]),
        **estimates,
    )


def plan_metrics_by_group(
    predicted: np.ndarray,
    target: np.ndarray,
    grid_ids: np.ndarray,
    groups: np.ndarray,
    **kwargs,
) -> dict[str, PlanMetrics]:
    """``{str(value): PlanMetrics}`` within each value of ``groups (N,)`` (e.g. grid size),
    sorted; ``kwargs`` go to :func:`plan_metrics`."""
    keys = np.asarray(groups)
    if keys.shape != (len(target),):
        raise ValueError(f"groups must have shape ({len(target)},), got {keys.shape}")
    pred, tgt, ids = np.asarray(predicted), np.asarray(target), np.asarray(grid_ids)
    return {
        str(v.item() if hasattr(v, "item") else v): plan_metrics(
            pred[keys == v], tgt[keys == v], ids[keys == v], **kwargs
        )
        for v in np.unique(keys)
    }


def stored_run_metrics(
    plans: np.ndarray,
    row_ids: np.ndarray,
    split: np.ndarray | None,
    store_plans: np.ndarray,
    store_grid_ids: np.ndarray,
    *,
    test_code: int = 2,
    n_bootstrap: int = 200,
    random_state: int | None = 0,
) -> tuple[PlanMetrics, str]:
    """:func:`plan_metrics` of one stored run of predicted plans against the store's labels.

    ``row_ids`` index the store's ``store_plans (R, T' >= T)`` and ``store_grid_ids``; rows
    outside the store are dropped. Scores the ``test_code`` rows of ``split``, or every row
    when it is None; returns ``(metrics, "test" | "all")``.
    """
    row_ids = np.asarray(row_ids, dtype=np.int64)
    keep = np.ones(len(row_ids), bool) if split is None else np.asarray(split) == test_code
    keep &= (row_ids >= 0) & (row_ids < len(store_plans))
    rows = row_ids[keep]
    target = truncate_plans(np.asarray(store_plans)[rows], np.asarray(plans).shape[1])
    grid_ids = np.asarray(store_grid_ids)[rows].astype(str)
    predicted = np.asarray(plans)[keep]
    metrics = plan_metrics(
        predicted, target, grid_ids, n_bootstrap=n_bootstrap, random_state=random_state
    )
    return metrics, "all" if split is None else "test"


PREDICTED_PLANS_SCHEMA = "goalprobe.predicted_plans"
"""``schema`` attribute of a predicted-plans HDF5 file."""
PREDICTED_PLANS_SCHEMA_VERSION = 1
"""Version of the predicted-plans HDF5 layout."""
SPLIT_NAMES: tuple[str, ...] = ("train", "validation", "test")
"""Meaning of the ``split`` codes 0, 1, 2 in predicted-plans files."""

_RUN_NAME = re.compile(r"^(?P<stage>[a-z_]+)/layer(?P<layer>\d+)/(?P<kind>[a-z_]+?)(?P<n>\d*)$")
"""The plan sweep's run names: the last fallback for a run's stage, layer, kind and capacity."""


@dataclass(frozen=True, eq=False)
class PredictedPlans:
    """One run's predicted plans as stored in HDF5 (the arguments of
    :func:`write_predicted_plans`; ``split`` None when not recorded)."""

    plans: np.ndarray
    row_ids: np.ndarray
    split: np.ndarray | None
    card: dict


def write_predicted_plans(
    path: str | Path,
    run_name: str,
    plans: np.ndarray,
    row_ids: np.ndarray,
    *,
    card: dict,
    split: np.ndarray | None = None,
    overwrite: bool = False,
) -> None:
    """Add one run's predicted plans to an HDF5 file (created when missing).

    ``run_name``: the group under ``runs/`` (may contain ``/``); ``plans (N, T)``; ``row_ids
    (N,)`` the store rows; ``card``: the decoder's JSON-ready card; ``split``: optional codes
    into :data:`SPLIT_NAMES`; ``overwrite`` replaces a run of that name instead of raising.
    """
    import h5py

    plans = validate_plans(plans, name=f"plans of run {run_name!r}")
    row_ids = np.asarray(row_ids)
    if row_ids.shape != (len(plans),) or not np.issubdtype(row_ids.dtype, np.integer):
        raise ValueError(
            f"row_ids must be ({len(plans)},) integers, got {row_ids.shape} {row_ids.dtype}"
        )
    if split is not None:
        split = np.asarray(split)
        if split.shape != (len(plans),) or ((split < 0) | (split >= len(SPLIT_NAMES))).any():
            raise ValueError(f"split must be ({len(plans)},) codes in 0..{len(SPLIT_NAMES) - 1}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "a") as f:
        if "schema" in f.attrs:
            check_schema(f.attrs, PREDICTED_PLANS_SCHEMA, (PREDICTED_PLANS_SCHEMA_VERSION,), path)
        else:
            f.attrs["schema"] = PREDICTED_PLANS_SCHEMA
            f.attrs["schema_version"] = PREDICTED_PLANS_SCHEMA_VERSION
            f.attrs["tokens"] = json.dumps(PLAN_TOKENS)
            f.attrs["split_names"] = json.dumps(list(SPLIT_NAMES))
        name = f"runs/{run_name}"
        if name in f:
            if not overwrite:
                raise ValueError(f"{path}: run {run_name!r} already exists (pass overwrite=True)")
            del f[name]
        group = f.create_group(name)
        group.create_dataset("plans", data=plans, dtype=np.int8)
        group.create_dataset("row_ids", data=row_ids.astype(np.int64))
        if split is not None:
            group.create_dataset("split", data=split.astype(np.int8))
        group.attrs["card"] = json.dumps(card, allow_nan=False)
        group.attrs["horizon"] = plans.shape[1]


def _opened(path: str | Path):
    """The predicted-plans file at ``path`` open for reading, its schema and version checked."""
    return opened_h5(path, PREDICTED_PLANS_SCHEMA, (PREDICTED_PLANS_SCHEMA_VERSION,), ())


def _run_names(f) -> list[str]:
    """Names of the groups under ``runs/`` of an open file that hold a ``plans`` dataset, sorted."""
    import h5py

    names: list[str] = []

    def visit(name: str, obj) -> None:
        if isinstance(obj, h5py.Group) and "plans" in obj:
            names.append(name)

    if "runs" in f:
        f["runs"].visititems(visit)
    return sorted(names)


def read_predicted_plans(path: str | Path, run_name: str) -> PredictedPlans:
    """Read one run written by :func:`write_predicted_plans`."""
    path = Path(path)
    with _opened(path) as f:
        name = f"runs/{run_name}"
        if name not in f:
            raise KeyError(f"{path}: no run {run_name!r}")
        group = f[name]
        split = group["split"][()].astype(np.int8) if "split" in group else None
        plans, row_ids = group["plans"][()].astype(np.int8), group["row_ids"][()].astype(np.int64)
        return PredictedPlans(plans, row_ids, split, json.loads(group.attrs["card"]))


@dataclass(frozen=True)
class PlanRunInfo:
    """What one run (group under ``runs/``) of a predicted-plans file decoded, without reading
    its plans: the activations' stage and layer, the kind, the decoder's capacity (None when
    unknown), whether split codes are stored, and the run's card."""

    run: str
    stage: str
    layer: int
    kind: str
    n_layers: int | None
    has_split: bool
    card: dict = field(repr=False, compare=False)


def read_plan_runs(path: str | Path) -> list[PlanRunInfo]:
    """Every run of a predicted-plans file, sorted by name. Stage, layer and capacity come from
    the run's card, else from the run's name (the plan sweep's ``<stage>/layer<n>/<kind><k>``);
    ValueError when the file holds no run or a run's stage and layer are recorded nowhere."""
    path = Path(path)
    out = []
    with _opened(path) as f:
        for run in _run_names(f):
            group = f[f"runs/{run}"]
            try:
                card = json.loads(group.attrs.get("card", "{}"))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}: run {run!r}: card is not valid JSON ({err.msg})"
                ) from err
            out.append(_run_info(run, card, "split" in group))
    if not out:
        raise ValueError(f"{path}: no runs/<name>/plans group")
    return out


def _run_info(run: str, card: dict, has_split: bool) -> PlanRunInfo:
    provenance = card.get("provenance") or {}
    params = card.get("hyperparameters") or {}
    named = _RUN_NAME.match(run)
    stage = provenance.get("stage", named and named["stage"])
    layer = provenance.get("layer", named and named["layer"])
    kind = provenance.get("kind", named["kind"] if named else "decoder")
    n_layers = params.get("n_layers", named and named["n"])
    if stage is None or layer is None:
        raise ValueError(f"run {run!r}: stage and layer are not recorded")
    return PlanRunInfo(
        run=run,
        stage=str(stage),
        layer=int(layer),
        kind=str(kind),
        n_layers=int(n_layers) if n_layers not in (None, "") else None,
        has_split=has_split,
        card=card,
    )


def read_plan_row_ids(path: str | Path, run: str) -> np.ndarray:
    """``(N,)`` int64 store rows of one run (schema and version checked)."""
    with _opened(Path(path)) as f:
        return np.asarray(f[f"runs/{run}/row_ids"][()], dtype=np.int64)


def read_plan_rows(path: str | Path, run: str, positions: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(P, T)`` int8 plans of one run at file positions ``positions`` (any order), reading only
    those rows; ``T`` is the run's horizon even when ``positions`` is empty."""
    from goalprobe.activations.store.reader import read_rows

    with _opened(Path(path)) as f:
        return read_rows(f[f"runs/{run}/plans"], np.asarray(positions)).astype(np.int8, copy=False)
