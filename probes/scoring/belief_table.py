"""Policy against decoded belief over many steps: the rows of ``belief.json`` (no I/O here; format
in docs/formats.md, "Scoring outputs").

The caller hands the trajectory steps (:class:`StepTable`) and, per decoded-map source, class
probabilities and decoding steps; :func:`score_rows` scores every step
(:func:`~goalprobe.probes.scoring.belief.score_step`) and :func:`belief_entry` pools them, with
:data:`LOCAL_METRICS` beside the study's metrics. Invalid steps count as not optimal. Groups
weight each grid as the study's Figure 4 (``weighting="grid"``) or pool steps (``"step"``).
Intervals come from a grid bootstrap; ``null`` where undefined. Nulls and excess:
:mod:`goalprobe.probes.scoring.nulls`.

Grouped scores (:func:`grouped_stats`, :func:`ratio_stats`, shared with ``meg.json``): every
score is a ratio of per-step sums, pooled overall and by grid size, density and variant, with
intervals from :class:`goalprobe.stats.GridBootstrap`, all metrics of one call sharing the draws
(paired); and the long-format rows of ``belief.csv`` and ``meg.csv`` (:data:`CSV_COLUMNS`)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, Action, CellType
from goalprobe.gridworld.metrics import TrajectoryData
from goalprobe.probes.decoded_maps import full_class_probs
from goalprobe.probes.scoring.belief import (
    StepBelief,
    decoded_walls,
    score_step,
    top_cells,
)
from goalprobe.probes.scoring.config import ScoreConfig, ScoringError

from goalprobe.stats import (
    GridBootstrap,
    RandomState,
    cluster_rate_interval,
    is_count_rate,
)

N_CELL_TYPES = len(CellType)
CHUNK_ROWS = 64
"""Decoded rows per scoring task (a worker process scores one chunk at a time)."""


class ScoresHeader(TypedDict):
    """The fields ``belief.json`` and ``meg.json`` share (written by ``goalprobe score``)."""

    created: str
    package_version: str
    config: dict[str, Any]


class BeliefInputs(TypedDict):
    """What ``belief.json`` was scored from (paths relative to the run directory)."""

    trajectories: str
    trajectory_run_id: str
    store: str
    decoded_maps: list[str]


class BeliefScores(ScoresHeader):
    """``belief.json``: policy-vs-belief scores per probe (``schema``
    ``goalprobe.scoring.belief``, ``schema_version`` 3; :func:`belief_csv_rows` reads it)."""

    schema: str
    schema_version: int
    inputs: BeliefInputs
    method: dict[str, Any]
    metrics: list[str]
    default_probe: str
    probes: dict[str, dict]


class StepFacts(NamedTuple):
    """What scoring a decoded map needs of one trajectory step."""

    size: int
    """The grid side n."""
    action: int | None
    """The agent's action, None for an invalid step."""
    optimal: tuple[bool, ...]
    """Per ``Action``, optimal on the true grid."""
    door_locked: bool
    """A locked door still blocks the agent."""
    agent: tuple[int, int] | None = None
    """The true agent cell (None: localisation and wall scores are left out)."""
    goal: tuple[int, int] | None = None
    """The true goal cell."""
    walls: np.ndarray | None = None
    """The true ``(n, n)`` walls."""


