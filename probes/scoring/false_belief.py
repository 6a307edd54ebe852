"""Scoring against a known belief: false-belief grids (no I/O here).

On a false-belief grid (:mod:`goalprobe.gridworld.false_belief`) the prompt draws the *shown*
grid, so the agent's belief is known by construction, while the episode runs on the true grid.

**Policy against the oracle belief** (:func:`oracle_rows`, :func:`oracle_table`): per step
``opt_gt``, ``opt_oracle`` (optimal on the shown grid from the true cell) and ``opt_dec``; per
kind and role the accuracies, recoveries, chance levels and, at the first step, ``follows_shown``
/ ``follows_true``; the paired difference against the control resamples pairs.

**Does the probe decode the shown grid or the true one?** (:func:`decoded_cells`,
:func:`decoded_table`): the decoded class at the cells where they differ; the control gives the
accuracy without a conflict. Every interval is a grid bootstrap (:mod:`goalprobe.stats`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, Action, CellType, Grid, State
from goalprobe.gridworld.false_belief import (
    CONTROL,
    FALSE_BELIEF,
    KINDS,
    pair_facts,
    require_pair_facts,
)
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types
from goalprobe.probes.patching.results import read_schema_json
from goalprobe.probes.scoring.belief import (
    StepBelief,
    optimal_mask_for_pair,
    score_step,
    top_cells,
)

from goalprobe.stats import (
    Estimate,
    GridBootstrap,
    grid_bootstrap_ratio,
    is_count_rate,
    rate_difference_interval,
)

SCHEMA = "goalprobe.false_belief/1"
"""Schema of the false-belief results JSON (:class:`FalseBeliefResults`)."""


class FalseBeliefResults(TypedDict):
    """The false-belief results JSON (schema :data:`SCHEMA`): pairs, oracle behaviour table,
    decoding reading and one row per step."""

    schema: str
    config: dict[str, Any]
    pairs: list[dict[str, Any]]
    behaviour: Any
    decoding: Any
    steps: list[dict[str, Any]]
    reading: Any
    roles: dict[str, str]


ROLES: dict[str, str] = {
    "behaviour.follows_shown": "pipeline check",
    "decoding.goal": "pipeline check",
}
"""What the headline may make of each reading: the prompt shows only the drawn grid, so both
check the pipeline, neither is a finding about beliefs nor in a multiplicity family."""


def oracle_optimal_mask(grid: Grid, state: State) -> np.ndarray:
    """``(4,)`` bool: the actions optimal under ``grid.prompt_grid`` from the agent's true cell (its
    own cell never a wall, a locked door a wall, none at the shown goal)."""
    shown = grid.prompt_grid
    if shown is grid:
        return solve(grid).action_mask(state)
    walls = shown.walls.copy()
    if shown.door is not None and not state.door_open:
        walls[shown.door] = True
    walls[state.agent] = False
    return optimal_mask_for_pair(walls, state.agent, shown.goal)


def _in(action: int | None, names: Sequence[str]) -> bool:
    return action is not None and Action(action).name in names


def oracle_rows(
    episodes: Iterable,
    grids: Mapping[str, Grid],
    decoded: Mapping[tuple[str, int, int], np.ndarray | tuple] | None = None,
) -> list[dict]:
    """One row per step of ``episodes`` on false-belief grids and their controls.

    ``decoded`` maps ``(grid_id, episode, step)`` to the step's ``(S, S, len(CellType))`` class
    probabilities or ``(probs, agent, goal)`` with position read-outs; steps without one have
    ``opt_dec`` and ``decoded_goal`` None. Rows: ``{grid_id, pair_id, kind, role, episode, step,
    action, opt_gt, opt_oracle, opt_dec, decoded_goal (:func:`goal_follows`), n_opt_gt,
    n_opt_oracle, follows_shown, follows_true (first step only)}``."""
    decoded = decoded or {}
    rows = []
    for episode in episodes:
        grid = grids[episode.summary.grid_id]
        facts = require_pair_facts(grid)
        for s in episode.steps:
            action = None if s.action_enum is None else int(s.action_enum)
            true_mask = np.array([a in s.optimal_action_set for a in Action])
            oracle_mask = oracle_optimal_mask(grid, s.state)
            found = decoded.get((s.grid_id, s.episode, s.step))
            opt_dec, follows = None, None
            if found is not None:
                probs, agent, goal = found if isinstance(found, tuple) else (found, None, None)
                step = StepBelief(probs, grid.size, action, true_mask, agent=agent, goal=goal)
                opt_dec = score_step(step).opt_dec
                follows = goal_follows(grid, goal, probs)
            first = s.step == 0
            rows.append(
                {
                    "grid_id": grid.grid_id,
                    "pair_id": facts["pair_id"],
                    "kind": facts["kind"],
                    "role": facts["role"],
                    "episode": s.episode,
                    "step": s.step,
                    "action": None if action is None else Action(action).name,
                    "opt_gt": bool(action is not None and true_mask[action]),
                    "opt_oracle": bool(action is not None and oracle_mask[action]),
                    "opt_dec": opt_dec,
                    "decoded_goal": follows,
                    "n_opt_gt": int(true_mask.sum()),
                    "n_opt_oracle": int(oracle_mask.sum()),
                    "follows_shown": _in(action, facts["shown_optimal_start"]) if first else None,
                    "follows_true": _in(action, facts["true_optimal_start"]) if first else None,
                }
            )
    return rows


@dataclass(frozen=True)
class Bootstrap:
    """The grid bootstrap's settings."""

    n_resamples: int = 1000
    """Resamples of grids (pairs for a paired difference)."""
    confidence: float = 0.95
    """Interval level."""
    random_state: int = 0
    """Seed."""


