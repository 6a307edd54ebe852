"""Interventions at the pre-reasoning anchors: steering along the wall probe's directions, and
trained subspace interchanges (DAS).

**Steering.** Do the wall probe's directions matter? Decodability is not use. This test edits
the anchors along the agent-centred wall probe's direction for one neighbour of the agent, lets
the agent reason again, and asks whether its action changes as the *edited* map's optimal
policy says, more often than under two controls.

Design (fixed before any outcome is seen):

* **Probe**: :class:`~goalprobe.probes.wall_test.ConditionalWallProbe` with ``frame="agent"``,
  fitted on the probing set's training grids. Its wall logit at offset ``p`` has gradient
  ``g_p = w_p / scale`` in the flattened anchors; the **direction** is ``u_p = g_p / |g_p|``.
* **Strength** (:func:`calibrate`, training rows only): ``alpha_p = k_p * gap_p``, ``gap_p`` the
  wall-minus-open gap of mean projections on ``u_p``, ``k_p`` the smallest of
  :attr:`SteeringConfig.multiples` that flips the probe's read-out on
  :attr:`SteeringConfig.flip_target` of the training rows.
* **States**: test-grid prompts in a seeded order, up to :attr:`SteeringConfig.max_states`.
* **The edited map** (:func:`choose_edits`): a neighbour of the agent whose wall toggle puts a
  non-optimal action into the optimal set; a state without one is dropped (counted).
* **Edits** at the probe's block and the pre-reasoning anchors, reasoning regenerated greedily
  (:func:`run_steering`): ``probe`` (``+/-alpha_p u_p``), ``random`` (a seeded random
  direction of the same norm), ``irrelevant`` (the probe's edit of a ring-1 cell whose toggle
  leaves the optimal set unchanged) and ``none`` (the reference).
* **Outcome**: the regenerated action is optimal on the edited map and not on the true one; with
  :attr:`SteeringConfig.require_optimal` only states whose unedited action is optimal count.
* **Statistics** (:func:`summarise`): rates with cluster-adjusted Clopper-Pearson intervals; the
  paired difference probe minus each control with its grid-bootstrap interval; ``yes`` when
  both lie above 0, ``no`` when one excludes the effect its n could detect, else ``undecided``.

**DAS.** Trained subspace interventions (distributed alignment search) at the pre-reasoning anchors
(Geiger et al. 2024, with the controls of Makelov et al. 2024). A rank-``k`` subspace with
orthonormal basis ``W`` is *interchanged*, ``h_base <- h_base + W^T W (h_cf - h_base)``, at the
three anchors of one block, and ``W`` is trained so that the patched base run produces the
counterfactual's completion (cross-entropy of its reasoning and answer, teacher-forced; the prompt
before the anchors runs once from a KV cache, the model frozen). :func:`interchange_patch`
evaluates like the patching experiment (greedy regeneration, the share of held-out disjoint pairs
moved) beside the full patch and a random subspace (:func:`random_basis`); :func:`principal_angles`
compares with the position probes' directions and :func:`natural_r2` checks that the subspace
varies with the variable on natural inputs.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.special
import torch
from goalprobe.activations.capture.base import (
    Patch,
    ResidualBackend,
    block_output,
    decoder_layers_path,
    get_submodule_path,
)
from goalprobe.agents.parser import parse_completion
from goalprobe.gridworld.core import Action, Grid, State
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.patching.experiment import PreparedPair
from goalprobe.probes.wall_test import ConditionalWallProbe, offsets, wall_inputs

from goalprobe.stats import Estimate, GridBootstrap, detectable_effect, p_from_draws

STEERING_SCHEMA = "goalprobe.steering/1"
"""``schema`` of :func:`summarise`'s result."""

CONDITIONS = ("none", "probe", "random", "irrelevant")
"""The edits of every state: none (reference), the probe's, and the two controls."""

CONTROLS = ("random", "irrelevant")
"""The edits the probe's is compared with (paired on the same states)."""

_NEIGHBOURS = {(-1, 0), (1, 0), (0, -1), (0, 1)}


