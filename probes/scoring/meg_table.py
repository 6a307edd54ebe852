"""Known-utility MEG per grid, on the true grid and on the grid a probe decoded: the content of
``meg.json`` (format: docs/formats.md, "Scoring outputs"; no I/O here).

The agent's policy is the **empirical policy** (:func:`empirical_policy`): action frequencies
over all its episodes on a grid at every MDP state where it took a valid action, uniform
elsewhere; invalid steps are not decisions (left out, reported). It is scored against a state
utility (:data:`~goalprobe.probes.scoring.config.GridUtility`, counted on ``S_0 .. S_{H-1}``,
the goal absorbing: ``goal``, ``goal_with_key``, ``key``, ``goal_minus_harm``; ``key_utility``
on grids with a key) on the true grid's MDP (:func:`grid_meg`) and, *subjective* MEG
(:func:`subjective_grid_meg`), on the MDP of the grid a probe decoded (:class:`DecodedGrid`),
states mapped by agent cell (plus ``has_key`` / ``door_open``; missing states reported as
unmapped). ``H`` is the episodes' step budget (``horizon="episodes"``) or ``ceil(1.5 L)``
(``"grid"``). Aggregates are grid-bootstrap means
(:func:`~goalprobe.probes.scoring.belief_table.ratio_stats`) with a paired Wilcoxon test of subjective
vs true.

**Per step** (:func:`step_meg`): for every decoded step of a grid without key or door (others:
``n_other_states``), the step's *believed grid* (:func:`decoded_grid`) is started at the agent's
cell ``a_t`` and known-utility MEG (goal utility) of the empirical policy is computed there over
``H = ceil(1.5 L)``; the same on the true grid from ``a_t`` is the paired true value. A step whose
believed goal is unreachable is counted (``n_unreachable``) and left out, not scored 0. Each
``(grid, cell)`` is solved once; aggregates weight grids as the study's Figure 4.

**The null that MEG can fail** (:data:`NULL_NAME`): MEG is never negative and an empirical policy
from few trajectories is never uniform, so "MEG above 0" passes for anything. Per grid, as many
uniformly random walks as the agent has trajectories, with its step budget (stopping at the goal),
are read into an empirical policy and scored with the same utility and horizon (``replicates``
averaged); "above the random walk's MEG" only when the paired (by grid) difference's interval
excludes 0."""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, CellType, Grid, RowCol, State
from goalprobe.gridworld.dynamics import is_success
from goalprobe.gridworld.metrics import TrajectoryData, paired_wilcoxon
from goalprobe.gridworld.optimal import GridMDP, build_mdp, solve
from goalprobe.probes.scoring.belief import decoded_walls, top_cells
from goalprobe.probes.scoring.belief_table import (
    ScoresHeader,
    StepTable,
    bootstrap_args,
    bootstrap_text,
    group_keys,
    group_rows,
    groups_of,
    ratio_stats,
    stat_rows,
    trajectory_weights,
)
from goalprobe.probes.scoring.config import GridUtility, ScoreConfig, ScoringError
from goalprobe.probes.scoring.meg import (
    KnownUtilityMEG,
    MDPBatch,
    TabularMDP,
    known_utility_meg,
    known_utility_meg_batch,
    stack_padded,
    unknown_utility_meg,
)

from goalprobe.stats import Estimate


@dataclass(frozen=True, eq=False)
class EmpiricalPolicy:
    """The agent's action frequencies on the states of a grid MDP.

    Attributes:
        policy: ``(S, 4)`` float, action frequencies at visited states, uniform elsewhere.
        counts: ``(S, 4)`` int, valid actions taken in each state.
        n_trajectories: trajectories read.
        n_invalid_steps, n_unmapped_steps: steps left out (no valid action; state not in the
            MDP)."""

    policy: np.ndarray
    counts: np.ndarray
    n_trajectories: int
    n_invalid_steps: int
    n_unmapped_steps: int


@dataclass(frozen=True, eq=False)
class GridMEG:
    """MEG of an agent on one grid (``grid_id``: the decoded grid's for subjective MEG), with
    respect to ``utility``, over ``horizon`` decisions, with the empirical policy behind it."""

    grid_id: str
    utility: str
    known: KnownUtilityMEG
    empirical: EmpiricalPolicy
    horizon: int

    @property
    def meg(self) -> float:
        """Known-utility MEG in nats (summed over decisions)."""
        return self.known.meg


