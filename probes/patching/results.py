"""Summaries of patching records: rates with grid-cluster bootstrap CIs, and the result files.

Per ``(kind, mode, direction, site, layers)`` cell (:func:`summarize`): the
``into_source_optimal_rate`` (the headline quantity), ``invalid_rate``,
``into_reference_optimal_rate`` (the pair's counterfactual for the ``random_grid`` control),
``action_changed_rate`` / ``stable_rate`` and ``recovered_mean``, every interval the
grid-clustered one of :func:`goalprobe.stats.grid_bootstrap_ratio`. :func:`write_results` writes
``patch_records.csv``, ``patch_summary.csv`` and ``patch_results.json`` (docs/formats.md,
"Patching results"), read back by :func:`read_records`."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.probes.serialization import _json_ready

from goalprobe.stats import grid_ci

SCHEMA = "goalprobe.patching/2"
"""Schema tag of ``patch_results.json``."""

GROUP_KEYS: tuple[str, ...] = ("kind", "mode", "direction", "site", "layers")

PAIRS_FILE = "patch_pairs.jsonl"
"""File name of the kept pairs beside the results."""


@dataclass(frozen=True)
class SummaryRow:
    """One cell of the results table: the cell's keys, ``n_runs`` (from ``n_grids`` grids),
    ``n_valid`` (answers naming an action), each rate with its ``(low, high)`` CI, ``stable_rate
    = 1 - action_changed_rate`` and ``recovered_mean`` with its CI over the ``n_recovered`` runs
    where it is defined (NaN when none is)."""

    kind: str
    mode: str
    direction: str
    site: str
    layers: str
    n_runs: int
    n_grids: int
    n_valid: int
    invalid_rate: float
    invalid_ci: tuple[float, float]
    action_changed_rate: float
    action_changed_ci: tuple[float, float]
    stable_rate: float
    into_source_optimal_rate: float
    into_source_optimal_ci: tuple[float, float]
    into_reference_optimal_rate: float
    into_reference_optimal_ci: tuple[float, float]
    in_target_optimal_rate: float
    recovered_mean: float
    recovered_ci: tuple[float, float]
    n_recovered: int


def _get(record, name):
    return record[name] if isinstance(record, dict) else getattr(record, name)


def summarize(
    records: Sequence,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> list[SummaryRow]:
    """Aggregate :class:`~goalprobe.probes.patching.patched_runs.PatchRecord` (or dicts) by cell."""
    groups: dict[tuple, list] = {}
    for record in records:
        groups.setdefault(tuple(_get(record, k) for k in GROUP_KEYS), []).append(record)
    out = []
    for key, group in groups.items():
        grids = np.asarray([_get(r, "grid_id") for r in group], dtype=str)
        changed = np.asarray([_get(r, "action_changed") for r in group], dtype=np.float64)
        into = np.asarray([_get(r, "into_source_optimal") for r in group], dtype=np.float64)
        invalid = np.asarray([_get(r, "invalid") for r in group], dtype=np.float64)
        into_ref = np.asarray([_get(r, "into_reference_optimal") for r in group], dtype=np.float64)
        in_target = np.asarray([_get(r, "in_target_optimal") for r in group], dtype=np.float64)
        recovered = np.asarray([_get(r, "recovered") for r in group], dtype=np.float64)
        defined = np.isfinite(recovered)
        ci: dict[str, Any] = dict(
            n_resamples=n_resamples, confidence=confidence, random_state=random_state
        )
        out.append(
            SummaryRow(
                **dict(zip(GROUP_KEYS, key, strict=True)),
                n_runs=len(group),
                n_grids=len(set(grids.tolist())),
                n_valid=int((invalid == 0).sum()),
                invalid_rate=float(invalid.mean()),
                invalid_ci=grid_ci(invalid, grids, **ci),
                action_changed_rate=float(changed.mean()),
                action_changed_ci=grid_ci(changed, grids, **ci),
                stable_rate=float(1.0 - changed.mean()),
                into_source_optimal_rate=float(into.mean()),
                into_source_optimal_ci=grid_ci(into, grids, **ci),
                into_reference_optimal_rate=float(into_ref.mean()),
                into_reference_optimal_ci=grid_ci(into_ref, grids, **ci),
                in_target_optimal_rate=float(in_target.mean()),
                recovered_mean=float(recovered[defined].mean()) if defined.any() else math.nan,
                recovered_ci=grid_ci(recovered[defined], grids[defined], **ci)
                if defined.any()
                else (math.nan, math.nan),
                n_recovered=int(defined.sum()),
            )
        )
    return sorted(out, key=lambda r: (r.kind, r.mode, r.direction, r.site, _layer_order(r.layers)))


def _layer_order(label: str) -> tuple:
    """Single layers, then first-k and last-k sets by k, then other sets, then ``all``."""
    if label == "all":
        return (4, 0, label)
    for rank, prefix in ((1, "first"), (2, "last")):
        if label.startswith(prefix) and label[len(prefix) :].isdigit():
            return (rank, int(label[len(prefix) :]), label)
    if label.lstrip("-").isdigit():
        return (0, int(label), label)
    return (3, 0, label)


def _flat(row: dict) -> dict:
    out = {}
    for key, value in row.items():
        if isinstance(value, (list, tuple)):
            if key.endswith("_ci"):
                out[f"{key}_low"], out[f"{key}_high"] = value
            else:
                out[key] = " ".join(str(v) for v in value)
        else:
            out[key] = value
    return out


def _write_csv(path: Path, rows: list[dict]) -> None:
    flat = [_flat(r) for r in rows]
    with path.open("w", newline="", encoding="utf-8") as handle:
        if not flat:
            return
        writer = csv.DictWriter(handle, fieldnames=list(flat[0]))
        writer.writeheader()
        writer.writerows(flat)


def write_results(
    out_dir: str | os.PathLike,
    records: Sequence,
    summary: Sequence[SummaryRow],
    meta: dict,
) -> dict[str, Path]:
    """Write the records, the :func:`summarize` rows and the JSON bundle (``meta`` kept in it) into
    ``out_dir``; returns name -> path of every file written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record_dicts = [r if isinstance(r, dict) else asdict(r) for r in records]
    summary_dicts = [asdict(r) for r in summary]
    paths = {
        "records_csv": out / "patch_records.csv",
        "summary_csv": out / "patch_summary.csv",
        "results_json": out / "patch_results.json",
    }
    _write_csv(paths["records_csv"], record_dicts)
    _write_csv(paths["summary_csv"], summary_dicts)
    bundle = {"schema": SCHEMA, **meta, "summary": summary_dicts, "records": record_dicts}
    paths["results_json"].write_text(
        json.dumps(_json_ready(bundle), indent=1, allow_nan=False), encoding="utf-8"
    )
    return paths