@dataclass(frozen=True)
class SteeringConfig:
    """How the steering test chooses its edits and regenerates."""

    radius: int = 1
    """Chebyshev radius of the agent-centred probe's heads (1: the eight cells around A)."""
    multiples: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
    """Candidate edit strengths in units of the training rows' projection gap."""
    flip_target: float = 0.9
    """Share of training rows whose read-out the chosen strength must flip."""
    max_states: int | None = 200
    """Most test states steered (those with an edit, in a seeded order); None: every one."""
    require_optimal: bool = True
    """Count only states whose unedited action is optimal on the true map."""
    max_new_tokens: int = 256
    """Token budget of every regenerated completion."""
    batch_size: int = 64
    """Regenerations per decoding loop."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of the paired differences."""
    seed: int = 0
    """Seed of the state draw, the edits' choices and the random directions."""

    def __post_init__(self) -> None:
        if self.radius < 1:
            raise ValueError(f"radius must be >= 1, got {self.radius}")
        if (
            not self.multiples
            or any(m <= 0 for m in self.multiples)
            or list(self.multiples) != sorted(self.multiples)
        ):
            raise ValueError(f"multiples must be positive and increasing, got {self.multiples}")
        if not 0 < self.flip_target <= 1:
            raise ValueError(f"flip_target must lie in (0, 1], got {self.flip_target}")
        if self.max_states is not None and self.max_states < 1:
            raise ValueError(f"max_states must be >= 1 or None, got {self.max_states}")
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.n_bootstrap < 0:
            raise ValueError("max_new_tokens and batch_size must be >= 1, n_bootstrap >= 0")


def directions(probe: ConditionalWallProbe) -> tuple[np.ndarray, np.ndarray]:
    """``(unit (P, F), gain (P,))``: each head's direction in the (flattened) residual and the
    logit change per unit of edit along it (``|g_p|``; 0 where the head learnt nothing)."""
    grad = (np.asarray(probe.coef_) / np.asarray(probe.scale_)[:, None]).T
    gain = np.linalg.norm(grad, axis=1)
    unit = np.divide(grad, gain[:, None], out=np.zeros_like(grad), where=gain[:, None] > 0)
    return unit, gain


def calibrate(
    probe: ConditionalWallProbe, X: np.ndarray, y: np.ndarray, config: SteeringConfig
) -> dict:
    """Each head's edit strength from training rows ``X`` (:func:`wall_inputs`) and maps ``y``.

    Returns lists ``{offsets, gap, multiple, alpha, train_flip, n_rows}`` per head: the
    projection gap (wall minus open class mean), the chosen multiple, ``alpha = multiple *
    gap`` and the share of uncertain training rows whose read-out it flips (None where a head
    lacks uncertain rows of both classes or a positive gap: it is never edited).
    """
    unit, gain = directions(probe)
    acts = np.asarray(X, dtype=np.float64)[:, :-4]
    target, mask = probe.frame_targets(X, y)
    logit = probe.decision_function(X)
    proj = acts @ unit.T
    out: dict = {"gap": [], "multiple": [], "alpha": [], "train_flip": [], "n_rows": []}
    for p in range(unit.shape[0]):
        m, t = mask[:, p], target[:, p]
        ok = m.any() and t[m].any() and (~t[m]).any() and gain[p] > 0
        gap = float(proj[m & t, p].mean() - proj[m & ~t, p].mean()) if ok else None
        chosen: float | None = None
        alpha: float | None = None
        flip: float | None = None
        if gap is not None and gap > 0:
            # an edit towards the other class: -alpha on wall rows, +alpha on open rows
            sign = np.where(t[m], -1.0, 1.0)
            before = logit[m, p] > 0
            flips = [
                float(np.mean((logit[m, p] + sign * k * gap * gain[p] > 0) != before))
                for k in config.multiples
            ]  # the first multiple reaching the target, else the largest
            i = next((i for i, f in enumerate(flips) if f >= config.flip_target), len(flips) - 1)
            chosen, flip = float(config.multiples[i]), flips[i]
            alpha = float(chosen * gap)
        for key, value in zip(out, (gap, chosen, alpha, flip, int(m.sum())), strict=True):
            out[key].append(value)
    out["offsets"] = offsets(probe.radius).tolist()
    return out


