"""What patching says about a site: the headline's verdicts, computed from the records.

Patching the whole input (``grid`` at every block, or ``changed_cells``) moves *any* agent that
acts on its input: a sanity check, never evidence of where the agent keeps its state. Evidence is
a patch of a site that does not carry the input (the anchors), which must beat the **random-grid
control** (the same target and site patched with a random other grid, scored against the pair's
counterfactual) and counts **invalid answers** on their own, never as moved.
:func:`anchor_verdicts` reports these shares and the paired difference whose grid-clustered
interval (:func:`goalprobe.stats.grid_bootstrap_ratio`) decides the verdict."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import scipy.stats

from goalprobe.stats import Estimate, grid_bootstrap_ratio

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


def _get(record, name):
    return record[name] if isinstance(record, Mapping) else getattr(record, name)


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
        grids = [_get(r, "grid_id") for r in disjoint]
        random_grid = group.get("random_grid", [])
        control = group.get("control", [])
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
            "n_grids": len(set(grids)),
            "moved": _share(disjoint, "into_source_optimal", boot),
            "invalid": _share(disjoint, "invalid", boot),
            "random_grid": _share(random_grid, "into_reference_optimal", boot),
            "control_changed": _share(control, "action_changed", boot),
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
