"""The study's behavioural analyses over many grids (section 4, appendix B; Figs. 4, 12, 14;
Tables 1 and 3), with their baselines and grid-bootstrap intervals. Imports no torch.

Inputs are plain data: each grid's :class:`~goalprobe.gridworld.core.Grid`, the horizon its
episodes ran under and the episodes as :class:`~goalprobe.gridworld.metrics.TrajectoryData`
(:class:`GridEpisodes`). Outputs are JSON-ready dicts; every aggregate is
``{value, ci_low, ci_high, n}`` with ``n`` the number of grids averaged (grids are the
independent unit; a grid's metric is computed over all its episodes first).

Baselines: the **random walk** (uniformly random moves for the grid's horizon, stopping at the
goal; :func:`random_walk`) and the **random action** (the expected accuracy of a uniform action
at the agent's own states, ``mean |pi*(s)| / 4``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import numpy as np
from goalprobe.gridworld.core import Grid, RowCol, State
from goalprobe.gridworld.dynamics import is_success, rollout
from goalprobe.gridworld.metrics import (
    Stage,
    TrajectoryData,
    goal_success_rate,
    grid_metrics,
    jaccard_similarity,
    key_attraction_bias,
    key_pickup_rate,
    manhattan_key_distance,
    paired_wilcoxon,
    policy_table,
    stage_accuracy,
    trajectory_accuracy,
)
from goalprobe.gridworld.optimal import solve

from goalprobe.stats import equivalence_verdict, grid_bootstrap_ratio
from goalprobe.stats import mean_ci as stats_mean_ci

GRID_METRICS: tuple[str, ...] = (
    "success_rate",
    "accuracy",
    "entropy",
    "jsd",
    "ece",
    "random_walk_success_rate",
    "random_walk_accuracy",
    "random_action_accuracy",
)
"""Per-grid metrics aggregated (mean over grids and grid-bootstrap CI) by :func:`aggregate`."""

RATE_METRICS: frozenset[str] = frozenset(
    {
        "success_rate",
        "accuracy",
        "invalid_rate",
        "random_walk_success_rate",
        "random_walk_accuracy",
        "random_action_accuracy",
    }
)
"""Per-grid metrics that are rates in [0, 1]: their interval over grids is the Clopper-Pearson
interval on the grids (:func:`goalprobe.stats.cluster_rate_interval`, one trial per
grid), which stays honest at 0% and 100% where a percentile bootstrap collapses to a point."""

ISO_METRICS: tuple[str, ...] = ("accuracy", "success_rate", "entropy", "jsd")
"""Metrics compared between base and transformed grids (Table 3)."""

ISO_EQUIVALENCE_MARGIN = 0.05
"""Default equivalence margin of the iso-difficulty rates (5 points of accuracy / success)."""


@dataclass(frozen=True)
class IntervalConfig:
    """How a confidence interval over grids is drawn."""

    n_bootstrap: int = 1000
    """Bootstrap resamples of the interval (grids resampled)."""
    seed: int = 0
    """Seed of the bootstrap."""

    def __post_init__(self) -> None:
        if self.n_bootstrap < 1:
            raise ValueError(f"n_bootstrap must be >= 1, got {self.n_bootstrap}")


@dataclass(frozen=True)
class BehaviourConfig:
    """How behaviour is summarised."""

    random_walks_per_grid: int = 200
    """Uniform random walks simulated per grid for the random-walk baseline."""
    n_bootstrap: int = 1000
    """Bootstrap resamples of every confidence interval (grids resampled)."""
    seed: int = 0
    """Seed of the random walks and the bootstraps."""

    def __post_init__(self) -> None:
        if self.random_walks_per_grid < 1:
            raise ValueError(
                f"random_walks_per_grid must be >= 1, got {self.random_walks_per_grid}"
            )
        IntervalConfig(self.n_bootstrap, self.seed)  # validates n_bootstrap

    @property
    def intervals(self) -> IntervalConfig:
        """The part of this config that draws intervals (what key-variant tables receive)."""
        return IntervalConfig(self.n_bootstrap, self.seed)


@dataclass(frozen=True)
class GridEpisodes:
    """One grid and every episode run on it."""

    grid: Grid
    """The grid."""
    horizon: int
    """The step budget ``T`` its episodes ran under."""
    episodes: tuple[TrajectoryData, ...]
    """Its episodes, in file order."""

    def steps(self):
        """Every ``(state, action, optimal set)`` of every episode."""
        for e in self.episodes:
            yield from zip(e.states[:-1], e.actions, e.optimal_sets, strict=True)


@dataclass(frozen=True)
class RandomWalk:
    """The random-walk baseline on one grid."""

    success_rate: float
    """Share of walks that reach the goal within the horizon."""
    accuracy: float
    """Mean over walks of the share of their moves that are optimal."""


def random_walk(grid: Grid, horizon: int, n_walks: int, rng: np.random.Generator) -> RandomWalk:
    """Uniformly random moves for ``horizon`` steps (or until the goal), ``n_walks`` times.

    Each walk draws its ``horizon`` moves at once, so the draws do not depend on when it stops.
    """
    policy = solve(grid)
    successes, accuracies = 0, []
    for _ in range(n_walks):
        moves = rng.integers(0, 4, size=horizon).tolist()
        states = rollout(grid, moves)
        successes += is_success(grid, states[-1])
        hits = sum(m in policy.optimal_actions(s) for s, m in zip(states[:-1], moves, strict=False))
        accuracies.append(hits / (len(states) - 1))
    return RandomWalk(successes / n_walks, float(np.mean(accuracies)))


def mean_ci(
    values: Sequence[float | None], config: IntervalConfig | BehaviourConfig, rate: bool = False
) -> dict:
    """:func:`goalprobe.stats.mean_ci` at ``config``'s resamples and seed."""
    return stats_mean_ci(
        values, n_resamples=config.n_bootstrap, random_state=config.seed, rate=rate
    )