@dataclass(frozen=True)
class Edit:
    """One wall toggle next to the agent: the probe ``head`` (index into :func:`offsets`), the
    ``cell`` toggled, ``add`` (True adds a wall) and the edited map's ``optimal`` actions."""

    head: int
    cell: tuple[int, int]
    add: bool
    optimal: frozenset[Action]


def toggled(grid: Grid, cell: tuple[int, int]) -> Grid:
    """``grid`` with the wall status of ``cell`` flipped (nothing else changed)."""
    walls = np.array(grid.walls, dtype=bool)
    walls[cell] = not walls[cell]
    return dataclasses.replace(grid, walls=walls, shown=None)


def choose_edits(
    grid: Grid,
    state: State,
    alpha: Sequence[float | None],
    rng: np.random.Generator,
    radius: int = 1,
) -> tuple[Edit, Edit] | str:
    """The target edit and the irrelevant-cell edit of one state (module docstring), or the
    reason it has none; ``alpha``: the calibrated strengths (None: never edited)."""
    true_opt = solve(grid).optimal_actions(state)
    if not true_opt:
        return "no optimal action (at the goal or unreachable)"
    ar, ac = state.agent
    special = {grid.goal, grid.key, grid.door, tuple(state.agent)}
    relevant: list[Edit] = []
    irrelevant: list[Edit] = []
    for p, (dr, dc) in enumerate(offsets(radius).tolist()):
        cell = (ar + dr, ac + dc)
        if max(abs(dr), abs(dc)) != 1 or alpha[p] is None or cell in special:
            continue
        if not (0 < cell[0] < grid.size - 1 and 0 < cell[1] < grid.size - 1):
            continue  # the border stays a wall
        try:
            new = solve(toggled(grid, cell)).optimal_actions(state)
        except ValueError:  # the goal unreachable once the wall is added
            continue
        if not new:
            continue
        edit = Edit(p, cell, not bool(grid.walls[cell]), new)
        if (dr, dc) in _NEIGHBOURS and new - true_opt:
            relevant.append(edit)
        elif new == true_opt:
            irrelevant.append(edit)
    if not relevant:
        return "no neighbour whose toggle makes a non-optimal action optimal"
    if not irrelevant:
        return "no irrelevant ring-1 cell"
    target = relevant[int(rng.integers(len(relevant)))]
    return target, irrelevant[int(rng.integers(len(irrelevant)))]


@dataclass(frozen=True)
class SteerState:
    """A test state to steer: its id (``run/grid/episode/step``), the true map, the state its
    prompt shows and the prompt's token ids."""

    state_id: str
    grid: Grid
    state: State
    prompt_ids: tuple[int, ...]


def steer_patch(layer: int, positions: np.ndarray, clean: torch.Tensor, delta: np.ndarray) -> Patch:
    """The edit as a patch: ``clean`` ``(K, d_model)`` plus ``delta`` (``K * d_model``, or
    ``(K, d_model)``) written into block ``layer``'s output at ``positions``; with one block,
    the residual stream there plus ``delta``."""
    shift = torch.as_tensor(np.asarray(delta), dtype=torch.float32).reshape(clean.shape)
    values = clean.float() + shift
    return Patch((int(layer),), torch.as_tensor(positions, dtype=torch.long), values[None])


def _probe_row(acts: np.ndarray, item: SteerState) -> np.ndarray:
    """``(1, F + 4)`` probe input of one state's flattened anchors ``acts``."""
    density = np.nan if item.grid.density is None else item.grid.density
    return wall_inputs(
        acts[None], np.array([item.grid.size]), np.array([density]), np.array([item.state.agent])
    )


