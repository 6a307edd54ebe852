"""Behavioural metrics of an agent in the grid world (study, section 4 and appendix B).

Everything here works on :class:`TrajectoryData` (plain data; optimal action sets are inputs)
and imports no torch. The key metrics of key-door grids (section 4.3, Table 1: accuracy per
sub-task, key pickup rate, key attraction bias) need states with ``has_key`` and ``door_open``
(``core.State``). Conventions: a trajectory of ``T`` steps
has states ``s_0 .. s_T`` and actions ``a_0 .. a_{T-1}``; ``actions[t] is None`` marks an
invalid step, never optimal, and a fifth policy outcome ``INVALID`` to which ``pi*`` gives 0;
entropy and JSD are in nats unless ``base`` is given; a metric over no data is ``math.nan``
(only :func:`grid_metrics` refuses an empty list), and bad data raises ``ValueError`` naming
grid, field and step.

Paired grids (study, appendix D; section 4.3): the overlap of two trajectories
(:func:`jaccard_similarity`) and the Wilcoxon signed-rank test of per-grid metrics on base and
transformed grids matched by base grid id (:func:`paired_wilcoxon`: zero differences dropped,
Wilcoxon's original test; the matched-pairs rank-biserial correlation as effect size).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import index
from typing import Any

import numpy as np
import scipy.stats
from goalprobe.gridworld.core import N_ACTIONS, RowCol
from scipy.special import rel_entr

INVALID = N_ACTIONS
"""Column of the invalid-step outcome in policy arrays (after the four actions)."""

N_OUTCOMES = N_ACTIONS + 1
"""Number of policy outcomes: the four actions plus ``INVALID``."""

ECE_BINS = 10
"""Number of equal-width confidence bins of the expected calibration error (study: M = 10)."""


@dataclass(frozen=True, kw_only=True)
class TrajectoryData:
    """One rollout as plain data."""

    grid_id: str
    """The grid the trajectory was run on; grid-level metrics group by it."""
    states: tuple[Hashable, ...]
    """``T + 1`` hashable states ``s_0 .. s_T``; the last is the state after the last action. Key
    metrics need states with ``has_key`` / ``door_open`` attributes
    (:class:`goalprobe.gridworld.core.State`)."""
    actions: tuple[int | None, ...]
    """``T`` actions (``Action`` or int in 0..3), ``None`` for an invalid step."""
    optimal_sets: tuple[frozenset[int], ...]
    """``T`` non-empty sets of optimal actions, ``optimal_sets[t] = pi*(s_t)``."""
    success: bool
    """Whether the trajectory ended at the goal (``s_T = s_goal``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.grid_id, str):
            raise ValueError(f"grid_id must be a str, got {type(self.grid_id).__name__}")
        where = f"trajectory on grid {self.grid_id!r}"
        states = tuple(self.states)
        actions = tuple(
            _parse_action(a, f"{where}: actions[{t}]") for t, a in enumerate(self.actions)
        )
        optimal = tuple(
            _parse_optimal(o, f"{where}: optimal_sets[{t}]")
            for t, o in enumerate(self.optimal_sets)
        )
        if len(states) != len(actions) + 1:
            raise ValueError(
                f"{where}: states must have len(actions) + 1 = {len(actions) + 1} entries "
                f"(s_0 .. s_T), got {len(states)}"
            )
        if len(optimal) != len(actions):
            raise ValueError(
                f"{where}: optimal_sets must have one entry per action ({len(actions)}), "
                f"got {len(optimal)}"
            )
        for t, s in enumerate(states):
            try:
                hash(s)
            except TypeError as err:
                raise ValueError(f"{where}: state {t} is not hashable: {s!r}") from err
        if not isinstance(self.success, bool | np.bool_):
            raise ValueError(f"{where}: success must be a bool, got {self.success!r}")
        object.__setattr__(self, "states", states)
        object.__setattr__(self, "actions", actions)
        object.__setattr__(self, "optimal_sets", optimal)
        object.__setattr__(self, "success", bool(self.success))

    @property
    def n_steps(self) -> int:
        """Number of steps ``T`` (actions taken, invalid ones included)."""
        return len(self.actions)