@dataclass
class StepTable:
    """Compact per-step facts of one trajectory run, keyed by ``(grid_id, episode, step)``.

    Attributes:
        index: ``(grid_id, episode, step)`` -> position in the per-step lists.
        action: the agent's ``Action`` value, None for an invalid step.
        optimal: per ``Action``, whether it is optimal on the true grid.
        door_locked: the grid has a door, it is closed and the agent holds no key.
        trajectories, horizons: grid id -> its episodes (for MEG) and their step budgets.
        episode: the step's episode (Figure 4's per-trajectory mean).
        agent, goal, walls: the true agent and goal cells, and per grid its ``(n, n)`` walls."""

    run_id: str
    index: dict[tuple[str, int, int], int] = field(default_factory=dict)
    action: list[int | None] = field(default_factory=list)
    optimal: list[tuple[bool, ...]] = field(default_factory=list)
    door_locked: list[bool] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    density: list[float] = field(default_factory=list)
    variant: list[str] = field(default_factory=list)
    trajectories: dict[str, list[TrajectoryData]] = field(default_factory=dict)
    horizons: dict[str, set[int]] = field(default_factory=dict)
    episode: list[int] = field(default_factory=list)
    agent: list[tuple[int, int]] = field(default_factory=list)
    goal: list[tuple[int, int]] = field(default_factory=list)
    grid_id: list[str] = field(default_factory=list)
    walls: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_episodes(cls, run_id: str, episodes: Iterable) -> StepTable:
        """Keep what scoring needs of trajectory ``episodes`` (not their token ids)."""
        from goalprobe.gridworld.text import parse

        table = cls(run_id=run_id)
        for episode in episodes:
            summary = episode.summary
            gid = summary.grid_id
            table.trajectories.setdefault(gid, []).append(episode.to_trajectory_data())
            table.horizons.setdefault(gid, set()).add(int(summary.horizon))
            for s in episode.steps:
                table.index[(s.grid_id, s.episode, s.step)] = len(table.action)
                table.action.append(None if s.action_enum is None else int(s.action_enum))
                optimal = s.optimal_action_set
                table.optimal.append(tuple(a in optimal for a in Action))
                table.door_locked.append(
                    s.door_row_col is not None and not s.door_open and not s.has_key
                )
                table.size.append(int(s.grid_size))
                table.density.append(math.nan if s.density is None else float(s.density))
                table.variant.append(str(s.variant))
                table.episode.append(int(s.episode))
                table.agent.append((int(s.agent_row_col[0]), int(s.agent_row_col[1])))
                table.goal.append((int(s.goal_row_col[0]), int(s.goal_row_col[1])))
                table.grid_id.append(str(gid))
                if gid not in table.walls:
                    grid, _ = parse(s.true_grid_text or s.grid_text, variant=str(s.variant))
                    table.walls[gid] = np.asarray(grid.walls, dtype=bool)
        return table

    def facts(self, idx: np.ndarray) -> list[StepFacts]:
        """:class:`StepFacts` of the steps ``idx``."""
        return [
            StepFacts(
                self.size[j],
                self.action[j],
                self.optimal[j],
                self.door_locked[j],
                self.agent[j] if self.agent else None,
                self.goal[j] if self.goal else None,
                self.walls.get(self.grid_id[j]) if self.grid_id else None,
            )
            for j in idx
        ]

    def episodes(self, idx: np.ndarray) -> np.ndarray:
        """``(N,)`` ``grid_id/episode`` keys of the steps ``idx``."""
        key = {j: f"{g}/{e}" for (g, e, _), j in self.index.items()}
        return np.asarray([key[int(j)] for j in idx], dtype=object)

    def groups(self, idx: np.ndarray) -> dict[str, list]:
        """Breakdown keys (size, density, variant) of the steps ``idx``."""
        return group_keys(
            np.asarray(self.size)[idx],
            np.asarray(self.density)[idx],
            np.asarray(self.variant, dtype=object)[idx],
        )


def check_classes(classes: Sequence[int] | np.ndarray, where: str) -> None:
    """Refuse a probe that cannot be scored (no AGENT or GOAL class, or not CellType values)."""
    classes = [int(c) for c in classes]
    missing = [CellType(c).name for c in (CellType.AGENT, CellType.GOAL) if c not in classes]
    if missing:
        raise ScoringError(f"{where}: the probe has no {missing} class; cannot score it")
    if any(c >= N_CELL_TYPES for c in classes):
        raise ScoringError(f"{where}: classes {classes} are not all CellType values")