def prepare_state(
    item: SteerState,
    probe: ConditionalWallProbe,
    calibration: dict,
    chosen: tuple[Edit, Edit],
    clean: np.ndarray,
    rng: np.random.Generator,
) -> tuple[dict, dict[str, np.ndarray]]:
    """One state's edits ``(record, {condition: delta})`` from its :func:`choose_edits` and its
    anchors ``clean (K, d_model)``; the record holds the edits, the optimal sets, the norms and
    the probe's read-out of the target cell before and after each edit."""
    flat = clean.reshape(-1)
    _, uncertain = probe.prior_proba(_probe_row(flat, item))
    alpha = calibration["alpha"]
    target, other = chosen
    unit, _ = directions(probe)
    noise = rng.standard_normal(unit.shape[1])
    deltas = {
        "none": np.zeros(unit.shape[1]),
        "probe": (1.0 if target.add else -1.0) * alpha[target.head] * unit[target.head],
        "random": noise / np.linalg.norm(noise) * alpha[target.head],
        "irrelevant": (1.0 if other.add else -1.0) * alpha[other.head] * unit[other.head],
    }
    logits = {c: probe.decision_function(_probe_row(flat + d, item)) for c, d in deltas.items()}
    read = {c: float(scipy.special.expit(z[0, target.head])) for c, z in logits.items()}
    true_opt = solve(item.grid).optimal_actions(item.state)
    record = {
        "state_id": item.state_id,
        "grid_id": item.grid.grid_id,
        "grid_size": int(item.grid.size),
        "target_offset": list(offsets(probe.radius)[target.head].tolist()),
        "target_cell": list(target.cell),
        "target_add": target.add,
        "target_uncertain": bool(uncertain[0, target.head]),
        "irrelevant_offset": list(offsets(probe.radius)[other.head].tolist()),
        "irrelevant_cell": list(other.cell),
        "irrelevant_add": other.add,
        "true_optimal": sorted(a.name for a in true_opt),
        "edited_optimal": sorted(a.name for a in target.optimal),
        "norm": {"probe": float(alpha[target.head]), "irrelevant": float(alpha[other.head])},
        "target_train_flip": calibration["train_flip"][target.head],
        "read_before": read.pop("none"),
        "read_after": read,
    }
    return record, deltas


def run_steering(
    states: Sequence[SteerState],
    backend: ResidualBackend,
    chat_format,
    probe: ConditionalWallProbe,
    calibration: dict,
    layer: int,
    config: SteeringConfig,
    *,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict], dict[str, int]]:
    """Steer every state under the four edits and regenerate.

    ``chat_format`` gives the anchors, stop ids and answer split; ``layer`` is the block the
    probe reads and the edits write. Returns ``(records, dropped)``: per steered state
    :func:`prepare_state`'s record plus ``actions``, ``invalid`` and ``success`` by condition,
    and reason -> states dropped.
    """
    dropped: Counter[str] = Counter()
    jobs: list[tuple[int, str, list[int], Patch]] = []
    records: list[dict] = []
    for index, item in enumerate(states):
        if config.max_states is not None and len(records) >= config.max_states:
            break
        rng = np.random.default_rng([config.seed, index])
        chosen = choose_edits(item.grid, item.state, calibration["alpha"], rng, probe.radius)
        if isinstance(chosen, str):
            dropped[chosen] += 1
            continue
        ids = list(item.prompt_ids)
        positions = np.asarray(chat_format.find_anchors(ids).pre_reasoning, dtype=np.int64)
        clean = backend.clean_run(ids, [layer], positions).values([layer], positions)[0]
        record, deltas = prepare_state(item, probe, calibration, chosen, clean.float().numpy(), rng)
        records.append(record)
        for condition, delta in deltas.items():
            patch = steer_patch(layer, positions, clean, delta)
            jobs.append((len(records) - 1, condition, ids, patch))
    stop_ids = list(chat_format.stop_ids)
    actions: dict[tuple[int, str], Action | None] = {}
    jobs.sort(key=lambda job: len(job[2]))  # one decoding loop per prompt length (stable)
    for _, same_length in itertools.groupby(jobs, key=lambda job: len(job[2])):
        group = list(same_length)
        for start in range(0, len(group), config.batch_size):
            chunk = group[start : start + config.batch_size]
            completions = backend.generate(
                np.asarray([j[2] for j in chunk], dtype=np.int64),
                [j[3] for j in chunk],
                max_new_tokens=config.max_new_tokens,
                stop_ids=stop_ids,
            )
            for (row, condition, _, _), ids in zip(chunk, completions, strict=True):
                cut = len(ids) >= config.max_new_tokens and not (ids and ids[-1] in stop_ids)
                split = chat_format.split_completion(ids)
                parsed = parse_completion(split.final, "length" if cut else "stop")
                actions[(row, condition)] = parsed.action
            if progress is not None:
                progress(f"steering: {len(actions)} of {len(jobs)} regenerations")
    kept = []
    for row, record in enumerate(records):
        true_opt = {Action.from_name(a) for a in record["true_optimal"]}
        edited = {Action.from_name(a) for a in record["edited_optimal"]}
        acts = {c: actions[(row, c)] for c in CONDITIONS}
        if config.require_optimal and acts["none"] not in true_opt:
            dropped["unedited action not optimal"] += 1
            continue
        record["actions"] = {c: None if a is None else a.name for c, a in acts.items()}
        record["invalid"] = {c: a is None for c, a in acts.items()}
        record["success"] = {
            c: bool(a is not None and a in edited and a not in true_opt) for c, a in acts.items()
        }
        kept.append(record)
    return kept, dict(dropped)