def _parse_action(action: Any, where: str) -> int | None:
    if action is None:
        return None
    try:
        value = index(action)
    except TypeError as err:
        raise ValueError(
            f"{where} must be an action (int in 0..3) or None, got {action!r}"
        ) from err
    if isinstance(action, bool) or not 0 <= value < N_ACTIONS:
        raise ValueError(f"{where} must be an action (int in 0..3) or None, got {action!r}")
    return value


def _parse_optimal(actions: Iterable[int], where: str) -> frozenset[int]:
    try:
        parsed = frozenset(_parse_action(a, f"an element of {where}") for a in actions)
    except TypeError as err:
        raise ValueError(f"{where} must be a set of actions, got {actions!r}") from err
    if not parsed or None in parsed:
        raise ValueError(
            f"{where} must be a non-empty set of actions (ints in 0..3), got {actions!r}"
        )
    return parsed  # type: ignore[return-value]


def optimal_mask(trajectory: TrajectoryData) -> np.ndarray:
    """``(T,)`` bool, ``mask[t] = a_t in pi*(s_t)`` (invalid steps are not optimal)."""
    return np.array(
        [
            a is not None and a in opt
            for a, opt in zip(trajectory.actions, trajectory.optimal_sets, strict=True)
        ],
        dtype=bool,
    )


def group_by_grid(trajectories: Iterable[TrajectoryData]) -> dict[str, list[TrajectoryData]]:
    """Trajectories grouped by ``grid_id``, in order of first appearance."""
    groups: dict[str, list[TrajectoryData]] = defaultdict(list)
    for traj in trajectories:
        groups[traj.grid_id].append(traj)
    return dict(groups)


def _single_grid(trajectories: Iterable[TrajectoryData]) -> list[TrajectoryData]:
    trajs = list(trajectories)
    grid_ids = sorted({t.grid_id for t in trajs})
    if len(grid_ids) > 1:
        raise ValueError(
            f"grid-level metric got trajectories of {len(grid_ids)} grids ({grid_ids[:5]}...); "
            "group them first with group_by_grid or use metrics_by_grid"
        )
    return trajs


def goal_success_rate(trajectories: Iterable[TrajectoryData]) -> float:
    """GSR: the fraction of trajectories that ended at the goal (eq. 1); NaN when none."""
    flags = [t.success for t in trajectories]
    return float(np.mean(flags)) if flags else math.nan


def trajectory_accuracy(trajectory: TrajectoryData) -> float:
    """Per-action accuracy ``Acc(tau) = (1/T) sum_t 1(a_t in pi*(s_t))`` (eq. 2); invalid steps
    count as not optimal; NaN for a trajectory with no steps."""
    mask = optimal_mask(trajectory)
    return float(mask.mean()) if mask.size else math.nan


def grid_accuracy(trajectories: Iterable[TrajectoryData]) -> float:
    """Grid-level accuracy: the mean of trajectory accuracies over the N trajectories (eq. 3);
    NaN when there are none or any has no steps (its accuracy is undefined)."""
    accs = [trajectory_accuracy(t) for t in _single_grid(trajectories)]
    return float(np.mean(accs)) if accs else math.nan


@dataclass(frozen=True, eq=False)
class PolicyTable:
    """Empirical agent policy and optimal policy at every visited state of one grid.

    Visited states are the unique states at which an action (or invalid step) was taken in any
    trajectory; a final state ``s_T`` where no action was taken has no policy and is not listed."""

    states: tuple[Hashable, ...]
    """``S`` visited states, in order of first visit."""
    counts: np.ndarray
    """``(S, 5)`` int64, how often each outcome (4 actions, then ``INVALID``) was taken."""
    optimal: np.ndarray
    """``(S, 5)`` float64, ``pi*(. | s)``: uniform over the optimal set, 0 on ``INVALID``."""

    @property
    def policy(self) -> np.ndarray:
        """``(S, 5)`` float64, ``pi_theta(. | s)``: counts over all trajectories, normalised."""
        return self.counts / self.counts.sum(axis=1, keepdims=True)

    def entropy(self, *, base: float = math.e) -> np.ndarray:
        """``(S,)`` float64, ``H(pi_theta(. | s))`` per visited state."""
        return np.asarray(scipy.stats.entropy(self.policy, base=base, axis=1), dtype=float)

    def jsd(self, *, base: float = math.e) -> np.ndarray:
        """``(S,)`` float64, ``JSD(pi_theta(. | s) || pi*(. | s))`` per visited state."""
        p, q = self.policy, self.optimal
        m = (p + q) / 2
        jsd = (rel_entr(p, m).sum(axis=1) + rel_entr(q, m).sum(axis=1)) / 2 / math.log(base)
        return np.clip(jsd, 0.0, math.log(2) / math.log(base))