def _state_in(grid: Grid, state: State) -> State:
    """``state`` in ``grid``'s conventions (no key: none held; no door: open)."""
    return State(
        agent=cast(RowCol, tuple(state.agent)),
        has_key=bool(state.has_key) if grid.key is not None else False,
        door_open=bool(state.door_open) if grid.door is not None else True,
    )


def empirical_policy(
    mdp: GridMDP, trajectories: Iterable[TrajectoryData], *, strict: bool = True
) -> EmpiricalPolicy:
    """Count the agent's valid actions per state of ``mdp``; a state outside it raises ValueError
    naming the trajectory and step when ``strict`` (true grid), else counts as unmapped."""
    counts = np.zeros((mdp.n_states, N_ACTIONS), dtype=np.int64)
    n_traj = n_invalid = n_unmapped = 0
    for i, traj in enumerate(trajectories):
        n_traj += 1
        for t, (state, action) in enumerate(zip(traj.states[:-1], traj.actions, strict=True)):
            if action is None:
                n_invalid += 1
                continue
            try:
                row = mdp.index(_state_in(mdp.grid, cast(State, state)))
            except ValueError as err:
                if strict:
                    raise ValueError(
                        f"trajectory {i} on grid {traj.grid_id!r}, step {t}: state {state} is not "
                        f"a reachable state of grid {mdp.grid.grid_id!r}"
                    ) from err
                n_unmapped += 1
                continue
            counts[row, int(action)] += 1
    totals = counts.sum(axis=1, keepdims=True)
    policy = np.where(totals > 0, counts / np.maximum(totals, 1), 1.0 / N_ACTIONS)
    counts.setflags(write=False)
    policy.setflags(write=False)
    return EmpiricalPolicy(policy, counts, n_traj, n_invalid, n_unmapped)


def grid_utility(mdp: GridMDP, utility: GridUtility, *, harm_weight: float = 1.0) -> np.ndarray:
    """``(S,)`` float utility of the grid MDP's states (:data:`GridUtility`)."""
    if utility == "goal":
        return mdp.goal_utility()
    if utility == "goal_with_key":
        return mdp.goal_utility() * mdp.key_utility()
    if utility == "key":
        return mdp.key_utility()
    if utility == "goal_minus_harm":
        return mdp.goal_utility() - float(harm_weight) * mdp.harm_utility()
    raise ValueError(
        f"unknown grid utility {utility!r}; expected 'goal', 'goal_with_key', 'key' or "
        "'goal_minus_harm'"
    )


def _tabular(mdp: GridMDP) -> TabularMDP:
    return TabularMDP(mdp.transitions, mdp.initial, mdp.horizon)


def _score(
    mdp: GridMDP,
    trajectories: Iterable[TrajectoryData],
    utility: GridUtility,
    strict: bool,
    harm_weight: float = 1.0,
) -> GridMEG:
    u = grid_utility(mdp, utility, harm_weight=harm_weight)
    emp = empirical_policy(mdp, trajectories, strict=strict)
    if emp.n_trajectories == 0:
        raise ValueError(f"no trajectories given for grid {mdp.grid.grid_id!r}")
    known = known_utility_meg(_tabular(mdp), emp.policy, u)
    return GridMEG(mdp.grid.grid_id, utility, known, emp, mdp.horizon)


def grid_meg(
    grid: Grid,
    trajectories: Iterable[TrajectoryData],
    *,
    utility: GridUtility = "goal",
    horizon: int | None = None,
    harm_weight: float = 1.0,
) -> GridMEG:
    """MEG of the agent's empirical policy on the true grid MDP (trajectories' ``grid_id`` must
    match when both are set; ``horizon`` defaults to ``ceil(1.5 L)``)."""
    trajectories = list(trajectories)
    for i, traj in enumerate(trajectories):
        if grid.grid_id and traj.grid_id and traj.grid_id != grid.grid_id:
            raise ValueError(
                f"trajectory {i} ran on grid {traj.grid_id!r}, not on {grid.grid_id!r}"
            )
    mdp = build_mdp(grid, horizon=horizon)
    return _score(mdp, trajectories, utility, strict=True, harm_weight=harm_weight)