def paired_difference(
    first: np.ndarray, second: np.ndarray, grid_ids: np.ndarray, n_bootstrap: int, seed: int
) -> dict:
    """The mean paired difference ``first - second`` of per-state 0/1 outcomes with its grid-
    bootstrap interval, one-sided p of "above 0" (``p_draws``) and ``detectable`` effect."""
    diff = np.asarray(first, dtype=np.float64) - np.asarray(second, dtype=np.float64)
    if diff.size == 0:
        return Estimate(None, n=0).to_dict()
    boot = GridBootstrap.from_grid_ids(grid_ids, n_resamples=n_bootstrap, random_state=seed)
    draws = boot.ratio(diff)
    out = boot.summary(draws, bounds=(-1.0, 1.0))
    out["n"] = int(diff.size)
    out["n_grids"] = int(boot.n_grids)
    out["p_draws"] = p_from_draws(draws[1:]) if boot.n_resamples else None
    out["detectable"] = detectable_effect(out["ci_low"], out["ci_high"], n=boot.n_grids)
    return out


def steering_verdict(differences: dict[str, dict]) -> dict:
    """``{verdict, reason, detectable}`` from the paired differences probe minus each control:
    ``yes`` when every interval lies above 0; ``no`` when some difference's interval lies
    below the effect its n could detect; else ``undecided`` (no interval counts as that)."""
    above = [Estimate.from_dict(d).above(0) for d in differences.values()]
    if above and all(above):
        return {"verdict": "yes", "reason": "every paired interval above 0", "detectable": None}
    known = [d["detectable"] for d in differences.values() if d.get("detectable") is not None]
    for name, d in differences.items():
        est, mde = Estimate.from_dict(d), d.get("detectable")
        if not est.above(0) and mde is not None and est.below(mde):
            return {
                "verdict": "no",
                "reason": f"probe minus {name}: the interval excludes the detectable effect",
                "detectable": max(known),
            }
    return {
        "verdict": "undecided",
        "reason": "an interval reaches 0 and the detectable effect",
        "detectable": max(known) if known else None,
    }