def policy_table(trajectories: Iterable[TrajectoryData]) -> PolicyTable:
    """Count actions per visited state over all trajectories of one grid.

    Raises ``ValueError`` when two steps at the same state disagree on its optimal set, or when
    the trajectories come from more than one grid.
    """
    index_of: dict[Hashable, int] = {}
    counts: list[np.ndarray] = []
    optimal_sets: list[frozenset[int]] = []
    for traj in _single_grid(trajectories):
        for t, (state, action, opt) in enumerate(
            zip(traj.states[:-1], traj.actions, traj.optimal_sets, strict=True)
        ):
            i = index_of.get(state)
            if i is None:
                i = index_of[state] = len(counts)
                counts.append(np.zeros(N_OUTCOMES, dtype=np.int64))
                optimal_sets.append(opt)
            elif optimal_sets[i] != opt:
                raise ValueError(
                    f"grid {traj.grid_id!r}: state {state!r} (step {t}) has optimal set "
                    f"{sorted(opt)} but an earlier step gave {sorted(optimal_sets[i])}"
                )
            counts[i][INVALID if action is None else action] += 1
    optimal = np.zeros((len(counts), N_OUTCOMES), dtype=float)
    for i, opt in enumerate(optimal_sets):
        optimal[i, sorted(opt)] = 1.0 / len(opt)
    return PolicyTable(
        states=tuple(index_of),
        counts=np.array(counts, dtype=np.int64).reshape(len(counts), N_OUTCOMES),
        optimal=optimal,
    )


def confidence_bins(
    confidences: Sequence[float] | np.ndarray, *, n_bins: int = ECE_BINS
) -> np.ndarray:
    """``(N,)`` int64 ECE bin of each of ``(N,)`` confidences in [0, 1]: ``floor(conf * M)``,
    with 1.0 in the last bin ``M - 1``."""
    conf = np.asarray(confidences, dtype=float)
    if not np.all((conf >= 0) & (conf <= 1)):
        raise ValueError("confidences must lie in [0, 1] (NaN is not allowed)")
    return np.minimum(np.floor(conf * n_bins).astype(np.int64), n_bins - 1)


def expected_calibration_error(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[bool] | np.ndarray,
    *,
    n_bins: int = ECE_BINS,
) -> float:
    """ECE ``= sum_m |B_m| / N |acc(B_m) - conf(B_m)|`` over equal-width confidence bins (eq. 6-8).

    ``confidences``: ``(N,)`` in [0, 1], binned by :func:`confidence_bins` into ``M = n_bins``
    bins; ``correct``: ``(N,)`` bool. Returns the ECE in [0, 1]; NaN when ``N = 0``.
    """
    conf = np.asarray(confidences, dtype=float)
    hit = np.asarray(correct, dtype=bool)
    if conf.ndim != 1 or conf.shape != hit.shape:
        raise ValueError(
            f"confidences and correct must be 1-D of equal length, got {conf.shape} and {hit.shape}"
        )
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    bins = confidence_bins(conf, n_bins=n_bins)  # checks that conf lies in [0, 1]
    if conf.size == 0:
        return math.nan
    conf_sum = np.bincount(bins, weights=conf, minlength=n_bins)
    hit_sum = np.bincount(bins, weights=hit.astype(float), minlength=n_bins)
    # sum_m |B_m|/N * |acc_m - conf_m| = sum_m |hits_m - conf_sum_m| / N; empty bins add 0.
    return float(np.abs(hit_sum - conf_sum).sum() / conf.size)