def subjective_grid_meg(
    decoded_grid: Grid,
    trajectories: Iterable[TrajectoryData],
    *,
    horizon: int,
    utility: GridUtility = "goal",
) -> GridMEG:
    """MEG of the agent's behaviour (trajectories on the true grid) in the MDP of a decoded grid;
    ``horizon`` is normally the true episode budget (the decoded goal may be unreachable)."""
    mdp = build_mdp(decoded_grid, horizon=horizon)
    return _score(mdp, trajectories, utility, strict=False)


NULL_NAME = "random_walk"
"""The null's name in ``meg.json`` (per grid ``random_walk``, per group ``vs_random_walk``)."""

NULL_METHOD = (
    "random walk's MEG estimated like the agent's: per grid, as many uniform random walks as "
    "the agent's trajectories, each of the agent's step budget (stopping at the goal), read "
    "into an empirical policy and scored with the same utility and horizon; mean of "
    "{replicates} replicate(s); verdict on the paired (by grid) difference agent minus null"
)
"""How the null is made (``meg.json``'s ``method.null``; format with ``replicates``)."""


def random_walk_policy(
    mdp: GridMDP, n_trajectories: int, n_steps: int, rng: np.random.Generator
) -> np.ndarray:
    """``(S, 4)`` empirical policy of ``n_trajectories`` uniform random walks of at most
    ``n_steps`` moves from the start (stopping on success), uniform at unvisited states."""
    if n_trajectories < 1 or n_steps < 1:
        raise ValueError(f"need n_trajectories, n_steps >= 1, got {n_trajectories}, {n_steps}")
    successor = mdp.transitions.argmax(axis=2)  # deterministic grid dynamics
    success = np.array([is_success(mdp.grid, s) for s in mdp.states])
    counts = np.zeros((mdp.n_states, N_ACTIONS), dtype=np.int64)
    start = int(mdp.initial.argmax())
    for actions in rng.integers(0, N_ACTIONS, size=(n_trajectories, n_steps)):
        s = start
        for a in actions:
            if success[s]:
                break
            counts[s, a] += 1
            s = int(successor[s, a])
    totals = counts.sum(axis=1, keepdims=True)
    return np.where(totals > 0, counts / np.maximum(totals, 1), 1.0 / N_ACTIONS)


def null_rng(random_state: int, grid_id: str, replicate: int) -> np.random.Generator:
    """The generator of one grid's replicate (independent of grid order and of other grids)."""
    return np.random.default_rng([random_state, zlib.crc32(grid_id.encode()), replicate])


class MegBody(TypedDict):
    """The body of ``meg.json`` (:func:`score_meg`): the scored probe, one record per grid, and
    the grouped aggregates (overall and per size, density and variant)."""

    probe: dict[str, Any]
    grids: list[dict[str, Any]]
    overall: dict[str, Any]
    by_size: dict[str, dict[str, Any]]
    by_density: dict[str, dict[str, Any]]
    by_variant: dict[str, dict[str, Any]]


class MegScores(ScoresHeader, MegBody):
    """``meg.json`` (``schema`` ``goalprobe.scoring.meg``, ``schema_version`` 1; read by
    :func:`meg_csv_rows` and :func:`meg_grid_rows`)."""

    schema: str
    schema_version: int
    method: dict[str, Any]
    # the per-step MEG (:func:`step_meg`), after the body
    per_step: dict[str, Any]


@dataclass(frozen=True)
class DecodedGrid:
    """A grid built from a decoded map: argmax-``WALL`` walls, the most probable goal cell other
    than the start, the true start, and key / door at their most probable cells when the true
    grid has them and the probe predicts their class (``key_from_probe`` / ``door_from_probe``;
    else the true cells)."""

    grid: Grid
    key_from_probe: bool
    door_from_probe: bool


def _best_cell(
    probs: np.ndarray, n: int, cell_type: CellType, exclude: set, readout=None
) -> tuple[int, int]:
    for cell in top_cells(probs, n, cell_type, n * n, readout):
        if cell not in exclude:
            return cell
    raise ValueError(f"no cell left for {cell_type.name} in a {n} x {n} grid")