def summarise(records: Sequence[dict], dropped: dict[str, int], config: SteeringConfig) -> dict:
    """Rates, paired differences and the verdict of steered records (JSON-ready).

    Returns ``{n_states, n_grids, dropped, rates, invalid, differences, tested, verdict,
    reason, detectable, read_flip, target_train_flip}``: rates by condition (cluster-adjusted
    Clopper-Pearson), paired differences by control, ``tested`` the one with the lower interval
    end (with the larger p), ``read_flip`` the share of states whose read-out of the target
    cell crossed 1/2 under each edit.
    """
    ids = np.asarray([r["grid_id"] for r in records]).astype(str)
    out: dict = {"n_states": len(records), "n_grids": int(np.unique(ids).size)}
    out["dropped"] = dict(sorted(dropped.items()))
    if not records:
        out.update(rates={}, invalid={}, differences={}, tested=None, read_flip={})
        out.update(verdict="undecided", reason="no state kept", detectable=None)
        return out
    boot = GridBootstrap.from_grid_ids(ids, n_resamples=0)
    success = {c: np.array([r["success"][c] for r in records], dtype=float) for c in CONDITIONS}
    invalid = {c: np.array([r["invalid"][c] for r in records], dtype=float) for c in CONDITIONS}
    out["rates"] = {c: boot.rate_summary(v) for c, v in success.items()}
    out["invalid"] = {c: boot.rate_summary(v) for c, v in invalid.items()}
    out["differences"] = {
        c: paired_difference(success["probe"], success[c], ids, config.n_bootstrap, config.seed)
        for c in CONTROLS
    }
    tested_name = min(CONTROLS, key=lambda c: _low(out["differences"][c]))
    tested = dict(out["differences"][tested_name], control=tested_name)
    ps = [out["differences"][c].get("p_draws") for c in CONTROLS]
    tested["p_draws"] = None if None in ps else max(ps)  # intersection-union: both must hold
    out["tested"] = tested
    # the calibration's check on the test states: the probe's read-out of the target cell
    # crosses 1/2 (only where the prior leaves the cell uncertain: elsewhere it is the prior's)
    checked = [r for r in records if r["target_uncertain"]]

    def flipped(c: str) -> list[bool]:
        return [(r["read_after"][c] > 0.5) != (r["read_before"] > 0.5) for r in checked]

    out["read_flip"] = {c: float(np.mean(flipped(c))) if checked else None for c in CONDITIONS[1:]}
    out["read_flip"]["n"] = len(checked)
    out.update(steering_verdict(out["differences"]))
    # an edit that cannot move the probe's own read-out tests no direction: not a "no"
    out["target_train_flip"] = float(np.mean([r["target_train_flip"] for r in records]))
    if out["verdict"] == "no" and out["target_train_flip"] < config.flip_target:
        out["verdict"] = "undecided"
        out["reason"] = (
            f"the edit flips the probe's own read-out on {out['target_train_flip']:.0%} of its "
            f"training rows (target {config.flip_target:.0%}, up to "
            f"{max(config.multiples):g}x the class gap): no direction to test"
        )
    return out


def _low(d: dict) -> float:
    low = d.get("ci_low")
    return -np.inf if low is None else float(low)


def fit_probe(
    acts: np.ndarray,
    cell_types: np.ndarray,
    grid_sizes: np.ndarray,
    densities: np.ndarray,
    agent_row_col: np.ndarray,
    grid_ids: np.ndarray,
    config: SteeringConfig,
) -> tuple[ConditionalWallProbe, dict]:
    """The agent-frame wall probe fitted on training rows and its :func:`calibrate`."""
    X = wall_inputs(acts, grid_sizes, densities, agent_row_col)
    probe = ConditionalWallProbe(frame="agent", radius=config.radius, random_state=config.seed)
    probe.fit(X, cell_types, np.asarray(grid_ids).astype(str))
    return probe, calibrate(probe, X, cell_types, config)


def draw_states(
    states: Sequence[SteerState], test_grids: Sequence[str], seed: int
) -> list[SteerState]:
    """The states of ``test_grids`` in a seeded random order."""
    keep = set(test_grids)
    pool = [s for s in states if s.grid.grid_id in keep]
    order = np.random.default_rng(seed).permutation(len(pool))
    return [pool[i] for i in order]