def belief_metrics(top_k: Sequence[int]) -> tuple[str, ...]:
    """Metric names of ``belief.json`` in table order for the given top-k values."""
    ks = sorted(set(top_k) | {1})
    return (
        "acc_gt",
        "acc_dec",
        "agreement",
        "recovery",
        "inverse_recovery",
        "optimal_on_both",
        *(f"acc_top{k}" for k in ks),
        "expected_optimality",
        "qmdp_agreement",
        "qmdp_regret",
        "chance_acc_gt",
        "chance_acc_dec",
        *LOCAL_METRICS,
    )


LOCAL_METRICS = ("agent_found", "goal_found", "wall_acc_near", "wall_acc_far")
"""The decoded agent (goal) cell is the true one; the share of the cells at Chebyshev distance 1
of the true agent, and of the other non-goal cells, whose decoded wall/open state is true."""


def local_scores(
    walls: np.ndarray,
    agent_cell: tuple[int, int],
    goal_cell: tuple[int, int],
    fact: StepFacts,
) -> tuple[list[float], list[float]]:
    """``(num, den)`` of :data:`LOCAL_METRICS` for decoded ``walls`` and top-1 cells."""
    if fact.walls is None or fact.agent is None or fact.goal is None:
        return [0.0] * 4, [0.0] * 4
    n = fact.size
    rows, cols = np.indices((n, n))
    ar, ac = fact.agent
    ring = np.maximum(np.abs(rows - ar), np.abs(cols - ac))
    near = ring == 1
    far = ring > 1
    far[fact.goal] = False
    right = walls[:n, :n] == fact.walls[:n, :n]
    return (
        [
            float(tuple(agent_cell) == tuple(fact.agent)),
            float(tuple(goal_cell) == tuple(fact.goal)),
            float(right[near].sum()),
            float(right[far].sum()),
        ],
        [1.0, 1.0, float(near.sum()), float(far.sum())],
    )


LOWER_IS_BETTER = frozenset({"qmdp_regret"})
"""Belief metrics where a smaller value is the better belief."""

MAP_FREE = frozenset({"acc_gt", "chance_acc_gt"})
"""Belief metrics that do not depend on the decoded map (no null, no excess)."""


def _indicators(
    step: StepBelief, top_k: Sequence[int], fact: StepFacts, distances: dict
) -> tuple[np.ndarray, np.ndarray]:
    """``(num, den)`` per metric of :func:`belief_metrics` for one step (the local metrics' ``den``
    is 0 without the true cells in ``fact``); ``distances`` is :func:`score_step`'s BFS cache."""
    s = score_step(step, top_k, distances)
    gt, dec = s.opt_gt, s.opt_dec
    regret = s.belief.qmdp_regret
    finite = math.isfinite(regret)
    num = [
        gt,
        dec,
        s.agreement,
        dec and not gt,
        gt and not dec,
        gt and dec,
        *(s.opt_topk[k] for k in sorted(s.opt_topk)),
        s.belief.expected_optimality,
        s.belief.action_is_qmdp_optimal,
        regret if finite else 0.0,
        float(np.count_nonzero(step.true_optimal)) / N_ACTIONS,
        float(np.count_nonzero(s.dec_optimal)) / N_ACTIONS,
    ]
    den = [1, 1, 1, not gt, not dec, 1, *([1] * len(s.opt_topk)), 1, 1, finite, 1, 1]
    walls = decoded_walls(step.probs, step.size, door_locked=False)
    agent = top_cells(step.probs, step.size, CellType.AGENT, 1, step.agent)[0]
    goal = top_cells(step.probs, step.size, CellType.GOAL, 1, step.goal)[0]
    lnum, lden = local_scores(walls, agent, goal, fact)
    return np.asarray(num + lnum, dtype=np.float64), np.asarray(den + lden, dtype=np.float64)