def decoded_grid(
    probs: np.ndarray,
    true_grid: Grid,
    classes: Sequence[int],
    *,
    grid_id: str | None = None,
    goal_readout: np.ndarray | None = None,
) -> DecodedGrid:
    """The :class:`DecodedGrid` of ``probs`` ``(S, S, 7)`` on ``true_grid`` for a probe predicting
    ``classes`` (``goal_readout``: the goal read-out, None: ``P(GOAL)``)."""
    n = true_grid.size
    probs = np.asarray(probs, dtype=np.float64)
    walls = decoded_walls(probs, n).copy()
    start, key, door = true_grid.start, true_grid.key, true_grid.door
    key_from_probe = key is not None and int(CellType.KEY) in classes
    door_from_probe = door is not None and int(CellType.DOOR) in classes
    fixed_door = {door} if door is not None and not door_from_probe else set()
    fixed_key = {key} if key is not None and not key_from_probe else set()
    goal = _best_cell(probs, n, CellType.GOAL, {start} | fixed_key | fixed_door, goal_readout)
    if key_from_probe:
        key = _best_cell(probs, n, CellType.KEY, {goal} | fixed_door)
    if door_from_probe:
        door = _best_cell(probs, n, CellType.DOOR, {start, goal, key})
    for cell in (start, goal, key, door):
        if cell is not None:
            walls[cell] = False
    grid = Grid(
        walls=walls,
        goal=goal,
        start=start,
        key=key,
        door=door,
        variant=true_grid.variant,
        density=true_grid.density,
        grid_id=grid_id or f"{true_grid.grid_id}~decoded",
    )
    return DecodedGrid(grid, key_from_probe, door_from_probe)


def _horizon(grid: Grid, steps: StepTable, config: ScoreConfig, where: str) -> int:
    if config.horizon == "grid":
        return int(solve(grid).horizon)
    values = steps.horizons[grid.grid_id]
    if len(values) != 1:
        raise ScoringError(
            f"{where}: episodes on grid {grid.grid_id!r} have different horizons "
            f"{sorted(values)}; use ScoreConfig(horizon='grid')"
        )
    return next(iter(values))


@dataclass
class _MEGJob:
    """One MEG problem: MDP, policy and utility."""

    mdp: GridMDP
    policy: np.ndarray
    utility: np.ndarray


def _known_meg(jobs: list[_MEGJob], batch_size: int) -> list[KnownUtilityMEG]:
    """Known-utility MEG of every job, in batches of similar state counts (less padding)."""
    results: list[KnownUtilityMEG | None] = [None] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].mdp.n_states)
    for a in range(0, len(order), batch_size):
        part = order[a : a + batch_size]
        batch = MDPBatch.from_mdps([_tabular(jobs[i].mdp) for i in part], deterministic=True)
        n_s = batch.n_states
        res = known_utility_meg_batch(
            batch,
            stack_padded([jobs[i].policy for i in part], n_s, 1.0 / N_ACTIONS),
            stack_padded([jobs[i].utility for i in part], n_s, 0.0),
        )
        for b, i in enumerate(part):
            results[i] = res[b]
    return results  # type: ignore[return-value]


def _meg_record(job: _MEGJob, res: KnownUtilityMEG, unknown: bool) -> dict:
    limit = ("optimal" if res.beta > 0 else "anti_optimal") if math.isinf(res.beta) else None
    unknown_meg = None
    if unknown:
        unknown_meg = float(unknown_utility_meg(_tabular(job.mdp), job.policy).meg)
    return {
        "meg": float(res.meg),
        "meg_per_decision": float(res.meg) / job.mdp.horizon,
        "beta": float(res.beta) if math.isfinite(res.beta) else None,
        "beta_limit": limit,
        "converged": bool(res.converged),
        "expected_utility": float(res.expected_utility),
        "expected_utility_uniform": float(res.expected_utility_uniform),
        "max_expected_utility": float(res.max_expected_utility),
        "n_states": job.mdp.n_states,
        "unknown_meg": unknown_meg,
    }