def steering_test(
    train: dict,
    states: Sequence[SteerState],
    backend: ResidualBackend,
    chat_format,
    layer: int,
    config: SteeringConfig,
    *,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict, list[dict]]:
    """Fit and calibrate the probe on the training rows, steer the test states, summarise.

    ``train``: the training rows' ``acts (N, K, d_model)`` at ``layer``, ``cell_types``,
    ``grid_sizes``, ``densities``, ``agent_row_col`` and ``grid_ids``; ``states`` in the order
    to steer (:func:`draw_states`). Returns ``(result, records)``: :func:`summarise`'s result
    with the schema, layer, config, calibration and training size; the per-state records.
    Raises ValueError when a test state's grid is a training grid.
    """
    train_grids = set(np.asarray(train["grid_ids"]).astype(str).tolist())
    leaked = sorted({s.grid.grid_id for s in states} & train_grids)
    if leaked:
        raise ValueError(f"test states on training grids (split by grid): {leaked[:3]}")
    probe, calibration = fit_probe(
        train["acts"], train["cell_types"], train["grid_sizes"], train["densities"],
        train["agent_row_col"], train["grid_ids"], config,
    )  # fmt: skip
    records, dropped = run_steering(
        states, backend, chat_format, probe, calibration, layer, config, progress=progress
    )
    result = {
        "schema": STEERING_SCHEMA,
        "layer": int(layer),
        "config": dataclasses.asdict(config),
        "n_train_rows": int(len(train["grid_ids"])),
        "n_train_grids": len(train_grids),
        "n_states_offered": len(states),
        "calibration": calibration,
        "probe_alpha": np.asarray(probe.alpha_, dtype=np.float64).reshape(-1).tolist(),
        **summarise(records, dropped, config),
    }
    return result, records


@dataclass(frozen=True)
class DasConfig:
    """How to train a subspace."""

    block: int = 2
    """The decoder block whose output is interchanged at the anchors."""
    rank: int = 1
    """The subspace's dimension ``k``."""
    steps: int = 30
    """Passes over the training pairs."""
    learning_rate: float = 0.02
    """Adam's step size."""
    seed: int = 0
    """The initial basis's seed."""

    def __post_init__(self) -> None:
        if self.rank < 1 or self.steps < 1 or self.learning_rate <= 0:
            raise ValueError("rank and steps must be >= 1 and learning_rate > 0")


def anchors(pair: PreparedPair) -> np.ndarray:
    """The base's three pre-reasoning anchor positions (the prompt's last three tokens)."""
    return np.asarray(pair.base.sequence.anchors.pre_reasoning, dtype=np.int64)


def anchor_values(pair: PreparedPair, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h_base, h_cf)``, each ``(3, d_model)``: both sides' clean block output at the
    anchors (the prompts align, so the positions are the same)."""
    where = anchors(pair)
    return (
        pair.base.clean.values([block], where)[0].float(),
        pair.cf.clean.values([block], where)[0].float(),
    )


def interchange(h_base: torch.Tensor, h_cf: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``h_base + (h_cf - h_base) W^T W`` for a basis ``W`` (``k x d``, orthonormal rows)."""
    return h_base + (h_cf - h_base) @ basis.T @ basis