def grid_rows(grids: Sequence[GridEpisodes], config: BehaviourConfig) -> list[dict]:
    """One row of appendix-B metrics per grid, with the random-walk and random-action baselines.

    Grids are processed in the order given; the random walks draw from one generator seeded
    with ``config.seed``, so the rows are reproducible for the same order.
    """
    rng = np.random.default_rng(config.seed)
    scores = ("n_trajectories", "success_rate", "accuracy", "entropy", "jsd", "ece")
    rows = []
    for g in grids:
        m = grid_metrics(list(g.episodes))
        steps = list(g.steps())
        walk = random_walk(g.grid, g.horizon, config.random_walks_per_grid, rng)
        rows.append(
            {
                "grid_id": g.grid.grid_id,
                "size": g.grid.size,
                "density": g.grid.density,
                "variant": str(g.grid.variant),
                "shortest_path_length": solve(g.grid).shortest_path_length,
                **{name: getattr(m, name) for name in scores},  # of GridMetrics
                "invalid_rate": float(np.mean([a is None for _, a, _ in steps])),
                "random_walk_success_rate": walk.success_rate,
                "random_walk_accuracy": walk.accuracy,
                "random_action_accuracy": float(np.mean([len(o) / 4 for _, _, o in steps])),
            }
        )
    return rows


def aggregate(rows: Sequence[Mapping], keys: Sequence[str], config: BehaviourConfig) -> list[dict]:
    """Mean and CI of every :data:`GRID_METRICS` column within each group of ``keys``."""
    groups: dict[tuple, list[Mapping]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in keys)].append(row)
    out = []
    for key in sorted(groups, key=lambda k: tuple(-1 if v is None else v for v in k)):
        members = groups[key]
        entry = dict(zip(keys, key, strict=True))
        entry["n_grids"] = len(members)
        for metric in GRID_METRICS:
            entry[metric] = mean_ci(
                [r[metric] for r in members], config, rate=metric in RATE_METRICS
            )
        out.append(entry)
    return out