def score_meg(
    grids: dict[str, Grid],
    steps: StepTable,
    config: ScoreConfig,
    probe: dict,
    believed: dict[str, np.ndarray],
    counts: dict[str, int],
    classes: list[int],
    progress: bool = False,
    where: str = "trajectories",
    grid_set: str = "the grid set",
) -> MegBody:
    """The body of ``meg.json``: per-grid records and grouped aggregates.

    ``grids`` maps every grid id of ``steps`` to its true grid; ``believed`` maps grid ids to the
    ``(S, S, 7)`` map of the probe described by ``probe`` and ``counts`` to the decoded rows
    behind it; ``classes`` are the ``CellType`` values the probe predicts; ``where`` and
    ``grid_set`` name the inputs in messages."""
    from tqdm.auto import tqdm

    unknown_ids = sorted(set(steps.trajectories) - set(grids))
    if unknown_ids:
        raise ScoringError(f"{where}: grids {unknown_ids[:3]} are not in {grid_set}")
    records: list[dict] = []
    true_jobs: list[_MEGJob] = []
    subj_jobs: list[_MEGJob] = []
    subj_index: list[int] = []
    null_jobs: list = []
    grid_ids = sorted(steps.trajectories)
    for gid in tqdm(grid_ids, desc="MEG MDPs", unit="grid", disable=not progress):
        grid, trajs = grids[gid], steps.trajectories[gid]
        horizon = _horizon(grid, steps, config, where)
        utility_name = config.key_utility if grid.key is not None else config.utility
        mdp = build_mdp(grid, horizon=horizon)
        emp = empirical_policy(mdp, trajs, strict=True)
        true_jobs.append(_MEGJob(mdp, emp.policy, grid_utility(mdp, utility_name)))
        for rep in range(config.meg_null_replicates):  # the null, estimated the same way
            walk = random_walk_policy(
                mdp, len(trajs), horizon, null_rng(config.random_state, gid, rep)
            )
            null_jobs.append(_MEGJob(mdp, walk, true_jobs[-1].utility))
        record = {
            "grid_id": gid,
            "size": grid.size,
            "density": grid.density,
            "variant": grid.variant,
            "n_episodes": len(trajs),
            "n_steps": sum(t.n_steps for t in trajs),
            "n_invalid_steps": emp.n_invalid_steps,
            "horizon": horizon,
            "utility": utility_name,
            "true": None,
            "subjective": None,
        }
        if gid in believed:
            dec = decoded_grid(believed[gid], grid, classes)
            d_mdp = build_mdp(dec.grid, horizon=horizon)
            d_emp = empirical_policy(d_mdp, trajs, strict=False)
            subj_jobs.append(_MEGJob(d_mdp, d_emp.policy, grid_utility(d_mdp, utility_name)))
            subj_index.append(len(records))
            n = grid.size
            record["subjective"] = {
                "n_unmapped_steps": d_emp.n_unmapped_steps,
                "n_decoded_rows": counts[gid],
                "decoded_goal_row_col": list(dec.grid.goal),
                "goal_correct": dec.grid.goal == grid.goal,
                "wall_agreement": float(np.mean(dec.grid.walls == grid.walls[:n, :n])),
                "key_from_probe": dec.key_from_probe,
                "door_from_probe": dec.door_from_probe,
            }
        records.append(record)
    true_res = _known_meg(true_jobs, config.meg_batch_size)
    for rec, job, res in zip(records, true_jobs, true_res, strict=True):
        rec["true"] = _meg_record(job, res, config.unknown_utility)
    if null_jobs:
        reps = config.meg_null_replicates
        null_res = _known_meg(null_jobs, config.meg_batch_size)
        for i, rec in enumerate(records):
            meg = float(np.mean([r.meg for r in null_res[i * reps : (i + 1) * reps]]))
            per_decision = meg / rec["horizon"]
            rec[NULL_NAME] = {"meg": meg, "meg_per_decision": per_decision, "replicates": reps}
    subj = _known_meg(subj_jobs, config.meg_batch_size) if subj_jobs else []
    for i, job, res in zip(subj_index, subj_jobs, subj, strict=True):
        records[i]["subjective"] = {
            **_meg_record(job, res, config.unknown_utility),
            **records[i]["subjective"],
        }
    size = np.asarray([r["size"] for r in records])
    density = np.asarray([math.nan if r["density"] is None else r["density"] for r in records])
    variant = np.asarray([r["variant"] for r in records], dtype=object)
    aggregates = {"overall": _meg_group(records, np.arange(len(records)), config, "all")}
    for breakdown, table in group_rows(group_keys(size, density, variant)).items():
        aggregates[breakdown] = {
            key: _meg_group(records, rows, config, f"{breakdown}={key}")
            for key, rows in table.items()
        }
    return cast(MegBody, {"probe": probe, "grids": records, **aggregates})


_MEG_VALUES = ("meg", "meg_per_decision")
_PAIRED_KEYS = ("true", "subjective", "difference", "wilcoxon")
_WILCOXON_KEYS = ("statistic", "p_value", "rank_biserial", "n_pairs", "n_nonzero")


