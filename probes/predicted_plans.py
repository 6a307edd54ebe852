"""Predicted plans in HDF5 (schema ``goalprobe.predicted_plans`` version 1; layout in
docs/formats.md, "Plan decoders"): what a plan decoder writes when applied, and how it is read.
:func:`read_predicted_plans` reads one run whole; a viewer reads :func:`read_plan_runs` and
:func:`read_plan_row_ids` / :func:`read_plan_rows` (chosen rows only). Every reader checks the
schema and version.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from goalprobe.probes.decoded_maps import _text, read_rows
from goalprobe.probes.serialization import check_schema

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
    from goalprobe.probes.plan_metrics import PLAN_TOKENS, validate_plans

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


@contextmanager
def _opened(path: Path):
    """The predicted-plans file at ``path`` open for reading, its schema and version checked."""
    import h5py

    with h5py.File(path, "r") as f:
        check_schema(f.attrs, PREDICTED_PLANS_SCHEMA, (PREDICTED_PLANS_SCHEMA_VERSION,), path)
        yield f


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
    the file attributes, then the run's card, then the run's name (the plan sweep's
    ``<stage>/layer<n>/<kind><k>``); ValueError when the file holds no run or a run's stage
    and layer are recorded nowhere."""
    path = Path(path)
    out = []
    with _opened(path) as f:
        attrs = dict(f.attrs)
        for run in _run_names(f):
            group = f[f"runs/{run}"]
            try:
                card = json.loads(group.attrs.get("card", "{}"))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}: run {run!r}: card is not valid JSON ({err.msg})"
                ) from err
            out.append(_run_info(run, attrs, card, "split" in group))
    if not out:
        raise ValueError(f"{path}: no runs/<name>/plans group")
    return out


def _run_info(run: str, attrs: dict, card: dict, has_split: bool) -> PlanRunInfo:
    provenance = card.get("provenance") or {}
    params = card.get("hyperparameters") or {}
    named = _RUN_NAME.match(run)
    stage = attrs.get("stage", provenance.get("stage", named and named["stage"]))
    layer = attrs.get("layer", provenance.get("layer", named and named["layer"]))
    kind = provenance.get("kind", named["kind"] if named else "decoder")
    n_layers = attrs.get("n_layers", params.get("n_layers", named and named["n"]))
    if stage is None or layer is None:
        raise ValueError(f"run {run!r}: stage and layer are not recorded")
    return PlanRunInfo(
        run=run,
        stage=_text(stage),
        layer=int(layer),
        kind=_text(kind),
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
    with _opened(Path(path)) as f:
        return read_rows(f[f"runs/{run}/plans"], positions).astype(np.int8, copy=False)