def _grid_ece(trajs: list[TrajectoryData], table: PolicyTable, n_bins: int) -> float:
    """ECE of one grid: every step ``(s_t, a_t)`` of every trajectory is one pair (eq. 6-8),
    its confidence the empirical ``pi_theta(a_t | s_t)`` (invalid steps their own outcome),
    correct when ``a_t in pi*(s_t)``; a pair taken k times counts k times."""
    row = {s: i for i, s in enumerate(table.states)}
    policy = table.policy
    conf = [
        policy[row[s], INVALID if a is None else a]
        for traj in trajs
        for s, a in zip(traj.states[:-1], traj.actions, strict=True)
    ]
    correct = np.concatenate([optimal_mask(t) for t in trajs]) if trajs else np.zeros(0, dtype=bool)
    return expected_calibration_error(conf, correct, n_bins=n_bins)


@dataclass(frozen=True)
class GridMetrics:
    """Behavioural metrics of one grid (appendix B), over all its trajectories."""

    grid_id: str
    """The grid."""
    n_trajectories: int
    """Number of trajectories N."""
    n_steps: int
    """Total steps over all trajectories."""
    n_visited_states: int
    """Number of visited states ``|S_visited|``."""
    success_rate: float
    """GSR in [0, 1]."""
    accuracy: float
    """Mean per-action accuracy in [0, 1]."""
    entropy: float
    """``H_pi_theta``, mean policy entropy over visited states (eq. 4; nats unless another base was
    asked; NaN when no action was taken)."""
    jsd: float
    """``JSD_pi_theta``, mean JSD from ``pi*`` over visited states (eq. 5; same unit)."""
    ece: float
    """Expected calibration error in [0, 1] (eq. 6-8, :func:`_grid_ece`)."""


def grid_metrics(
    trajectories: Iterable[TrajectoryData], *, base: float = math.e, n_bins: int = ECE_BINS
) -> GridMetrics:
    """All appendix-B metrics of one grid's trajectories (at least one trajectory)."""
    trajs = _single_grid(trajectories)
    if not trajs:
        raise ValueError("grid_metrics needs at least one trajectory")
    table = policy_table(trajs)
    ent, jsd = table.entropy(base=base), table.jsd(base=base)
    return GridMetrics(
        grid_id=trajs[0].grid_id,
        n_trajectories=len(trajs),
        n_steps=sum(t.n_steps for t in trajs),
        n_visited_states=len(table.states),
        success_rate=goal_success_rate(trajs),
        accuracy=grid_accuracy(trajs),
        entropy=float(ent.mean()) if ent.size else math.nan,
        jsd=float(jsd.mean()) if jsd.size else math.nan,
        ece=_grid_ece(trajs, table, n_bins),
    )


def metrics_by_grid(
    trajectories: Iterable[TrajectoryData], *, base: float = math.e, n_bins: int = ECE_BINS
) -> dict[str, GridMetrics]:
    """:func:`grid_metrics` of every grid, keyed by ``grid_id`` in order of first appearance."""
    return {
        gid: grid_metrics(trajs, base=base, n_bins=n_bins)
        for gid, trajs in group_by_grid(trajectories).items()
    }


class Stage(StrEnum):
    """Sub-task of a key-door episode, determined by the state before the action."""

    TO_KEY = "to_key"
    """The door is closed and the agent has no key."""
    TO_DOOR = "to_door"
    """The agent has the key and the door is still closed."""
    TO_GOAL = "to_goal"
    """The door is open (always so in a grid without a door)."""


def stage_of(state: Hashable) -> Stage:
    """The stage of a state with ``has_key`` and ``door_open`` attributes (``core.State``).

    ``door_open`` wins: in a grid without a door every state is :attr:`Stage.TO_GOAL`, so
    KeyNoDoor grids have no key or door stage (Table 1: N/A).
    """
    has_key, door_open = _flag(state, "has_key"), _flag(state, "door_open")
    if door_open:
        return Stage.TO_GOAL
    return Stage.TO_DOOR if has_key else Stage.TO_KEY