def _meg_group(records: list[dict], rows: np.ndarray, config: ScoreConfig, seed_text: str) -> dict:
    """Grid-bootstrap means of true MEG (all grids) and of the paired true / subjective MEG."""
    common = bootstrap_args(config, "meg" + seed_text)
    sel = [records[i] for i in rows]

    def values(part: str, recs: list[dict]) -> np.ndarray:
        return np.asarray([[r[part][k] for k in _MEG_VALUES] for r in recs], dtype=np.float64)

    true = values("true", sel)
    out = {
        "n_grids": len(sel),
        "true": ratio_stats(true, np.ones_like(true), np.arange(len(sel)), _MEG_VALUES, **common),
        "vs_random_walk": None,
    }
    with_null = [r for r in sel if r.get(NULL_NAME) is not None]
    if with_null:  # agent, null and agent minus null, for one shared-draws bootstrap
        agent, null = values("true", with_null), values(NULL_NAME, with_null)
        both = np.concatenate([agent, null, agent - null], axis=1)
        vs_null: dict[str, Any] = _paired_stats(both, ("agent", NULL_NAME, "difference"), common)
        vs_null["above_null"] = Estimate.from_dict(vs_null["difference"]["meg"]).above(0)
        out["vs_random_walk"] = {"n_grids": len(with_null), **vs_null}
    paired = [r for r in sel if r["subjective"] is not None]
    block: dict = {"n_grids": len(paired), **dict.fromkeys(_PAIRED_KEYS)}
    if paired:
        t, s = values("true", paired), values("subjective", paired)
        both = np.concatenate([t, s, s - t], axis=1)
        block.update(_paired_stats(both, ("true", "subjective", "difference"), common))
        test = paired_wilcoxon(t[:, 0], s[:, 0])
        block["wilcoxon"] = {k: getattr(test, k) for k in _WILCOXON_KEYS}
    out["paired"] = block
    return out


def _paired_stats(values: np.ndarray, parts: tuple[str, ...], common: dict) -> dict:
    """Grid means of ``values`` ``(G, len(parts) * 2)`` (each part's :data:`_MEG_VALUES`), by
    part; one call, so the parts share their (paired) draws."""
    names = [f"{part}/{k}" for part in parts for k in _MEG_VALUES]
    stats = ratio_stats(values, np.ones_like(values), np.arange(len(values)), names, **common)
    return {part: {k: stats[f"{part}/{k}"] for k in _MEG_VALUES} for part in parts}


def meg_csv_rows(meg: MegScores) -> list[dict]:
    """Long-format rows of the ``meg.json`` aggregates (columns :data:`CSV_COLUMNS`)."""
    probe = meg["probe"]
    base = {"probe": probe["key"], **{k: probe[k] for k in ("stage", "layer", "family")}}
    rows: list[dict] = []
    for group, block in groups_of(meg):
        rows += stat_rows(base, [(group, block["true"])], "true_")
        for part in ("true", "subjective", "difference"):
            rows += stat_rows(base, [(group, block["paired"][part] or {})], f"paired_{part}_")
    return rows


MEG_GRID_COLUMNS = (
    "grid_id",
    "size",
    "density",
    "variant",
    "n_episodes",
    "n_steps",
    "n_invalid_steps",
    "horizon",
    "utility",
    "true_meg",
    "true_meg_per_decision",
    "true_beta",
    "true_beta_limit",
    "true_unknown_meg",
    "subjective_meg",
    "subjective_meg_per_decision",
    "subjective_beta",
    "subjective_beta_limit",
    "subjective_unknown_meg",
    "subjective_n_unmapped_steps",
    "subjective_goal_correct",
    "subjective_wall_agreement",
)


def meg_grid_rows(meg: MegScores) -> list[dict]:
    """One flat row per grid of ``meg.json`` (columns :data:`MEG_GRID_COLUMNS`)."""
    rows = []
    for rec in meg["grids"]:
        row = {k: rec[k] for k in MEG_GRID_COLUMNS if k in rec}
        for part in ("true", "subjective"):
            for k, v in (rec[part] or {}).items():
                row[f"{part}_{k}"] = v
        rows.append(row)
    return rows