_CSV_FLOATS = ("ld_target", "ld_source", "ld_patched", "recovered")
_CSV_BOOLS = ("action_changed", "into_source_optimal", "in_target_optimal")


def read_records(path: str | Path) -> list[dict]:
    """The records of ``patch_results.json`` or ``patch_records.csv`` (floats and flags restored);
    ValueError for bad JSON, another schema, no records, or a record without a ``base_id``."""
    path = Path(path)
    records: Any
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            records = [_csv_record(r) for r in csv.DictReader(fh)]
    else:
        try:
            bundle = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON (line {err.lineno}): {err.msg}") from err
        if not isinstance(bundle, dict) or bundle.get("schema") != SCHEMA:
            found = bundle.get("schema") if isinstance(bundle, dict) else type(bundle).__name__
            raise ValueError(f"{path}: schema {found!r} is not {SCHEMA!r}")
        records = bundle.get("records")
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected an object with a list of 'records'")
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("base_id"), str):
            raise ValueError(f"{path}: record {i} has no string field 'base_id'")
    return records


def _csv_record(row: dict) -> dict:
    out: dict = dict(row)
    for name in _CSV_FLOATS:
        if name in out:
            out[name] = float(out[name]) if out[name] not in ("", None) else math.nan
    for name in _CSV_BOOLS:
        if name in out:
            out[name] = str(out[name]).lower() == "true"
    return out