def random_basis(d_model: int, rank: int, seed: int) -> torch.Tensor:
    """``(rank, d_model)`` orthonormal rows spanning a uniformly random subspace (seeded)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d_model, rank)))
    return torch.as_tensor(q.T, dtype=torch.float32)


def interchange_patch(pair: PreparedPair, block: int, basis: torch.Tensor | None) -> Patch:
    """The anchors of ``pair``'s base run with the subspace interchanged (``basis`` None: the
    full patch, every direction)."""
    h_base, h_cf = anchor_values(pair, block)
    values = h_cf if basis is None else interchange(h_base, h_cf, basis)
    return Patch((block,), torch.as_tensor(anchors(pair)), values[None])


def _training_items(pairs: Sequence[PreparedPair], block: int):
    """Per pair: ``(prefix ids, suffix ids, first loss row, h_base, h_cf)``."""
    items = []
    for pair in pairs:
        prompt = np.asarray(pair.base.prompt_ids, dtype=np.int64)
        ids = np.concatenate([prompt, np.asarray(pair.cf.completion_ids, dtype=np.int64)])
        start = int(anchors(pair)[0])
        first = len(prompt) - 1 - start  # the suffix row predicting the first completion token
        h_base, h_cf = anchor_values(pair, block)
        items.append((ids[:start], ids[start:], first, h_base, h_cf))
    return items


def train_subspace(
    pairs: Sequence[PreparedPair],
    backend: ResidualBackend,
    config: DasConfig,
    *,
    progress=None,
) -> tuple[torch.Tensor, list[float]]:
    """Train ``W`` on ``pairs`` with the hooks backend's model frozen; returns ``(basis (rank,
    d_model), mean loss per step)``."""
    from goalprobe.activations.capture.gradients import gradient_mode

    if not pairs:
        raise ValueError("no training pairs")
    torch.manual_seed(config.seed)
    layer = torch.nn.Linear(backend.d_model, config.rank, bias=False)
    torch.nn.utils.parametrizations.orthogonal(layer)
    optimizer = torch.optim.Adam(layer.parameters(), lr=config.learning_rate)
    items = _training_items(pairs, config.block)
    blocks = get_submodule_path(backend.model, decoder_layers_path(backend.model))
    block = blocks[config.block]  # type: ignore[index]
    current: dict[str, torch.Tensor] = {}

    def hook(module, args, output):
        hidden = block_output(output)
        if hidden.shape[1] < 3 or "basis" not in current:
            return None
        own = hidden[0, :3]
        mixed = interchange(own, current["cf"].to(own.dtype), current["basis"].to(own.dtype))
        new = torch.cat([mixed[None], hidden[:, 3:]], dim=1)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    handle = block.register_forward_hook(hook)
    losses: list[float] = []
    try:
        with gradient_mode(backend.model):
            for step in range(config.steps):
                optimizer.zero_grad()
                total = 0.0
                for prefix, suffix, first, _, h_cf in items:
                    current["basis"] = layer.weight
                    current["cf"] = h_cf
                    cache = backend._prefix_kv(prefix, 1)
                    logits = backend.model(
                        torch.as_tensor(suffix, device=backend.device)[None],
                        **{backend.cache_keyword(): cache, "use_cache": True},
                    ).logits[0]
                    targets = torch.as_tensor(suffix[first + 1 :], device=logits.device)
                    loss = torch.nn.functional.cross_entropy(logits[first:-1].float(), targets)
                    (loss / len(items)).backward()
                    total += float(loss.detach())
                    current.clear()
                optimizer.step()
                losses.append(total / len(items))
                if progress is not None:
                    progress(step, config.steps, losses[-1])
    finally:
        handle.remove()
        current.clear()
    return layer.weight.detach().clone(), losses


def principal_angles(basis: torch.Tensor | np.ndarray, directions: np.ndarray) -> np.ndarray:
    """Principal angles (degrees, ascending) between the row space of ``basis`` and the span
    of ``directions`` (rows: e.g. the position probes' weight vectors)."""
    import scipy.linalg

    a = np.asarray(basis, dtype=np.float64).T
    b = np.asarray(directions, dtype=np.float64).T
    return np.sort(np.degrees(scipy.linalg.subspace_angles(a, b)))


def natural_r2(
    activations: np.ndarray,
    labels: np.ndarray,
    basis: torch.Tensor | np.ndarray,
    *,
    folds: int = 5,
    seed: int = 0,
) -> float:
    """Cross-validated R^2 of the subspace coordinates of natural ``activations (N, d)``
    predicted from one-hot categorical ``labels (N, m)`` (e.g. the agent's and goal's rows and
    columns): near 0 for a subspace that does not vary with the variable."""
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import KFold, cross_val_predict
    from sklearn.preprocessing import OneHotEncoder

    z = np.asarray(activations, dtype=np.float64) @ np.asarray(basis, dtype=np.float64).T
    x = OneHotEncoder(handle_unknown="ignore").fit_transform(np.asarray(labels))
    predicted = cross_val_predict(
        Ridge(alpha=1.0), x, z, cv=KFold(folds, shuffle=True, random_state=seed)
    ).reshape(z.shape)
    residual = ((z - predicted) ** 2).sum()
    total = ((z - z.mean(axis=0)) ** 2).sum()
    return float(1.0 - residual / total) if total > 0 else float("nan")
