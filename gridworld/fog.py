"""Fogged grids: the partially observable grid world of the study's Appendix A. No torch.

The agent sees the cells within a square radius (default 3: a 7 x 7 window) along lines of
sight that walls block; a seen cell stays revealed, and the prompt draws hidden cells as ``*``.
Line of sight (:func:`line_of_sight`) is Bresenham's line, clear when either direction's line
is (so visibility between open cells is symmetric); the target may be a wall. The revealed set
(:class:`FogEpisode`) is the agent's exact knowledge; :func:`free_space_actions` is the
free-space planner on it (unknown cells open, replanned each step), and
:func:`failure_modes` counts the study's A.1 failures (revisits, moves into known walls and
dead-ends).

Behaviour under fog (:func:`episode_row`, :func:`fog_summary`): a POMDP has no cheap exact
optimum here, so an episode is read against three references on the same fogged grid
(:func:`reference_rows`): the omniscient optimal policy on the true grid (the shortest path
``L``, a lower bound no fogged agent reaches in general), the free-space planner and a uniformly
random walk. Per episode: success, moves, the A.1 failure modes, and two accuracies on the moves
taken: ``fog_hits`` (a free-space optimal move on the knowledge of that step: Acc. Oracle under
fog) and ``gt_hits`` (an optimal move on the true grid: Acc. GT). Rows are pooled per policy
with grid-bootstrap intervals (grids resampled, never steps), the agent read against the random
walk, paired by grid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import accumulate
from operator import or_

import numpy as np
from goalprobe.gridworld.core import SYMBOLS, Action, CellType, Grid, RowCol, State, Variant
from goalprobe.gridworld.dynamics import moves_inside, rollout, step
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set, make_grid_id
from goalprobe.gridworld.optimal import bfs_distances, solve
from goalprobe.gridworld.text import cell_types, render_symbols

from goalprobe.stats import GridBootstrap, detectable_effect

HIDDEN_SYMBOL = "*"
"""How the prompt draws a hidden cell (the study's Fig. 11)."""

DEFAULT_RADIUS = 3
"""The study's visibility radius (cells, Chebyshev distance)."""


def bresenham(a: RowCol, b: RowCol) -> list[RowCol]:
    """The cells of Bresenham's line from ``a`` to ``b``, both ends included, in order."""
    (r0, c0), (r1, c1) = a, b
    dr, dc = abs(r1 - r0), abs(c1 - c0)
    sr = 1 if r1 >= r0 else -1
    sc = 1 if c1 >= c0 else -1
    err = dc - dr
    r, c = r0, c0
    cells = [(r, c)]
    while (r, c) != (r1, c1):
        e2 = 2 * err
        if e2 > -dr:
            err -= dr
            c += sc
        if e2 < dc:
            err += dc
            r += sr
        cells.append((r, c))
    return cells


def _clear(walls: np.ndarray, line: Sequence[RowCol]) -> bool:
    return not any(walls[cell] for cell in line[1:-1])


def line_of_sight(walls: np.ndarray, a: RowCol, b: RowCol) -> bool:
    """Whether ``b`` is visible from ``a``: Bresenham's line either way has no wall strictly
    between them."""
    return _clear(walls, bresenham(a, b)) or _clear(walls, bresenham(b, a))


def visible_cells(grid: Grid, viewer: RowCol, radius: int = DEFAULT_RADIUS) -> frozenset[RowCol]:
    """The cells the agent at ``viewer`` sees: within ``radius`` (Chebyshev) and in sight."""
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    n, (r0, c0) = grid.size, viewer
    rows = range(max(0, r0 - radius), min(n, r0 + radius + 1))
    cols = range(max(0, c0 - radius), min(n, c0 + radius + 1))
    return frozenset(
        (r, c) for r in rows for c in cols if line_of_sight(grid.walls, viewer, (r, c))
    )


def revealed_mask(grid: Grid, revealed: Iterable[RowCol]) -> np.ndarray:
    """``(n, n)`` bool, True on revealed cells."""
    mask = np.zeros((grid.size, grid.size), dtype=bool)
    for cell in revealed:
        mask[cell] = True
    return mask


def fogged_cell_types(grid: Grid, state: State, revealed: Iterable[RowCol]) -> np.ndarray:
    """What the fogged prompt shows: :func:`~goalprobe.gridworld.text.cell_types` on revealed
    cells and the agent's own cell, ``-1`` on hidden ones. ``(n, n)`` int8."""
    types = cell_types(grid, state)
    mask = revealed_mask(grid, revealed)
    mask[state.agent] = True
    return np.where(mask, types, np.int8(-1)).astype(np.int8)


def render_fogged(grid: Grid, state: State, revealed: Iterable[RowCol]) -> str:
    """The fogged grid text: the study's format with hidden cells drawn as ``*``."""
    types = fogged_cell_types(grid, state, revealed).tolist()
    symbols = [[HIDDEN_SYMBOL if t < 0 else SYMBOLS[CellType(t)] for t in row] for row in types]
    return render_symbols(np.array(symbols))


def history_text(history: Sequence[tuple[RowCol, Action]]) -> str:
    """The history of past ``(state, action)`` pairs the fogged prompt carries, one a line:
    ``(row, col) ACTION`` (the study gives the model its past state-action tuples)."""
    return "\n".join(f"({r}, {c}) {Action(a).name}" for (r, c), a in history)


@dataclass(frozen=True)
class FogEpisode:
    """The knowledge of a fogged episode, step by step."""

    grid: Grid
    """The true grid."""
    radius: int
    """The visibility radius."""
    states: tuple[State, ...]
    """The states visited, ``states[0]`` the start."""
    revealed: tuple[frozenset[RowCol], ...]
    """``revealed[t]`` the cells revealed on reaching ``states[t]`` (cumulative)."""
    actions: tuple[Action, ...]
    """The actions taken, ``len(states) - 1`` of them."""


def check_fog_grid(grid: Grid) -> None:
    """Refuse a grid that cannot be fogged: one with a key or a door (the study's Appendix A
    uses plain grids; a door's state would make the knowledge map time-dependent)."""
    if grid.key is not None or grid.door is not None:
        raise ValueError(f"grid {grid.grid_id!r}: fogged grids are plain layouts (no key or door)")


def fog_episode(grid: Grid, actions: Iterable[Action | int], radius: int = DEFAULT_RADIUS):
    """Replay ``actions`` from the start under fog: the states and the revealed sets."""
    check_fog_grid(grid)
    taken = tuple(Action(int(action)) for action in actions)
    states = [grid.initial_state]
    for action in taken:
        states.append(step(grid, states[-1], action))
    revealed = accumulate((visible_cells(grid, s.agent, radius) for s in states), or_)
    return FogEpisode(grid, radius, tuple(states), tuple(revealed), taken)


def knowledge_walls(grid: Grid, revealed: Iterable[RowCol]) -> np.ndarray:
    """The free-space map: walls where a revealed cell is a wall, open elsewhere, hidden cells
    included (the free-space assumption)."""
    return revealed_mask(grid, revealed) & grid.walls


def _target(grid: Grid, revealed: frozenset[RowCol], goal_known: bool) -> list[RowCol]:
    """Where the free-space planner heads: the goal when it is known or revealed, else the
    frontier (hidden cells next to a revealed open cell)."""
    if goal_known or grid.goal in revealed:
        return [grid.goal]
    open_cells = [cell for cell in revealed if not grid.walls[cell]]
    return sorted(
        {c for cell in open_cells for _, c in moves_inside(cell, grid.size) if c not in revealed}
    )


def free_space_actions(
    grid: Grid, state: State, revealed: frozenset[RowCol], *, goal_known: bool = True
) -> frozenset[Action]:
    """The free-space planner's optimal first moves from ``state`` on what is revealed.

    Shortest paths on :func:`knowledge_walls` (hidden cells open) to the goal, or, when the goal
    is neither known nor revealed, to the nearest frontier cell. Empty when no target is
    reachable on that map.
    """
    walls = knowledge_walls(grid, revealed)
    targets = _target(grid, revealed, goal_known)
    if not targets:
        return frozenset()
    dist = bfs_distances(walls, *targets)
    here = dist[state.agent]
    if not np.isfinite(here):
        return frozenset()
    moves = moves_inside(state.agent, grid.size)
    return frozenset(a for a, cell in moves if dist[cell] == here - 1)


def free_space_episode(
    grid: Grid, horizon: int, *, radius: int = DEFAULT_RADIUS, goal_known: bool = True
) -> FogEpisode:
    """The free-space planner's own episode (replanning each step, the lowest-valued of its
    optimal moves), up to ``horizon`` moves or the goal."""
    check_fog_grid(grid)
    state = grid.initial_state
    seen = visible_cells(grid, state.agent, radius)
    actions: list[Action] = []
    for _ in range(horizon):
        if state.agent == grid.goal:
            break
        options = free_space_actions(grid, state, seen, goal_known=goal_known)
        if not options:
            break
        actions.append(min(options))
        state = step(grid, state, actions[-1])
        seen = seen | visible_cells(grid, state.agent, radius)
    return fog_episode(grid, actions, radius)


def known_dead_end(grid: Grid, here: RowCol, target: RowCol, revealed: frozenset[RowCol]) -> bool:
    """Whether moving from ``here`` into ``target`` enters a known dead end: on the free-space
    map with ``here`` closed behind the agent, the region ``target`` belongs to is fully
    revealed and holds neither the goal nor a hidden cell, so every way on leads back."""
    walls = knowledge_walls(grid, revealed)
    if walls[target]:
        return False
    walls = walls.copy()
    walls[here] = True
    region = np.isfinite(bfs_distances(walls, target))
    if region[grid.goal]:
        return False
    mask = revealed_mask(grid, revealed)
    return bool(np.all(mask[region]))


@dataclass(frozen=True)
class FailureModes:
    """The study's failure modes under fog (A.1), counted over one episode."""

    steps: int
    """Moves taken."""
    revisits: int
    """Moves that end on a cell visited before in the episode (backtracking)."""
    into_known_walls: int
    """Moves towards a cell revealed as a wall."""
    into_known_dead_ends: int
    """Moves into a known dead end (:func:`known_dead_end`)."""


def failure_modes(episode: FogEpisode) -> FailureModes:
    """Count the failure modes of ``episode``; each move is judged on what was revealed before
    it was taken."""
    grid = episode.grid
    visited = {episode.states[0].agent}
    revisits = walls = dead_ends = 0
    for t, action in enumerate(episode.actions):
        here = episode.states[t].agent
        known = episode.revealed[t]
        target = dict(moves_inside(here, grid.size)).get(action)
        if target is None or (target in known and knowledge_walls(grid, known)[target]):
            walls += 1
        elif known_dead_end(grid, here, target, known):
            dead_ends += 1
        after = episode.states[t + 1].agent
        if after != here and after in visited:
            revisits += 1
        visited.add(after)
    return FailureModes(len(episode.actions), revisits, walls, dead_ends)


def fog_accuracy(episode: FogEpisode, *, goal_known: bool = True) -> tuple[int, int]:
    """``(moves that are a free-space optimal move on the knowledge of their step, moves)``:
    Acc. Oracle under fog, the knowledge being known exactly."""
    grid, steps = episode.grid, zip(episode.states, episode.revealed, episode.actions, strict=False)
    hits = sum(
        action in free_space_actions(grid, state, known, goal_known=goal_known)
        for state, known, action in steps
    )
    return hits, len(episode.actions)


def fog_radius(grid: Grid) -> int:
    """The visibility radius of a fogged grid (``extra["fog_radius"]``, default 3)."""
    radius = grid.extra.get("fog_radius", DEFAULT_RADIUS)
    if not isinstance(radius, int) or isinstance(radius, bool) or radius < 0:
        raise ValueError(f"grid {grid.grid_id!r}: fog_radius must be an int >= 0, got {radius!r}")
    return radius


def fog_view(
    grid: Grid, visited: Sequence[State], history: Sequence[tuple[RowCol, Action]]
) -> tuple[str, str]:
    """What the fogged prompt of the current step shows: ``(grid text, history text)``, from the
    ``visited`` states so far (current last; what any saw is revealed) and the past ``history``
    of ``(agent cell, action)`` pairs, oldest first."""
    check_fog_grid(grid)
    radius = fog_radius(grid)
    revealed = frozenset().union(*(visible_cells(grid, s.agent, radius) for s in visited))
    return render_fogged(grid, visited[-1], revealed), history_text(history)


def generate_fog_set(config: GridSetConfig, radius: int = DEFAULT_RADIUS) -> list[Grid]:
    """Fogged grids: the plain grid set of ``config`` (same layouts, starts and goals, so a
    fogged episode pairs with its fully observable one), as variant ``fog`` with ``radius``."""
    if config.variant != Variant.PLAIN:
        raise ValueError(f"fogged grids are plain layouts; got variant {config.variant!r}")
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    out = []
    for grid in generate_grid_set(config):
        size, index = grid.size, int(grid.grid_id.rsplit("i", 1)[1])
        density = float(grid.density if grid.density is not None else 0.0)
        out.append(
            replace(
                grid,
                variant=Variant.FOG,
                grid_id=make_grid_id(Variant.FOG, size, density, config.seed, index),
                extra={**grid.extra, "fog_radius": radius, "plain_grid_id": grid.grid_id},
            )
        )
    return out


def revealed_sets(grid: Grid, agent_cells: Sequence[RowCol]) -> list[frozenset[RowCol]]:
    """The cumulative revealed set on reaching each of ``agent_cells`` (the cells an episode
    visited, in order; the grid's :func:`fog_radius`)."""
    radius = fog_radius(grid)
    return list(accumulate((visible_cells(grid, c, radius) for c in agent_cells), or_))


AGENT = "agent"
FREE_SPACE = "free_space"
RANDOM_WALK = "random_walk"
POLICIES: tuple[str, ...] = (AGENT, FREE_SPACE, RANDOM_WALK)
"""The policies a fog summary compares, the agent first."""


@dataclass(frozen=True)
class FogRow:
    """One fogged episode of one policy.

    Attributes:
        grid_id: the fogged grid.
        policy: ``agent``, ``free_space`` or ``random_walk``.
        success: whether the episode reached the goal.
        moves: moves taken (valid actions; an invalid answer moves nothing and is not counted).
        shortest: the omniscient shortest path ``L`` from the start.
        revisits, into_known_walls, into_known_dead_ends: the failure modes
            (:class:`goalprobe.gridworld.fog.FailureModes`).
        fog_hits: moves that are free-space optimal on the knowledge of their step.
        gt_hits: moves that are optimal on the true grid.
    """

    grid_id: str
    policy: str
    success: bool
    moves: int
    shortest: int
    revisits: int
    into_known_walls: int
    into_known_dead_ends: int
    fog_hits: int
    gt_hits: int

    def to_dict(self) -> dict:
        return asdict(self)


_MODES = ("revisits", "into_known_walls", "into_known_dead_ends")
"""The failure modes of :class:`~goalprobe.gridworld.fog.FailureModes` a row counts."""


def episode_row(grid: Grid, actions: Sequence[Action | int], policy: str) -> FogRow:
    """Score one episode of ``policy`` on ``grid`` (the actions it took, in order)."""
    return _row(fog_episode(grid, actions, fog_radius(grid)), policy)


def _row(episode: FogEpisode, policy: str) -> FogRow:
    grid = episode.grid
    optimal = solve(grid)
    modes = failure_modes(episode)
    fog_hits, moves = fog_accuracy(episode, goal_known=False)
    gt_hits = sum(
        action in optimal.optimal_actions(state)
        for state, action in zip(episode.states, episode.actions, strict=False)
    )
    return FogRow(
        grid_id=grid.grid_id,
        policy=policy,
        success=episode.states[-1].agent == grid.goal,
        moves=moves,
        shortest=int(optimal.shortest_path_length),
        **{mode: getattr(modes, mode) for mode in _MODES},
        fog_hits=fog_hits,
        gt_hits=int(gt_hits),
    )


def reference_rows(
    grid: Grid, horizon: int, rng: np.random.Generator, n_walks: int
) -> list[FogRow]:
    """The free-space planner's episode and ``n_walks`` random walks on ``grid``, each up to
    ``horizon`` moves or the goal (the random walk draws its moves at once)."""
    radius = fog_radius(grid)
    rows = [_row(free_space_episode(grid, horizon, radius=radius, goal_known=False), FREE_SPACE)]
    for _ in range(n_walks):
        moves = rng.integers(0, 4, size=horizon).tolist()
        taken = moves[: len(rollout(grid, moves)) - 1]  # up to the goal
        rows.append(_row(fog_episode(grid, taken, radius), RANDOM_WALK))
    return rows


def _rate(boot: GridBootstrap, num: np.ndarray, den: np.ndarray, *, rate: bool) -> dict:
    """A ratio of per-grid sums: a rate of counts gets the cluster-adjusted Clopper-Pearson
    interval (honest at 0% and 100%), a mean per episode the grid-bootstrap percentile one."""
    value = float(num.sum() / den.sum()) if den.sum() else None
    if rate and den.sum():
        bounds = {k: boot.rate_summary(num, den)[k] for k in ("ci_low", "ci_high")}
        return {"value": value, **bounds, "n": int(den.sum())}
    return {**boot.summary(boot.ratio(num, den)), "value": value, "n": int(den.sum())}


def fog_summary(rows: Sequence[FogRow], *, n_resamples: int = 1000, random_state: int = 0) -> dict:
    """Per policy: success rate, moves per successful episode over ``L``, failure modes per
    episode, Acc. Oracle under fog and Acc. GT (pooled over moves), each with a 95%
    grid-bootstrap interval; and the agent's Acc. Oracle minus the random walk's, paired by
    grid (same resamples), with its verdict."""
    grid_ids = sorted({r.grid_id for r in rows})
    boot = GridBootstrap.from_grid_ids(grid_ids, n_resamples=n_resamples, random_state=random_state)
    code = {g: i for i, g in enumerate(grid_ids)}
    out: dict[str, dict] = {}
    per_policy: dict[str, Mapping[str, np.ndarray]] = {}
    for policy in POLICIES:
        mine = [r for r in rows if r.policy == policy]
        if not mine:
            continue
        counted = ("success", "moves", "fog_hits", "gt_hits", *_MODES)
        keys = ("episodes", *counted, "success_moves", "success_shortest")
        sums = {key: np.zeros(len(grid_ids)) for key in keys}
        for r in mine:
            i = code[r.grid_id]
            sums["episodes"][i] += 1
            for key in counted:
                sums[key][i] += getattr(r, key)
            if r.success:
                sums["success_moves"][i] += r.moves
                sums["success_shortest"][i] += r.shortest
        per_policy[policy] = sums
        out[policy] = {
            "episodes": len(mine),
            "success": _rate(boot, sums["success"], sums["episodes"], rate=True),
            "acc_oracle_fog": _rate(boot, sums["fog_hits"], sums["moves"], rate=True),
            "acc_gt": _rate(boot, sums["gt_hits"], sums["moves"], rate=True),
            "moves_over_shortest": _rate(
                boot, sums["success_moves"], sums["success_shortest"], rate=False
            ),
            **{
                f"{mode}_per_episode": _rate(boot, sums[mode], sums["episodes"], rate=False)
                for mode in _MODES
            },
        }
    if AGENT in per_policy and RANDOM_WALK in per_policy:
        a, w = per_policy[AGENT], per_policy[RANDOM_WALK]
        diff = boot.ratio(a["fog_hits"], a["moves"]) - boot.ratio(w["fog_hits"], w["moves"])
        summary = boot.summary(diff)
        lo, hi = summary.get("ci_low"), summary.get("ci_high")
        # a zero-width interval detects any difference (stats' version falls back on n there)
        mde = 0.0 if lo is not None and lo == hi else detectable_effect(lo, hi)
        out["agent_minus_random_walk_acc_oracle_fog"] = {
            **summary,
            "verdict": "yes" if lo is not None and lo > 0 else "undecided",
            "detectable_effect": mde,
        }
    return out


def fog_readings(
    rows: Sequence[FogRow],
    cut_rows: Sequence[FogRow],
    *,
    n_resamples: int = 1000,
    random_state: int = 0,
) -> dict:
    """:func:`fog_summary` of ``rows`` (the agent's finished episodes and the references), its
    agent-minus-random-walk difference with ``truncated_episodes`` and ``with_truncated``: the
    same difference with ``cut_rows`` (the agent's episodes the token limit cut off, scored on
    the moves made before the cut, no success) counted in, so both readings are reported."""
    table = fog_summary(rows, n_resamples=n_resamples, random_state=random_state)
    key = "agent_minus_random_walk_acc_oracle_fog"
    if key in table:
        diff = table[key]
        with_cut = (
            fog_summary([*rows, *cut_rows], n_resamples=n_resamples, random_state=random_state)[key]
            if cut_rows
            else dict(diff)
        )
        diff["truncated_episodes"] = len(cut_rows)
        diff["with_truncated"] = with_cut
    return table
