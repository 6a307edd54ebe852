"""Summaries of patching records: rates with grid-cluster bootstrap CIs, and the result files.

Per ``(kind, mode, direction, site, layers)`` cell (:func:`summarize`): the
``into_source_optimal_rate`` (the headline quantity), ``invalid_rate``,
``into_reference_optimal_rate`` (the pair's counterfactual for the ``random_grid`` control),
``action_changed_rate`` / ``stable_rate`` and ``recovered_mean``, every interval the
grid-clustered one of :func:`goalprobe.stats.grid_bootstrap_ratio`. :func:`write_results` writes
``patch_records.csv``, ``patch_summary.csv`` and ``patch_results.json`` (docs/formats.md,
"Patching results"), read back by :func:`read_records`.

**Verdicts** (:func:`anchor_verdicts`): patching the whole input (``grid`` at every block, or
``changed_cells``) moves *any* agent that acts on its input: a sanity check, never evidence of
where the agent keeps its state. Evidence is a patch of a site that does not carry the input (the
anchors), which must beat the **random-grid control** (the same target and site patched with a
random other grid, scored against the pair's counterfactual) and counts **invalid answers** on
their own, never as moved. The verdict is read from the paired difference's grid-clustered
interval (:func:`goalprobe.stats.grid_bootstrap_ratio`)."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.stats

from goalprobe.stats import Estimate, grid_bootstrap_ratio, grid_ci, json_ready

SCHEMA = "goalprobe.patching/2"
"""Schema tag of ``patch_results.json``."""

GROUP_KEYS: tuple[str, ...] = ("kind", "mode", "direction", "site", "layers")
_RATES = ("invalid", "action_changed", "into_source_optimal", "into_reference_optimal")
"""The record flags summarised as a rate with its interval."""

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
    """Field ``name`` of a record (a dict or a dataclass)."""
    return record[name] if isinstance(record, Mapping) else getattr(record, name)


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
    ci: dict[str, Any] = dict(
        n_resamples=n_resamples, confidence=confidence, random_state=random_state
    )
    out = []
    for key, group in groups.items():
        grids = np.asarray([_get(r, "grid_id") for r in group], dtype=str)
        values = {
            name: np.asarray([_get(r, name) for r in group], dtype=np.float64)
            for name in (*_RATES, "in_target_optimal", "recovered")
        }
        rates: dict[str, Any] = {}
        for name in _RATES:
            rates[f"{name}_rate"] = float(values[name].mean())
            rates[f"{name}_ci"] = grid_ci(values[name], grids, **ci)
        recovered = values["recovered"]
        defined = np.isfinite(recovered)
        out.append(
            SummaryRow(
                **dict(zip(GROUP_KEYS, key, strict=True)),
                n_runs=len(group),
                n_grids=len(set(grids.tolist())),
                n_valid=int((values["invalid"] == 0).sum()),
                **rates,
                stable_rate=float(1.0 - values["action_changed"].mean()),
                in_target_optimal_rate=float(values["in_target_optimal"].mean()),
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
        json.dumps(json_ready(bundle), indent=1, allow_nan=False), encoding="utf-8"
    )
    return paths


_CSV_FLOATS = ("ld_target", "ld_source", "ld_patched", "recovered")
_CSV_BOOLS = ("action_changed", "into_source_optimal", "in_target_optimal")


def read_schema_json(path: Path, schema: str) -> dict:
    """The JSON object at ``path``; ValueError if it is not JSON or not of ``schema``."""
    try:
        bundle = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON (line {err.lineno}): {err.msg}") from err
    if not isinstance(bundle, dict) or bundle.get("schema") != schema:
        found = bundle.get("schema") if isinstance(bundle, dict) else type(bundle).__name__
        raise ValueError(f"{path}: schema {found!r} is not {schema!r}")
    return bundle


def read_records(path: str | Path) -> list[dict]:
    """The records of ``patch_results.json`` or ``patch_records.csv`` (floats and flags restored);
    ValueError for bad JSON, another schema, no records, or a record without a ``base_id``."""
    path = Path(path)
    records: Any
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            records = [_csv_record(r) for r in csv.DictReader(fh)]
    else:
        records = read_schema_json(path, SCHEMA).get("records")
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


SANITY_SITES: frozenset[str] = frozenset({"grid", "changed_cells", "all"})
"""Sites whose all-block patch transplants the input itself: sanity checks, never verdicts."""

SANITY_THRESHOLD = 0.9
"""Share of disjoint pairs a regenerated input patch must move for the sanity check to pass."""

TEACHER_FORCED_NOTE = (
    "teacher-forced: the reasoning is held fixed, and an answer that copies the fixed "
    "reasoning's plan cannot move whatever the patch (0% even for a patched input or an agent "
    "that keeps its state there); descriptive, out of the headline"
)
"""Why a teacher-forced row is not a headline finding."""


def _rate(values, grids, boot: dict) -> dict:
    """``{value, ci_low, ci_high, n, n_grids}`` of 0/1 (or real) ``values`` by grid."""
    if len(values) == 0:
        return Estimate(None, n=0, clusters=0).to_dict()
    return grid_bootstrap_ratio(
        np.asarray(values, dtype=np.float64), None, np.asarray(grids, dtype=str), **boot
    )


def _share(records: Sequence, field: str, boot: dict) -> dict:
    """:func:`_rate` of ``field`` over ``records``, by their grids."""
    return _rate([_get(r, field) for r in records], [_get(r, "grid_id") for r in records], boot)


def anchor_verdicts(
    records: Sequence,
    *,
    layers: str = "all",
    sites: Sequence[str] | None = None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> list[dict]:
    """One verdict per site x mode x direction of the disjoint records at layer set ``layers``
    (``sites``: those judged; None: all), as the ``verdicts`` entries of docs/formats.md
    ("Patching results"): ``moved`` (into the source's optimal set), ``random_grid`` (the
    control), ``difference`` (paired, real minus random-grid), ``moved_bound`` and the rest, each
    statistic ``{value, ci_low, ci_high, n, n_grids}``. ``verdict`` is ``"yes"`` when the
    difference's interval lies above 0, ``"no"`` when not, ``"undecided"`` without a control or
    an interval, and ``"sanity check"`` at :data:`SANITY_SITES`."""
    boot = {"n_resamples": n_resamples, "confidence": confidence, "random_state": random_state}
    cells: dict[tuple, dict[str, list]] = {}
    for r in records:
        if _get(r, "layers") != layers:
            continue
        key = (_get(r, "site"), _get(r, "mode"), _get(r, "direction"))
        cells.setdefault(key, {}).setdefault(_get(r, "kind"), []).append(r)
    out = []
    for (site, mode, direction), group in sorted(cells.items()):
        disjoint = group.get("disjoint", [])
        if not disjoint or (sites is not None and site not in sites):
            continue
        random_grid = group.get("random_grid", [])
        random_by_pair = {_get(r, "pair_id"): r for r in random_grid}
        paired = [
            (r, random_by_pair[_get(r, "pair_id")])
            for r in disjoint
            if _get(r, "pair_id") in random_by_pair
        ]
        difference = _rate(
            [
                float(_get(a, "into_source_optimal")) - float(_get(b, "into_reference_optimal"))
                for a, b in paired
            ],
            [_get(a, "grid_id") for a, _ in paired],
            boot,
        )
        # the recovered logit difference of this cell's own runs (teacher-forced only)
        recovered = [r for r in disjoint if math.isfinite(float(_get(r, "recovered")))]
        entry = {
            "site": site,
            "mode": mode,
            "direction": direction,
            "layers": layers,
            "sanity_check": site in SANITY_SITES,
            "n_pairs": len(disjoint),
            "n_grids": len({_get(r, "grid_id") for r in disjoint}),
            "moved": _share(disjoint, "into_source_optimal", boot),
            "invalid": _share(disjoint, "invalid", boot),
            "random_grid": _share(random_grid, "into_reference_optimal", boot),
            "control_changed": _share(group.get("control", []), "action_changed", boot),
            "recovered": _share(recovered, "recovered", boot),
            "difference": difference,
            "moved_bound": exact_upper_bound(
                sum(bool(_get(r, "into_source_optimal")) for r in disjoint),
                len(disjoint),
                confidence,
            ),
            "headline": mode == "regenerated",
            "note": TEACHER_FORCED_NOTE if mode == "teacher_forced" else None,
        }
        entry.update(_sanity(entry))
        entry["verdict"] = _verdict(entry)
        entry["role"] = (
            "sanity check"
            if entry["sanity_check"]
            else ("verdict" if entry["headline"] else "descriptive")
        )
        out.append(entry)
    return out


def exact_upper_bound(k: int, n: int, confidence: float = 0.95) -> float | None:
    """The exact (Clopper-Pearson) upper confidence bound of a rate of ``k`` in ``n``: the largest
    rate the data do not exclude; None for ``n = 0``."""
    if n == 0:
        return None
    return float(scipy.stats.binomtest(k, n).proportion_ci(confidence, method="exact").high)


def _sanity(entry: dict) -> dict:
    """``sanity_passed`` (None unless a regenerated input patch) and ``flag`` (why it failed)."""
    if not entry["sanity_check"] or entry["mode"] != "regenerated":
        return {"sanity_passed": None, "flag": None}
    moved = entry["moved"]["value"]
    passed = moved is not None and moved >= SANITY_THRESHOLD
    flag = None
    if not passed:
        share = "no pairs" if moved is None else f"{100 * moved:.0f}%"
        flag = (
            f"sanity check failed: the input patch moved {share} of {entry['n_pairs']} pairs "
            f"(< {100 * SANITY_THRESHOLD:.0f}%): the agent does not act on its input, or the "
            "patching is broken; the other patching rows are then not evidence"
        )
    return {"sanity_passed": passed, "flag": flag}


def _verdict(entry: dict) -> str:
    if entry["sanity_check"]:
        return "sanity check"
    above = Estimate.from_dict(entry["difference"]).above(0)
    if entry["difference"]["n"] == 0 or above is None:
        return "undecided"
    return "yes" if above else "no"