def _ratio(rows: list[dict], num, boot: Bootstrap, den=None) -> dict:
    """The grid-bootstrap ratio of ``num`` (over ``den``; None: a mean) over ``rows``' grids."""
    den = None if den is None else np.asarray(den, dtype=np.float64)
    ids = np.asarray([r["grid_id"] for r in rows])
    return grid_bootstrap_ratio(np.asarray(num, dtype=np.float64), den, ids, **asdict(boot))


def _rates(rows: list[dict], boot: Bootstrap) -> dict:
    gt = np.array([r["opt_gt"] for r in rows], dtype=float)
    oracle = np.array([r["opt_oracle"] for r in rows], dtype=float)
    out = {
        "acc_gt": _ratio(rows, gt, boot),
        "acc_oracle": _ratio(rows, oracle, boot),
        "recovery_oracle": _ratio(rows, oracle * (1 - gt), boot, 1 - gt),
        "chance_acc_gt": _ratio(rows, [r["n_opt_gt"] / N_ACTIONS for r in rows], boot),
        "chance_acc_oracle": _ratio(rows, [r["n_opt_oracle"] / N_ACTIONS for r in rows], boot),
    }
    dec_rows = [r for r in rows if r["opt_dec"] is not None]
    if dec_rows:
        dec = np.array([r["opt_dec"] for r in dec_rows], dtype=float)
        d_gt = np.array([r["opt_gt"] for r in dec_rows], dtype=float)
        out["acc_dec"] = _ratio(dec_rows, dec, boot)
        out["acc_gt_decoded_steps"] = _ratio(dec_rows, d_gt, boot)
        engine = GridBootstrap.from_grid_ids([r["grid_id"] for r in dec_rows], **asdict(boot))
        diff = engine.ratio(dec) - engine.ratio(d_gt)  # paired: the same steps and draws
        out["acc_dec_minus_gt"] = {**engine.summary(diff), "n": len(dec_rows)}
        out["recovery_dec"] = _ratio(dec_rows, dec * (1 - d_gt), boot, 1 - d_gt)
        starts = [r for r in dec_rows if r["step"] == 0]
        for prefix, sub in (("", dec_rows), ("episodes_", starts)):
            for where in GOAL_FOLLOWS if sub else ():
                hit = [r["decoded_goal"] == where for r in sub]
                out[f"{prefix}decoded_goal_{where}"] = _ratio(sub, hit, boot)
    first = [r for r in rows if r["step"] == 0]
    for name in ("follows_shown", "follows_true") if first else ():
        out[name] = _ratio(first, [r[name] for r in first], boot)
    return out


def _paired_difference(rows: list[dict], field: str, boot: Bootstrap) -> dict:
    """``mean(field | false belief) - mean(field | control)`` over first steps, pairs resampled."""
    first = [r for r in rows if r["step"] == 0 and r[field] is not None]
    if not first:
        return {**Estimate(None).to_dict(), "n_pairs": 0}
    values = np.array([r[field] for r in first], dtype=float)
    fb = np.array([r["role"] == FALSE_BELIEF for r in first], dtype=float)
    engine = GridBootstrap.from_grid_ids([r["pair_id"] for r in first], **asdict(boot))
    diff = engine.ratio(values * fb, fb) - engine.ratio(values * (1 - fb), 1 - fb)
    out = {**engine.summary(diff), "n_pairs": engine.n_grids}
    if out["value"] is not None and is_count_rate(values, np.ones(len(values))):
        # a difference of two rates: Newcombe's interval from their exact cluster intervals,
        # which stays open at 100% - 0% where every paired resample is the same
        low, high = rate_difference_interval(
            engine.rate_summary(values * fb, fb), engine.rate_summary(values * (1 - fb), 1 - fb)
        )
        if low is not None:
            out.update(ci_low=low, ci_high=high, interval_method="Newcombe (hybrid score)")
    return out