def _score_chunk(
    probs: np.ndarray,
    classes: np.ndarray,
    facts: list[StepFacts],
    top_k: tuple[int, ...],
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Score a chunk of decoded rows (``agent`` / ``goal``: the rows' position read-outs)."""
    full = full_class_probs(probs, classes)
    nums, dens = [], []
    distances: dict = {}  # BFS tables by decoded wall map, for this chunk's steps
    for i, (p, fact) in enumerate(zip(full, facts, strict=True)):
        fact = StepFacts(*fact)
        step = StepBelief(
            p,
            fact.size,
            fact.action,
            np.asarray(fact.optimal, dtype=bool),
            fact.door_locked,
            agent=None if agent is None else agent[i],
            goal=None if goal is None else goal[i],
        )
        num, den = _indicators(step, top_k, fact, distances)
        nums.append(num)
        dens.append(den)
    return np.stack(nums), np.stack(dens)


def score_rows(
    probs: np.ndarray,
    classes: Sequence[int] | np.ndarray,
    facts: list[StepFacts],
    top_k: tuple[int, ...],
    *,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
    executor: Executor | None = None,
    progress: bool = False,
    label: str = "belief",
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step ``(num, den)`` ``(N, M)`` of :func:`belief_metrics` for decoded maps.

    ``probs`` is ``(N, S, S, C)`` (column ``j`` is ``classes[j]``), ``facts`` per row
    (:meth:`StepTable.facts`), ``agent`` / ``goal`` ``(N, S, S)`` read-outs (None: the probe's
    ``P(AGENT)`` / ``P(GOAL)``); ``executor`` scores chunks of :data:`CHUNK_ROWS` rows."""
    from tqdm.auto import tqdm

    class_values = np.asarray(classes, dtype=np.int64)

    def part(x, a):
        return None if x is None else np.asarray(x[a : a + CHUNK_ROWS], dtype=np.float32)

    chunks = [
        (probs[a : a + CHUNK_ROWS], class_values, facts[a : a + CHUNK_ROWS], top_k)
        + (part(agent, a), part(goal, a))
        for a in range(0, len(facts), CHUNK_ROWS)
    ]
    if executor is None:
        results: Iterator = (_score_chunk(*c) for c in chunks)
    else:
        results = executor.map(_score_chunk, *zip(*chunks, strict=True))
    nums, dens = [], []
    bar = tqdm(total=len(facts), desc=label, unit="step", disable=not progress)
    for chunk, (num, den) in zip(chunks, results, strict=True):
        nums.append(num)
        dens.append(den)
        bar.update(len(chunk[2]))
    bar.close()
    if not nums:
        raise ScoringError(f"{label}: holds no decoded rows")
    return np.concatenate(nums), np.concatenate(dens)


def belief_entry(
    num: np.ndarray,
    den: np.ndarray,
    idx: np.ndarray,
    grid_ids: np.ndarray,
    steps: StepTable,
    config: ScoreConfig,
    seed_text: str,
) -> dict:
    """Counts and grouped statistics of one source's scored steps (``n_steps`` ... ``by_variant``),
    the bootstrap seeded by ``config.random_state`` and ``seed_text``."""
    stats = grouped_stats(
        num,
        den,
        grid_ids,
        steps.groups(idx),
        belief_metrics(config.top_k),
        **bootstrap_args(config, seed_text),
        weights=trajectory_weights(den, grid_ids, steps.episodes(idx))
        if config.weighting == "grid"
        else None,
    )
    return {
        "n_steps": len(idx),
        "n_grids": len(set(grid_ids.tolist())),
        "n_invalid_steps": sum(1 for j in idx if steps.action[j] is None),
        **stats,
    }


@dataclass
class MapAccumulator:
    """Per-grid decoded map of the MEG probe (mean over steps, or the earliest step)."""

    mode: str
    rows: list = field(default_factory=list)
    """Every decoded row, ``(step index, probs, agent read-out, goal read-out)`` (per-step MEG)."""
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    first: dict[str, tuple[tuple[int, int], np.ndarray]] = field(default_factory=dict)

    def add(self, grid_id: str, order: tuple[int, int], probs: np.ndarray) -> None:
        """Add one step's ``(S, S, 7)`` map; ``order`` = ``(episode, step)``."""
        self.counts[grid_id] = self.counts.get(grid_id, 0) + 1
        if self.mode == "mean":
            acc = self.sums.get(grid_id)
            p = probs.astype(np.float64)
            self.sums[grid_id] = p if acc is None else acc + p
        elif grid_id not in self.first or order < self.first[grid_id][0]:
            self.first[grid_id] = (order, probs.astype(np.float64))

    def maps(self) -> dict[str, np.ndarray]:
        """Grid id -> its believed ``(S, S, 7)`` map."""
        if self.mode == "mean":
            return {g: s / self.counts[g] for g, s in self.sums.items()}
        return {g: p for g, (_, p) in self.first.items()}


def belief_csv_rows(belief: BeliefScores) -> list[dict]:
    """Long-format rows of ``belief.json`` (:data:`CSV_COLUMNS`),
    with the ``null:``, ``excess:`` and ``ceiling:`` rows of each null."""
    rows: list[dict] = []
    for key, entry in belief["probes"].items():
        base = {"probe": key, **{k: entry[k] for k in ("stage", "layer", "family")}}
        rows.extend(stat_rows(base, groups_of(entry)))
        for name, block in (entry.get("nulls") or {}).items():
            rows.extend(stat_rows(base, [("all", block["overall"])], f"null:{name}/"))
            rows.extend(stat_rows(base, [("all", block["excess"])], f"excess:{name}/"))
            if "ceiling" in block:
                rows.extend(
                    stat_rows(base, [("all", {"acc_dec": block["ceiling"]})], f"ceiling:{name}/")
                )
    return rows


def card_summary(card: dict) -> dict:
    """``family``, ``stage``, ``layer`` and ``card_accuracy`` (test ``accuracy_no_padding``, else
    ``accuracy``, else None) of a decoded-map source's probe card."""
    from goalprobe.probes.decoded_maps import decoded_map_family

    models = (card.get("metrics") or {}).get("models") or {}
    model = models.get("probe") or {}
    accuracy = None
    for name in ("accuracy_no_padding", "accuracy"):
        value = (model.get(name) or {}).get("value")
        if isinstance(value, int | float) and math.isfinite(value):
            accuracy = float(value)
            break
    source = card.get("activations") or {}
    layer = source.get("layer")
    return {
        "family": decoded_map_family(card),
        "stage": source.get("stage"),
        "layer": None if layer is None else int(layer),
        "card_accuracy": accuracy,
    }


def pick_meg_probe(sources: dict[str, dict], meg_probe: str | None) -> tuple[str, str]:
    """``(key, selected_by)`` of the source giving subjective MEG: ``meg_probe`` (key or file name),
    else the best card accuracy (majority baselines excluded)."""
    if meg_probe is not None:
        key = meg_probe.removesuffix(".h5")
        if key in sources:
            return key, "config"
        raise ScoringError(
            f"ScoreConfig.meg_probe {meg_probe!r} is not one of the scored decoded maps "
            f"{list(sources)}"
        )
    rated = [
        (d["card_accuracy"], k)
        for k, d in sources.items()
        if d["card_accuracy"] is not None and d["family"] != "majority"
    ]
    if not rated:
        raise ScoringError(
            f"no decoded-map card records a test accuracy ({[d['file'] for d in sources.values()]}); "
            "name the probe for subjective MEG with ScoreConfig.meg_probe (--meg-probe)"
        )
    return max(rated)[1], "best card test accuracy"


def belief_method(config: ScoreConfig) -> dict:
    """The ``method`` block of ``belief.json``."""
    return {
        "bootstrap": bootstrap_text(config),
        "n_bootstrap": config.n_bootstrap,
        "confidence_level": config.confidence_level,
        "top_k": list(config.top_k),
        "invalid_steps": "counted as not optimal (on both grids)",
        "groups": (
            "per grid as the study's Figure 4: each trajectory's rate, averaged over the "
            "grid's trajectories, then over grids"
            if config.weighting == "grid"
            else "steps pooled within a group (ratio of sums)"
        ),
        "weighting": config.weighting,
        "agreement": "the study's (section 5.2): the optimal policies on the true and on the "
        "top-1 decoded grid share an optimal action in the step's state, whatever the agent "
        "did; optimal_on_both: the agent's action is optimal under both",
        "nulls": "other_grid: the probe's maps of another grid of the same size and density "
        "(seeded derangement); prior: size-and-density cell prior of the training grids; "
        "excess = probe - null, paired grid bootstrap (goalprobe.probes.scoring.nulls)",
    }


def bootstrap_text(config: ScoreConfig) -> str:
    """How intervals were computed, in words."""
    return (
        f"grid bootstrap ({config.n_bootstrap} resamples of whole grids), percentile "
        f"{config.confidence_level:.0%} interval"
    )


CSV_COLUMNS = (
    "probe",
    "stage",
    "layer",
    "family",
    "group",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n",
    "n_grids",
)
"""Columns of the long-format score tables (one row per probe x group x metric)."""

BREAKDOWNS = ("by_size", "by_density", "by_variant")
"""The breakdowns of every score, in table order."""


def bootstrap_args(config: ScoreConfig, text: str) -> dict[str, Any]:
    """:func:`ratio_stats`' bootstrap keywords under ``config``, the draws seeded by
    ``config.random_state`` and a label: each table draws its own bootstrap."""
    rng = np.random.default_rng([config.random_state, zlib.crc32(text.encode())])
    return dict(n_bootstrap=config.n_bootstrap, confidence_level=config.confidence_level, rng=rng)


def trajectory_weights(den: np.ndarray, grid_ids: np.ndarray, episodes: np.ndarray) -> np.ndarray:
    """``(N, M)`` row weights ``w`` turning a ratio of sums into the study's per-grid mean (Figure
    4, appendix B eqs. 2-3): ``sum(w num) / sum(w den)`` over whole grids is the mean over grids
    of the mean over their trajectories of each trajectory's ratio (``episodes``: unique
    trajectory keys)."""
    den = np.asarray(den, dtype=np.float64)
    _, ep = np.unique(np.asarray(episodes).astype(str), return_inverse=True)
    _, grid = np.unique(np.asarray(grid_ids).astype(str), return_inverse=True)
    ep_den = np.zeros((int(ep.max()) + 1 if ep.size else 0, den.shape[1]))
    np.add.at(ep_den, ep, den)
    ep_grid = np.zeros(ep_den.shape[0], dtype=np.int64)
    ep_grid[ep] = grid
    n_eps = np.zeros((int(grid.max()) + 1 if grid.size else 0, den.shape[1]))
    np.add.at(n_eps, ep_grid, (ep_den > 0).astype(np.float64))
    scale = ep_den[ep] * n_eps[grid]
    return np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)


def ratio_stats(
    num: np.ndarray,
    den: np.ndarray,
    grid_codes: np.ndarray,
    names: Sequence[str],
    *,
    n_bootstrap: int,
    confidence_level: float,
    rng: RandomState,
    weights: np.ndarray | None = None,
) -> dict[str, dict]:
    """``{name: {"value", "ci_low", "ci_high", "n", "n_grids"}}`` of ``(N, M)`` ratio-of-sums
    columns (``den`` 0 leaves a row out) with grid-bootstrap percentile intervals (``None`` where
    undefined); a column of counts (:func:`goalprobe.stats.is_count_rate`) gets the
    cluster-adjusted exact interval, honest at 0% and 100%. ``weights``
    (:func:`trajectory_weights`) weight the sums; ``n`` counts unweighted denominators."""
    boot = GridBootstrap.from_grid_ids(
        grid_codes, n_resamples=n_bootstrap, confidence=confidence_level, random_state=rng
    )
    g_den = boot.grid_sums(den)
    if weights is not None:
        num, den = num * weights, den * weights
    samples = boot.ratio(num, den)
    out = {}
    for j, name in enumerate(names):
        stat = boot.summary(samples[:, j])
        if stat["value"] is not None and is_count_rate(num[:, j], den[:, j]):
            rate = cluster_rate_interval(boot.grid_sums(num[:, j]), g_den[:, j], confidence_level)
            stat = {k: rate[k] for k in ("value", "ci_low", "ci_high")}
        out[name] = {**stat, **den_counts(g_den[:, j])}
    return out


def den_counts(grid_den: np.ndarray) -> dict[str, int]:
    """``n`` (summed denominators) and ``n_grids`` (grids with one) of a ``(G,)`` column."""
    return {"n": int(round(grid_den.sum())), "n_grids": int(np.count_nonzero(grid_den > 0))}


def group_keys(size: np.ndarray, density: np.ndarray, variant: np.ndarray) -> dict[str, list]:
    """Breakdown name -> per-row group keys (None: the row joins no group of that breakdown)."""
    return {
        "by_size": [str(int(s)) for s in size],
        "by_density": [None if not math.isfinite(d) else f"{round(d, 6):g}" for d in density],
        "by_variant": [str(v) for v in variant],
    }


def sort_key(key: str) -> tuple:
    """Numeric group keys in numeric order, then the others alphabetically."""
    try:
        return (0, float(key), key)
    except ValueError:
        return (1, 0.0, key)


def grouped_stats(
    num: np.ndarray,
    den: np.ndarray,
    grid_ids: np.ndarray,
    groups: dict[str, list],
    names: Sequence[str],
    *,
    n_bootstrap: int,
    confidence_level: float,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> dict:
    """``overall`` and one dict per breakdown of :func:`ratio_stats` (draws continue from
    ``rng`` in that order; ``weights`` as there, whole grids fall in one group)."""
    common: dict[str, Any] = dict(
        n_bootstrap=n_bootstrap, confidence_level=confidence_level, rng=rng
    )
    out = {"overall": ratio_stats(num, den, grid_ids, names, **common, weights=weights)}
    for breakdown, table in group_rows(groups).items():
        out[breakdown] = {
            key: ratio_stats(
                num[rows],
                den[rows],
                grid_ids[rows],
                names,
                **common,
                weights=None if weights is None else weights[rows],
            )
            for key, rows in table.items()
        }
    return out


def group_rows(groups: dict[str, list]) -> dict[str, dict[str, np.ndarray]]:
    """Breakdown -> group key (in :func:`sort_key` order) -> the rows of that group."""
    out = {}
    for breakdown, keys in groups.items():
        keys_arr = np.asarray(keys, dtype=object)
        present = sorted({k for k in keys if k is not None}, key=sort_key)
        out[breakdown] = {key: np.flatnonzero(keys_arr == key) for key in present}
    return out


def groups_of(entry: Mapping[str, Any]) -> list[tuple[str, dict]]:
    """``[(group label, block)]``: ``all`` then ``size=7``, ``density=0.2``, ``variant=...``."""
    out = [("all", entry["overall"])]
    for breakdown in BREAKDOWNS:
        label = breakdown.removeprefix("by_")
        out += [(f"{label}={key}", block) for key, block in entry[breakdown].items()]
    return out


def stat_rows(base: dict, blocks: list[tuple[str, dict]], prefix: str = "") -> Iterator[dict]:
    """Long-format rows (:data:`CSV_COLUMNS`) of ``[(group, {metric: STAT})]``."""
    for group, stats in blocks:
        for metric, stat in stats.items():
            yield {**base, "group": group, "metric": prefix + metric, **stat}