def by_distance(grids: Sequence[GridEpisodes], config: BehaviourConfig) -> list[dict]:
    """Fig. 4 (top): accuracy and JSD from pi* against the distance to the goal.

    Each grid contributes its mean at every distance it visited; the CI is over grids.
    """
    acc: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    jsd: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for g in grids:
        policy = solve(g.grid)
        table = policy_table(list(g.episodes))
        distance_of: dict[Hashable, int] = {}
        for state, action, optimal in g.steps():
            d = int(policy.distance(state))
            distance_of[state] = d
            acc[d][g.grid.grid_id].append(float(action is not None and action in optimal))
        for state, value in zip(table.states, table.jsd(), strict=True):
            jsd[distance_of[state]][g.grid.grid_id].append(float(value))
    return [
        {
            "distance": d,
            "n_steps": sum(len(v) for v in acc[d].values()),
            "accuracy": mean_ci([float(np.mean(v)) for v in acc[d].values()], config, rate=True),
            "jsd": mean_ci([float(np.mean(v)) for v in jsd[d].values()], config),
        }
        for d in sorted(acc)
    ]


class BehaviourSummary(TypedDict):
    """What :func:`behaviour_summary` returns (the body of the demo's behaviour metrics JSON):
    one row per grid, their aggregates overall and by size, density and distance, and what
    the baselines are."""

    per_grid: list[dict[str, Any]]
    overall: dict[str, Any]
    by_size_density: list[dict[str, Any]]
    by_size: list[dict[str, Any]]
    by_density: list[dict[str, Any]]
    by_distance: Any
    baselines: dict[str, str]


def behaviour_summary(grids: Sequence[GridEpisodes], config: BehaviourConfig) -> BehaviourSummary:
    """Per-grid rows and their aggregates overall, by size x density, size, density and
    distance to the goal (schema ``goalprobe.demo.behaviour/1`` without the schema tag)."""
    rows = grid_rows(grids, config)
    return {
        "per_grid": rows,
        "overall": aggregate([{**r, "all": "all"} for r in rows], ["all"], config)[0],
        "by_size_density": aggregate(rows, ["size", "density"], config),
        "by_size": aggregate(rows, ["size"], config),
        "by_density": aggregate(rows, ["density"], config),
        "by_distance": by_distance(grids, config),
        "baselines": {
            "random_walk": "uniform random actions for the grid's horizon "
            f"({config.random_walks_per_grid} walks per grid)",
            "random_action_accuracy": "expected accuracy of a uniform action at the "
            "agent's own states, mean |pi*(s)| / 4",
        },
    }


def iso_tests(
    base_rows: Mapping[str, Mapping],
    transformed_rows: Mapping[str, Mapping[str, Mapping]],
    config: BehaviourConfig,
    metrics: Sequence[str] = ISO_METRICS,
    margin: float = ISO_EQUIVALENCE_MARGIN,
) -> list[dict]:
    """Table 3: paired Wilcoxon signed-rank tests of each transform against its base grids, and
    the equivalence verdict of the rates.

    The Wilcoxon test alone cannot say "no change": with few non-zero pairs its smallest
    reachable p-value is large (0.25 from 3), so "p >= 0.05" is what it gives whatever the
    effect. The verdict is read instead from the paired interval of the mean difference against
    ``±margin`` (:func:`goalprobe.stats.equivalence_verdict`) for the rate metrics
    (:data:`RATE_METRICS`; the others get ``None``); ``min_p_value`` is the smallest p-value
    the test could reach with its non-zero pairs (``2 / 2**n_nonzero``). ``base_rows``: base
    grid id -> its :func:`grid_rows` row; ``transformed_rows``: transform -> base id -> row.
    Returns one entry per transform x metric: ``transform, metric, n_pairs`` and, with pairs,
    ``base_mean, transformed_mean, difference`` (CI), ``statistic, p_value, rank_biserial,
    n_nonzero, min_p_value, margin, equivalence``.
    """
    tests = []
    for name, rows in transformed_rows.items():
        for metric in metrics:
            ids = sorted(
                k
                for k in rows
                if k in base_rows
                and math.isfinite(base_rows[k][metric])
                and math.isfinite(rows[k][metric])
            )
            entry: dict = {"transform": name, "metric": metric, "n_pairs": len(ids)}
            if ids:
                x = np.array([base_rows[k][metric] for k in ids], dtype=float)
                y = np.array([rows[k][metric] for k in ids], dtype=float)
                test = paired_wilcoxon(x, y)
                difference = mean_ci((y - x).tolist(), config)
                rate = metric in RATE_METRICS
                entry.update(
                    base_mean=float(x.mean()),
                    transformed_mean=float(y.mean()),
                    difference=difference,
                    statistic=test.statistic,
                    p_value=test.p_value,
                    rank_biserial=test.rank_biserial,
                    n_nonzero=test.n_nonzero,
                    min_p_value=min(1.0, 2.0 / 2**test.n_nonzero),
                    margin=margin if rate else None,
                    equivalence=equivalence_verdict(
                        difference["ci_low"], difference["ci_high"], margin
                    )
                    if rate
                    else None,
                )
            tests.append(entry)
    return tests