def _flag(state: Hashable, name: str) -> bool:
    try:
        return bool(getattr(state, name))
    except AttributeError as err:
        raise ValueError(
            f"key metrics need states with a {name!r} attribute (core.State), got {state!r}"
        ) from err


@dataclass(frozen=True)
class StageAccuracy:
    """Accuracy per key-door stage.

    For one trajectory: the fraction of its steps in the stage whose action is optimal. For a
    set of trajectories: the mean of that over the trajectories with steps in the stage.
    A stage with no steps is NaN.

    Attributes:
        to_key, to_door, to_goal: accuracy in [0, 1] or NaN.
        n_to_key, n_to_door, n_to_goal: number of steps (one trajectory) or of contributing
            trajectories (a set of trajectories) behind each value.
    """

    to_key: float
    to_door: float
    to_goal: float
    n_to_key: int
    n_to_door: int
    n_to_goal: int

    def __getitem__(self, stage: Stage) -> float:
        """The accuracy of ``stage``."""
        return getattr(self, Stage(stage).value)


def _per_stage(values: Iterable[tuple[Stage, float]]) -> StageAccuracy:
    """The mean and the number of the ``(stage, value)`` pairs of each stage (NaN over none)."""
    by_stage: dict[Stage, list[float]] = {stage: [] for stage in Stage}
    for stage, value in values:
        by_stage[stage].append(value)
    means = {s.value: float(np.mean(v)) if v else math.nan for s, v in by_stage.items()}
    counts = {f"n_{s.value}": len(v) for s, v in by_stage.items()}
    return StageAccuracy(**means, **counts)  # type: ignore[arg-type]


def trajectory_stage_accuracy(trajectory: TrajectoryData) -> StageAccuracy:
    """Accuracy of one trajectory within each stage (stage of ``s_t`` decides step ``t``)."""
    stages = map(stage_of, trajectory.states[:-1])
    return _per_stage(zip(stages, optimal_mask(trajectory), strict=True))


def stage_accuracy(trajectories: Iterable[TrajectoryData]) -> StageAccuracy:
    """Mean per-trajectory stage accuracy over the trajectories that reach each stage."""
    per_traj = [trajectory_stage_accuracy(t) for t in trajectories]
    return _per_stage((s, a[s]) for a in per_traj for s in Stage if not math.isnan(a[s]))


def key_pickup_rate(trajectories: Iterable[TrajectoryData]) -> float:
    """Fraction of trajectories in which the agent holds the key in some state; NaN when none."""
    flags = [any(_flag(s, "has_key") for s in t.states) for t in trajectories]
    return float(np.mean(flags)) if flags else math.nan


@dataclass(frozen=True)
class KeyAttraction:
    """Key attraction bias (Table 1): share of non-optimal moves that go towards the key."""

    n_non_optimal: int
    """Non-optimal valid actions taken while the agent did not hold the key."""
    n_towards: int
    """Those of them after which the key distance strictly decreased."""
    bias: float
    """``n_towards / n_non_optimal`` in [0, 1]; NaN when ``n_non_optimal == 0``."""


def key_attraction_bias(
    trajectories: Iterable[TrajectoryData], key_distance: Callable[[Hashable], float]
) -> KeyAttraction:
    """Pooled share of non-optimal actions that move towards the key.

    Step ``t`` counts when the agent does not hold the key in ``s_t``, ``a_t`` is a valid action
    and ``a_t not in pi*(s_t)``. It moves towards the key when
    ``key_distance(s_{t+1}) < key_distance(s_t)``: a bump into a wall (no move) or a move that
    keeps or increases the distance does not. Invalid steps are not actions and are left out.
    Counts are pooled over all given trajectories (states with ``has_key``); ``key_distance``:
    a state's distance to the key (``lambda s: bfs[s.agent]``, :func:`manhattan_key_distance`).
    """
    n_non_optimal = n_towards = 0
    for traj in trajectories:
        for t, (action, opt) in enumerate(zip(traj.actions, traj.optimal_sets, strict=True)):
            here, after = traj.states[t], traj.states[t + 1]
            if action is None or action in opt or _flag(here, "has_key"):
                continue
            n_non_optimal += 1
            n_towards += bool(key_distance(after) < key_distance(here))
    bias = n_towards / n_non_optimal if n_non_optimal else math.nan
    return KeyAttraction(n_non_optimal=n_non_optimal, n_towards=n_towards, bias=bias)


