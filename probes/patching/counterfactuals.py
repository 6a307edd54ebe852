"""Counterfactual grid pairs for activation patching (study, section 5.2 and appendix F).

A *base* is a state the agent acted in (a trajectory step or a grid's start). A *counterfactual*
moves its agent or goal to another open cell, so the two grid texts differ in exactly two cells
and the prompts have the same length (an agent move that would pick up the key or open the door
is skipped). ``"disjoint"`` pairs have optimal action sets that share no action; ``"control"``
pairs have identical sets (a faithful patch leaves the action). No torch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from goalprobe.gridworld.core import Action, CellType, Grid, RowCol, State
from goalprobe.gridworld.dynamics import settle
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types, render

MoveKind = Literal["agent", "goal"]
PairKind = Literal["disjoint", "control"]
MOVES: tuple[str, ...] = ("agent", "goal")


@dataclass(frozen=True, eq=False)
class BaseState:
    """A state the agent acted in, with what is known of the run on it.

    Attributes:
        grid, state: the grid (``grid.start`` is the agent's cell in ``state``) and state shown.
        base_id: ``"{run_id}/{grid_id}/{episode}/{step}"`` or the grid id.
        run_id, episode, step: the trajectory step it comes from (None for a grid's start state).
        prompt_token_ids, generated_token_ids: the recorded prompt and completion ids, or None."""

    grid: Grid
    state: State
    base_id: str
    run_id: str | None = None
    episode: int | None = None
    step: int | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    generated_token_ids: tuple[int, ...] | None = None

    @property
    def grid_id(self) -> str:
        """The grid's id (confidence intervals resample grids)."""
        return self.grid.grid_id

    @property
    def text(self) -> str:
        """The grid text shown to the agent."""
        return render(self.grid, self.state)


def base_from_grid(grid: Grid) -> BaseState:
    """The start state of ``grid`` as a base (no recorded run)."""
    state = settle(grid, grid.initial_state)
    return BaseState(grid=grid, state=state, base_id=grid.grid_id or "grid")


def base_from_step(record, *, where: str = "step") -> BaseState:
    """A trajectory step as a base, its grid rebuilt from the step's fields; ValueError naming
    ``where`` unless it renders back to exactly the recorded text."""
    from goalprobe.gridworld.text import parse

    visible, _ = parse(record.grid_text, variant=record.variant, grid_id=record.grid_id)
    agent = tuple(record.agent_row_col)
    goal = tuple(record.goal_row_col)
    if visible.start != agent or visible.goal != goal:
        raise ValueError(
            f"{where}: grid_text shows the agent at {visible.start} and the goal at "
            f"{visible.goal}, but agent_row_col={agent} and goal_row_col={goal}"
        )
    grid = Grid(
        walls=visible.walls,
        goal=goal,
        start=agent,
        key=None if record.key_row_col is None else tuple(record.key_row_col),
        door=None if record.door_row_col is None else tuple(record.door_row_col),
        variant=record.variant,
        density=record.density,
        grid_id=record.grid_id,
    )
    state = State(agent=agent, has_key=record.has_key, door_open=record.door_open)
    if render(grid, state) != record.grid_text:
        raise ValueError(
            f"{where}: the grid rebuilt from the record does not render to its grid_text"
        )
    return BaseState(
        grid=grid,
        state=state,
        base_id=f"{record.run_id}/{record.grid_id}/{record.episode}/{record.step}",
        run_id=record.run_id,
        episode=record.episode,
        step=record.step,
        prompt_token_ids=tuple(record.prompt_token_ids),
        generated_token_ids=tuple(record.generated_token_ids),
    )


@dataclass(frozen=True, eq=False)
class CounterfactualPair:
    """A base and a counterfactual that moves its agent or its goal by one placement.

    Attributes:
        pair_id: ``"{base_id}/{moved}:{row},{col}"`` (unique per base).
        base: the base state.
        cf_grid, cf_state: the counterfactual (``cf_grid.start`` is its agent's cell).
        moved: ``"agent"`` or ``"goal"``.
        from_row_col, to_row_col: the moved object's cell in the base and in the counterfactual.
        kind: ``"disjoint"`` (optimal sets share no action) or ``"control"`` (identical sets).
        base_optimal, cf_optimal: ``pi*`` of both states."""

    pair_id: str
    base: BaseState
    cf_grid: Grid
    cf_state: State
    moved: MoveKind
    from_row_col: RowCol
    to_row_col: RowCol
    kind: PairKind
    base_optimal: frozenset[Action]
    cf_optimal: frozenset[Action]

    @property
    def changed_cells(self) -> tuple[RowCol, RowCol]:
        """The two cells whose symbols differ, ``(from_row_col, to_row_col)``."""
        return (self.from_row_col, self.to_row_col)

    @property
    def cf_text(self) -> str:
        """The counterfactual grid text."""
        return render(self.cf_grid, self.cf_state)

    def to_dict(self) -> dict:
        """A JSON-ready description (ids, the move, both optimal sets, both texts)."""
        return {
            "pair_id": self.pair_id,
            "base_id": self.base.base_id,
            "grid_id": self.base.grid_id,
            "moved": self.moved,
            "from_row_col": list(self.from_row_col),
            "to_row_col": list(self.to_row_col),
            "kind": self.kind,
            "base_optimal": sorted(a.name for a in self.base_optimal),
            "cf_optimal": sorted(a.name for a in self.cf_optimal),
            "base_text": self.base.text,
            "cf_text": self.cf_text,
        }


def _classify(base_opt: frozenset[Action], cf_opt: frozenset[Action]) -> PairKind | None:
    if not cf_opt:
        return None
    if base_opt.isdisjoint(cf_opt):
        return "disjoint"
    return "control" if base_opt == cf_opt else None


def counterfactual_candidates(
    base: BaseState, *, moves: Sequence[str] = MOVES
) -> list[CounterfactualPair]:
    """Every disjoint and control counterfactual of ``base``, agent moves then goal moves (none when
    ``base`` has no optimal action)."""
    for move in moves:
        if move not in MOVES:
            raise ValueError(f"unknown move {move!r}; expected one of {MOVES}")
    grid, state = base.grid, base.state
    policy = solve(grid)
    base_opt = policy.optimal_actions(state)
    if not base_opt:
        return []
    # the cells shown as open (``_``), row-major: where an agent or goal may move
    cells = [(int(r), int(c)) for r, c in np.argwhere(cell_types(grid, state) == CellType.OPEN)]
    pairs: list[CounterfactualPair] = []
    for move in (m for m in MOVES if m in moves):
        for cell in cells:
            if move == "agent":
                cf_grid, cf_state = grid.with_start(cell), replace(state, agent=cell)
                if settle(grid, cf_state) != cf_state:
                    continue  # would pick up the key or open the door: more than two cells change
                cf_opt = policy.optimal_actions(cf_state)
            else:
                cf_grid, cf_state = replace(grid, goal=cell, start=state.agent), state
                cf_opt = solve(cf_grid).optimal_actions(state)
            kind = _classify(base_opt, cf_opt)
            if kind is not None:
                origin = state.agent if move == "agent" else grid.goal
                pairs.append(
                    _pair(base, cf_grid, cf_state, move, origin, cell, kind, base_opt, cf_opt)
                )
    return pairs


def _pair(base, cf_grid, cf_state, moved, from_cell, to_cell, kind, base_opt, cf_opt):
    pair = CounterfactualPair(
        pair_id=f"{base.base_id}/{moved}:{to_cell[0]},{to_cell[1]}",
        base=base,
        cf_grid=cf_grid,
        cf_state=cf_state,
        moved=moved,
        from_row_col=tuple(from_cell),
        to_row_col=tuple(to_cell),
        kind=kind,
        base_optimal=base_opt,
        cf_optimal=cf_opt,
    )
    diff = np.argwhere(cell_types(base.grid, base.state) != cell_types(cf_grid, cf_state))
    changed = {(int(r), int(c)) for r, c in diff}
    if changed != set(pair.changed_cells):
        raise AssertionError(
            f"{pair.pair_id}: the texts differ at {sorted(changed)}, not only at the moved cells"
        )
    return pair


@dataclass(frozen=True)
class CounterfactualConfig:
    """How many disjoint and control pairs (0: none) to draw per base and move kind, each base from
    its own stream seeded by ``random_state``."""

    moves: tuple[str, ...] = MOVES
    disjoint_per_move: int = 1
    control_per_move: int = 1
    random_state: int = 0

    def __post_init__(self) -> None:
        if not self.moves or any(m not in MOVES for m in self.moves):
            raise ValueError(f"moves must be a non-empty subset of {MOVES}, got {self.moves}")
        if self.disjoint_per_move < 0 or self.control_per_move < 0:
            raise ValueError("disjoint_per_move and control_per_move must be >= 0")


def build_counterfactuals(
    bases: Iterable[BaseState], config: CounterfactualConfig = CounterfactualConfig()
) -> list[CounterfactualPair]:
    """Per base in order, up to the configured disjoint and control pairs for each move kind, drawn
    uniformly among the candidates (seeded)."""
    out: list[CounterfactualPair] = []
    seen: set[str] = set()
    for index, base in enumerate(bases):
        if base.base_id in seen:
            raise ValueError(f"duplicate base id {base.base_id!r}")
        seen.add(base.base_id)
        rng = np.random.default_rng([config.random_state, index])
        candidates = counterfactual_candidates(base, moves=config.moves)
        for move in config.moves:
            for kind, quota in (
                ("disjoint", config.disjoint_per_move),
                ("control", config.control_per_move),
            ):
                group = [p for p in candidates if p.moved == move and p.kind == kind]
                if quota == 0 or not group:
                    continue
                picks = rng.permutation(len(group))[:quota]
                out.extend(group[i] for i in sorted(picks))
    return out