@dataclass(frozen=True)
class KeyEpisode:
    """One key-variant episode: its grid, its trajectory and its last agent cell."""

    grid: Grid
    trajectory: TrajectoryData
    episode: int
    final_cell: RowCol


def _episode_rate(flags: Sequence[bool], grid_ids: Sequence[str]) -> dict:
    """``{value, ci_low, ci_high, n, n_grids, n_eff}``: a rate of episodes with its exact
    cluster interval (grids as clusters; honest at 0% and 100%)."""
    stat = grid_bootstrap_ratio(flags, None, grid_ids, n_resamples=0, rate=True)
    return {key: stat[key] for key in ("value", "ci_low", "ci_high", "n", "n_grids", "n_eff")}


def key_variant_table(
    episodes: Sequence[KeyEpisode], config: IntervalConfig
) -> tuple[dict[str, dict], dict]:
    """Table 1: ``(variants, two_path_jaccard)``: per variant its success, accuracy, key
    pickup, stage accuracy and key-attraction bias, and the mean Jaccard similarity (with CI) of
    the cells visited on matched ``two_path_key`` / ``two_path_no_key`` grids."""
    by_variant: dict[str, list[KeyEpisode]] = defaultdict(list)
    for e in episodes:
        by_variant[str(e.grid.variant)].append(e)
    variants = {}
    for variant, eps in by_variant.items():
        data = [e.trajectory for e in eps]
        entry: dict = {
            "n_trajectories": len(data),
            "success_rate": goal_success_rate(data),
            "accuracy": mean_ci([trajectory_accuracy(t) for t in data], config, rate=True),
        }
        ids = [e.grid.grid_id for e in eps]
        entry["success_ci"] = _episode_rate([t.success for t in data], ids)
        if any(e.grid.key is not None for e in eps):
            entry["key_pickup_rate"] = key_pickup_rate(data)
            held = [any(getattr(s, "has_key", False) for s in t.states) for t in data]
            entry["key_pickup_ci"] = _episode_rate(held, ids)
        if variant == "key_door":
            stages = stage_accuracy(data)
            entry["stage_accuracy"] = {stage.value: stages[stage] for stage in Stage}
        if variant in ("key_no_door", "two_path_key"):
            n_non, n_towards = 0, 0
            for e in eps:
                if e.grid.key is None:
                    raise ValueError(f"grid {e.grid.grid_id!r} of variant {variant} has no key")
                bias = key_attraction_bias([e.trajectory], manhattan_key_distance(e.grid.key))
                n_non += bias.n_non_optimal
                n_towards += bias.n_towards
            entry["key_attraction_bias"] = n_towards / n_non if n_non else None
            entry["key_attraction_n_non_optimal"] = n_non
        variants[variant] = entry

    def layout(e: KeyEpisode) -> tuple[str, int]:
        # matched two-path grids share everything after the variant in their id
        return (e.grid.grid_id.split("-", 1)[1], e.episode)

    def cells(e: KeyEpisode) -> list[RowCol]:
        return [cast(State, s).agent for s in e.trajectory.states[:-1]] + [e.final_cell]

    with_key = {layout(e): e for e in by_variant.get("two_path_key", [])}
    jaccard = [
        jaccard_similarity(cells(with_key[layout(e)]), cells(e))
        for e in by_variant.get("two_path_no_key", [])
        if layout(e) in with_key
    ]
    return variants, mean_ci(jaccard, config)