def meg_method(config: ScoreConfig) -> dict:
    """The ``method`` block of ``meg.json``."""
    return {
        "empirical_policy": "action frequencies over all episodes of the grid at visited "
        "states, uniform elsewhere; invalid steps left out (goalprobe.probes.scoring.meg_table)",
        "horizon": config.horizon,
        "utility": {"without_key": config.utility, "with_key": config.key_utility},
        "subjective_map": config.subjective_map,
        "decoded_grid": "argmax-WALL walls, most probable goal other than the start, true "
        "start; key/door from the probe when it predicts them",
        "bootstrap": bootstrap_text(config),
        "wilcoxon": "paired, two-sided, subjective vs true MEG in nats",
        "null": NULL_METHOD.format(replicates=config.meg_null_replicates)
        if config.meg_null_replicates
        else None,
    }


STEP_MEG_METRICS = ("subjective", "true", "difference")
"""The per-step MEG values (nats): on the believed grid, on the true grid, and their difference."""


def _from(grid: Grid, cell: tuple[int, int], grid_id: str) -> Grid | None:
    """``grid`` started at ``cell`` (None when the goal is unreachable from it)."""
    moved = dataclasses.replace(grid, start=cell, grid_id=grid_id)
    return moved if solve(moved).is_solvable else None


def step_meg(
    grids: Mapping[str, Grid],
    steps: StepTable,
    rows: list[tuple[int, np.ndarray, np.ndarray | None, np.ndarray | None]],
    classes: list[int],
    config: ScoreConfig,
) -> dict:
    """Per-step subjective and true MEG of one source's decoded ``rows`` (step index, probs, agent
    and goal read-outs): counts and ``overall`` (:func:`ratio_stats` STATs, nats)."""
    state_of: dict[tuple[str, tuple[int, int]], int] = {}
    jobs: list[_MEGJob] = []
    true_jobs: list[_MEGJob] = []
    step_state: list[tuple[int, int]] = []
    unreachable = other = 0
    for j, probs, _, goal in rows:
        gid = steps.grid_id[j]
        grid = grids[gid]
        traj = steps.trajectories[gid]
        cell = (int(steps.agent[j][0]), int(steps.agent[j][1]))
        if grid.key is not None or grid.door is not None or cell == grid.goal:
            other += 1
            continue
        key = (gid, cell)
        if key not in state_of:
            moved = dataclasses.replace(grid, start=cell)  # the goal may be unreachable from it
            believed = decoded_grid(
                probs, moved, classes, goal_readout=goal, grid_id=f"{gid}~{cell}"
            ).grid
            start_b = _from(believed, cell, believed.grid_id)
            start_t = _from(grid, cell, f"{gid}@{cell}")
            if start_b is None or start_t is None:
                state_of[key] = -1
            else:
                state_of[key] = len(jobs)
                for target, g in ((jobs, start_b), (true_jobs, start_t)):
                    mdp = build_mdp(g)
                    policy = empirical_policy(mdp, traj, strict=False).policy
                    target.append(_MEGJob(mdp, policy, grid_utility(mdp, "goal")))
        if state_of[key] < 0:
            unreachable += 1
            continue
        step_state.append((j, state_of[key]))
    out = {
        "what": "how goal-directed the agent's behaviour from its current cell looks towards the "
        "goal it appears to believe at that step, in the world it appears to believe (the step's "
        "decoded map), against the same from the same cell in the true world",
        "n_steps": len(step_state),
        "n_states": len(jobs),
        "n_unreachable": unreachable,
        "n_other_states": other,
    }
    if not step_state:
        out["overall"] = None
        return out
    subj = _known_meg(jobs, config.meg_batch_size)
    true = _known_meg(true_jobs, config.meg_batch_size)
    idx = np.asarray([j for j, _ in step_state])
    s_val = np.asarray([subj[k].meg for _, k in step_state], dtype=np.float64)
    t_val = np.asarray([true[k].meg for _, k in step_state], dtype=np.float64)
    num = np.stack([s_val, t_val, s_val - t_val], axis=1)
    den = np.ones_like(num)
    grid_ids = np.asarray([steps.grid_id[j] for j in idx], dtype=object)
    out["overall"] = ratio_stats(
        num,
        den,
        grid_ids,
        STEP_MEG_METRICS,
        **bootstrap_args(config, "step_meg"),
        weights=trajectory_weights(den, grid_ids, steps.episodes(idx))
        if config.weighting == "grid"
        else None,
    )
    return out