def manhattan_key_distance(key_row_col: RowCol) -> Callable[[Hashable], int]:
    """A ``key_distance`` for :func:`key_attraction_bias`: Manhattan distance from ``state.agent``."""
    key_row, key_col = key_row_col

    def distance(state: Hashable) -> int:
        row, col = state.agent  # type: ignore[attr-defined]
        return abs(row - key_row) + abs(col - key_col)

    return distance


def jaccard_similarity(states_a: Iterable[Hashable], states_b: Iterable[Hashable]) -> float:
    """Jaccard index ``|S_a & S_b| / |S_a | S_b|`` of two trajectories' unique visited states.

    Pass ``traj.states`` (final state included) or a projection of them, e.g. the agent cells
    ``[s.agent for s in traj.states]`` to compare a with-key and a without-key trajectory.
    NaN when both are empty.
    """
    a, b = set(states_a), set(states_b)
    union = a | b
    return len(a & b) / len(union) if union else math.nan


@dataclass(frozen=True)
class PairedTestResult:
    """A paired Wilcoxon signed-rank test of ``transformed - base``."""

    statistic: float
    """Scipy's Wilcoxon statistic (two-sided: ``min(W+, W-)``; one-sided: ``W+``)."""
    p_value: float
    """The test's p-value; 1.0 when every difference is zero."""
    rank_biserial: float
    """Matched-pairs rank-biserial correlation ``(W+ - W-) / (W+ + W-)`` in [-1, 1]; > 0 when the
    transformed values tend to be larger; 0.0 when every difference is zero. ``W+`` sums the
    ranks of ``|d|`` over positive differences ``d = transformed - base``, ``W-`` over negative
    ones."""
    n_pairs: int
    """Number of pairs."""
    n_nonzero: int
    """Pairs with a non-zero difference (zero differences are dropped, as in Wilcoxon's original
    test, scipy ``zero_method="wilcox"``); 0 when every difference is zero (nothing to test)."""


def paired_wilcoxon(
    base: Sequence[float] | np.ndarray,
    transformed: Sequence[float] | np.ndarray,
    *,
    alternative: str = "two-sided",
) -> PairedTestResult:
    """Wilcoxon signed-rank test of paired per-grid metrics (``(N,)`` ``base`` and
    ``transformed`` in the same order), with rank-biserial effect size;
    ``alternative="greater"``: transformed larger.

    When every difference is zero the test has nothing to rank; the result is then
    ``p_value=1.0, rank_biserial=0.0, statistic=0.0`` with ``n_nonzero`` 0, not an error.
    """
    x = np.asarray(base, dtype=float)
    y = np.asarray(transformed, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(
            f"base and transformed must be 1-D of equal length, got {x.shape} and {y.shape}"
        )
    if x.size == 0:
        raise ValueError("paired_wilcoxon needs at least one pair")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError(
            "base and transformed must be finite (drop grids with undefined metrics first)"
        )
    d = y - x
    nonzero = d[d != 0]
    if nonzero.size == 0:
        return PairedTestResult(0.0, 1.0, 0.0, int(d.size), 0)
    ranks = scipy.stats.rankdata(np.abs(nonzero))
    w_plus = float(ranks[nonzero > 0].sum())
    w_minus = float(ranks[nonzero < 0].sum())
    res = scipy.stats.wilcoxon(d, zero_method="wilcox", alternative=alternative)
    return PairedTestResult(
        statistic=float(res.statistic),
        p_value=float(res.pvalue),
        rank_biserial=(w_plus - w_minus) / (w_plus + w_minus),
        n_pairs=int(d.size),
        n_nonzero=int(nonzero.size),
    )