def oracle_table(rows: Sequence[dict], boot: Bootstrap = Bootstrap()) -> dict:
    """Per kind (and ``"all"``): ``{"false_belief": RATES, "control": RATES, "difference":
    {"follows_shown", "follows_true"}}``, RATES mapping metric -> a grid-bootstrap estimate."""
    out = {}
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    for kind in [*kinds, "all"]:
        subset = [r for r in rows if kind == "all" or r["kind"] == kind]
        entry = {}
        for role in (FALSE_BELIEF, CONTROL):
            role_rows = [r for r in subset if r["role"] == role]
            if role_rows:
                entry[role] = _rates(role_rows, boot)
        entry["difference"] = {
            field: _paired_difference(subset, field, boot)
            for field in ("follows_shown", "follows_true")
        }
        out[kind] = entry
    return out


def decoded_cells(
    grid: Grid, probs: np.ndarray, classes: Sequence[int] | None = None
) -> list[dict]:
    """Rows ``{grid_id, pair_id, kind, role, row, col, shown, true, decoded, matches_shown,
    matches_true}`` where ``grid``'s shown and true grid differ (``probs`` at the start state)."""
    facts = pair_facts(grid)
    if facts is None or grid.shown is None:
        raise ValueError(f"grid {grid.grid_id!r} is not a false-belief grid")
    arg = _decoded_classes(probs, classes)
    shown_types = cell_types(grid.shown, grid.initial_state)
    true_types = cell_types(grid, grid.initial_state)
    return [
        _cell_row(grid, facts, tuple(cell), shown_types, true_types, arg)
        for cell in facts["differs"]
    ]


def _decoded_classes(probs: np.ndarray, classes: Sequence[int] | None) -> np.ndarray:
    probs = np.asarray(probs)
    if probs.ndim == 2:
        return probs.astype(int)
    arg = probs.argmax(axis=-1)
    return arg if classes is None else np.asarray(classes, dtype=int)[arg]


def control_cells(control: Grid, twin: Grid, probs: np.ndarray, classes=None) -> list[dict]:
    """:func:`decoded_cells` of a control at the cells where its false-belief ``twin`` differs
    (there shown == true: the probe's accuracy at those cells without a conflict)."""
    facts = pair_facts(control)
    if facts is None or control.shown is not None:
        raise ValueError(f"grid {control.grid_id!r} is not a false-belief control")
    arg = _decoded_classes(probs, classes)
    types = cell_types(control, control.initial_state)
    return [
        _cell_row(control, facts, tuple(cell), types, types, arg)
        for cell in require_pair_facts(twin)["differs"]
    ]


def _cell_row(grid, facts, cell, shown_types, true_types, arg) -> dict:
    decoded = int(arg[cell])
    return {
        "grid_id": grid.grid_id,
        "pair_id": facts["pair_id"],
        "kind": facts["kind"],
        "role": facts["role"],
        "row": int(cell[0]),
        "col": int(cell[1]),
        "shown": CellType(int(shown_types[cell])).name,
        "true": CellType(int(true_types[cell])).name,
        "decoded": CellType(decoded).name,
        "matches_shown": decoded == int(shown_types[cell]),
        "matches_true": decoded == int(true_types[cell]),
    }


def decoded_table(rows: Sequence[dict], boot: Bootstrap = Bootstrap()) -> dict:
    """Per kind and role: the share of differing cells decoded as the shown and as the true
    type (grid bootstrap), and how many cells and grids. ``"all"`` pools the kinds."""
    out = {}
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    for kind in [*kinds, "all"]:
        entry = {}
        for role in (FALSE_BELIEF, CONTROL):
            sub = [r for r in rows if (kind == "all" or r["kind"] == kind) and r["role"] == role]
            if not sub:
                continue
            entry[role] = {
                "matches_shown": _ratio(sub, [r["matches_shown"] for r in sub], boot),
                "matches_true": _ratio(sub, [r["matches_true"] for r in sub], boot),
                "neither": _ratio(
                    sub, [not (r["matches_shown"] or r["matches_true"]) for r in sub], boot
                ),
            }
        out[kind] = entry
    return out


def read_results(path: str | Path) -> dict:
    """The false_belief stage's ``results.json``; ValueError if not JSON or another schema."""
    return read_schema_json(Path(path), SCHEMA)


def goal_follows(grid: Grid, goal_readout: np.ndarray | None, probs: np.ndarray) -> str:
    """Where the top-1 decoded goal lies: ``"shown"`` (only the drawn grid's goal), ``"true"``,
    ``"both"`` or ``"neither"``."""
    cell = top_cells(probs, grid.size, CellType.GOAL, 1, goal_readout)[0]
    shown = (grid.prompt_grid.goal if grid.shown is not None else grid.goal) == cell
    true = grid.goal == cell
    return "both" if shown and true else "shown" if shown else "true" if true else "neither"


GOAL_FOLLOWS = ("shown", "true", "both", "neither")
"""The values of :func:`goal_follows`."""
