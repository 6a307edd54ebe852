"""Harm grids: the generator's guarantees (checked by brute force), the text and grid-set formats
with flower beds, the harm prompts, and the random agent."""

from __future__ import annotations

import json
from collections import deque

import numpy as np
import pytest
from goalprobe.agents.harmony import render_prompt
from goalprobe.agents.prompts import PromptTemplate, build_messages
from goalprobe.agents.tokenizer import load_tokenizer, unknown_pieces
from goalprobe.gridworld.core import CellType, Grid, Variant
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.harm import (
    HarmGridConfig,
    HarmProfile,
    generate_harm_grid,
    generate_harm_grids,
    harm_count,
    harm_free_grid,
    harm_profile,
    random_harm_counts,
)
from goalprobe.gridworld.io import read_grid_set, write_grid_set
from goalprobe.gridworld.optimal import build_mdp, solve
from goalprobe.gridworld.text import cell_types, parse, render
from hypothesis import given, settings
from hypothesis import strategies as st

BUNDLED = "agents/bundled"


def expected_random_harm(grid: Grid, horizon: int) -> float:
    """The exact expected harm count of the uniformly random agent (what
    :func:`random_harm_counts` estimates), from the state distribution of the grid MDP."""
    mdp = build_mdp(grid, horizon=horizon)
    uniform = mdp.transitions.mean(axis=1)  # (S, S) under uniform actions
    harm = set(grid.harm)
    harmful = np.array([s.agent in harm for s in mdp.states], dtype=np.float64)
    occupancy = mdp.initial.copy()
    total = 0.0
    for _ in range(horizon):
        occupancy = occupancy @ uniform
        total += float(occupancy @ harmful)
    return total


def check_harm_grid(grid: Grid, config: HarmGridConfig) -> HarmProfile:
    """The profile of ``grid``, raising ``ValueError`` when it breaks a guarantee of
    :func:`generate_harm_grid`."""
    profile = harm_profile(grid)
    if not profile.harm_free_length > profile.shortest_length:
        raise ValueError(f"grid {grid.grid_id!r}: a shortest path avoids every harm cell")
    if profile.detour > config.max_detour:
        raise ValueError(f"grid {grid.grid_id!r}: detour {profile.detour} > {config.max_detour}")
    if profile.harm_free_length > solve(grid).horizon:
        raise ValueError(f"grid {grid.grid_id!r}: the harm-free path exceeds the episode budget")
    return profile


def _bfs(walls: np.ndarray, source) -> dict:
    n = walls.shape[0]
    dist = {source: 0}
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= nr < n and 0 <= nc < n and not walls[nr, nc] and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist


def _shortest_paths(grid: Grid) -> list[list]:
    """Every shortest start-goal path, enumerated."""
    to_goal = _bfs(grid.walls, grid.goal)
    paths = []

    def extend(path):
        r, c = path[-1]
        if (r, c) == grid.goal:
            paths.append(path)
            return
        for nxt in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if to_goal.get(nxt) == to_goal[(r, c)] - 1:
                extend([*path, nxt])

    extend([grid.start])
    return paths


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.sampled_from([7, 9]),
    density=st.sampled_from([0.0, 0.2, 0.4]),
    max_detour=st.integers(2, 4),
    n_layers=st.integers(1, 2),
)
def test_every_shortest_path_is_harmful_and_a_bounded_detour_is_not(
    seed, size, density, max_detour, n_layers
):
    config = HarmGridConfig(
        size=size, density=density, max_detour=max_detour, n_layers=n_layers, min_distance=5
    )
    grid = generate_harm_grid(config, np.random.default_rng(seed), grid_id="h")
    harm = set(grid.harm)
    assert harm and not any(grid.walls[c] for c in harm)
    assert not harm & {grid.start, grid.goal}
    paths = _shortest_paths(grid)
    length = len(paths[0]) - 1
    assert length >= config.min_distance
    least = min(sum(cell in harm for cell in p) for p in paths)
    assert least >= n_layers
    walls = grid.walls.copy()
    for cell in harm:
        walls[cell] = True
    free = _bfs(walls, grid.start)[grid.goal]  # a KeyError would mean no harm-free path
    assert length < free <= length + max_detour
    assert free <= solve(grid).horizon  # the detour fits the episode budget
    profile = harm_profile(grid)
    assert (profile.shortest_length, profile.harm_free_length) == (length, free)
    assert profile.min_harm_on_shortest_path == least
    assert check_harm_grid(grid, config) == profile


def test_grid_sets_are_seeded_and_regenerable():
    config = HarmGridConfig(n_grids=6, seed=3)
    first, again = generate_harm_grids(config), generate_harm_grids(config)
    assert first == again and [g.grid_id for g in first] == [g.grid_id for g in again]
    assert len({g.grid_id for g in first}) == 6
    assert all(g.variant == Variant.HARM for g in first)
    other = generate_harm_grids(HarmGridConfig(n_grids=6, seed=4))
    assert first != other
    lone = generate_harm_grid(
        config, np.random.default_rng(first[2].seed), grid_id=first[2].grid_id
    )
    assert lone == first[2]


def test_a_tree_maze_has_no_detour():
    with pytest.raises(ValueError, match="detour"):
        generate_harm_grid(
            HarmGridConfig(density=1.0, max_attempts=5), np.random.default_rng(0), grid_id="x"
        )


def test_harm_cells_are_validated():
    base = generate_grid(7, 0.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="overlaps"):
        Grid(walls=base.walls, start=base.start, goal=base.goal, harm=(base.goal,))
    with pytest.raises(ValueError, match="wall"):
        Grid(walls=base.walls, start=base.start, goal=base.goal, harm=((0, 0),))


def test_text_and_grid_set_round_trip_with_flower_beds(tmp_path):
    grids = generate_harm_grids(HarmGridConfig(n_grids=3))
    for grid in grids:
        text = render(grid)
        assert text.count(" F") == len(grid.harm)
        parsed, _ = parse(text, grid_id=grid.grid_id)
        assert parsed == grid and parsed.variant == Variant.HARM
        types = cell_types(grid)
        assert sorted(zip(*np.nonzero(types == CellType.HARM), strict=True)) == list(grid.harm)
    path = tmp_path / "harm.jsonl"
    write_grid_set(path, grids)
    record = json.loads(path.read_text().splitlines()[0])
    assert record["schema"] == "goalprobe.gridset/2"
    assert record["harm_cells"] == [list(c) for c in grids[0].harm]
    back = read_grid_set(path)
    assert back == grids and [g.harm for g in back] == [g.harm for g in grids]


def test_harm_count_counts_steps_ending_on_flower_beds():
    grid = generate_harm_grids(HarmGridConfig(n_grids=1))[0]
    policy = solve(grid)
    states, _ = policy.optimal_trajectory()
    assert harm_count(grid, states) == sum(s.agent in grid.harm for s in states)
    assert harm_count(grid, states) >= harm_profile(grid).min_harm_on_shortest_path
    free_states, _ = solve(harm_free_grid(grid)).optimal_trajectory()
    assert harm_count(grid, free_states) == 0


def test_random_agent_matches_its_exact_expectation():
    for grid in generate_harm_grids(HarmGridConfig(n_grids=3)):
        horizon = solve(grid).horizon
        counts = random_harm_counts(grid, horizon, 4000, np.random.default_rng(0))
        exact = expected_random_harm(grid, horizon)
        assert exact > 0
        sem = counts.std() / np.sqrt(counts.size)
        assert abs(counts.mean() - exact) < 4 * sem + 1e-9


def test_harm_prompts_and_what_the_bundled_tokenizer_knows():
    grid = generate_harm_grids(HarmGridConfig(n_grids=1))[0]
    text = render(grid)
    neutral = build_messages(text, variant=grid.variant, has_key=False)
    moral = build_messages(text, variant=grid.variant, has_key=False, moral_conditioning=True)
    assert neutral[1] == moral[1] and text in neutral[1].content
    template = PromptTemplate.default()
    assert "F flower bed" in neutral[0].content and "{{moral}}" not in neutral[0].content
    assert template.moral_harm not in neutral[0].content
    assert template.moral_harm in moral[0].content
    assert moral[0].content.replace(template.moral_harm + "\n", "") == neutral[0].content
    # the plain prompt is untouched by the moral flag
    plain = build_messages(text, variant=Variant.PLAIN, has_key=False, moral_conditioning=True)
    assert plain[0].content == template.instructions_plain
    # the bundled agent's word-level vocabulary never saw the flower beds: F is [UNK]
    tokenizer = load_tokenizer(BUNDLED)
    unknown = unknown_pieces(tokenizer, render_prompt(neutral, "low"))
    assert " F" in unknown and " flower" in unknown
    assert (
        unknown_pieces(
            tokenizer,
            render_prompt(
                build_messages(render(harm_free_grid(grid)), variant=Variant.PLAIN, has_key=False),
                "low",
            ),
        )
        == []
    )


def test_template_directories_without_harm_files_cannot_prompt_harm_grids(tmp_path):
    from goalprobe.agents.prompts import TEMPLATE_FILES

    template = PromptTemplate.default()
    for name, filename in TEMPLATE_FILES.items():
        (tmp_path / filename).write_text(getattr(template, name) + "\n")
    loaded = PromptTemplate.from_dir(tmp_path)
    assert loaded.instructions_harm is None
    grid = generate_harm_grids(HarmGridConfig(n_grids=1))[0]
    with pytest.raises(ValueError, match="cannot prompt harm grids"):
        build_messages(render(grid), variant=grid.variant, has_key=False, template=loaded)
    (tmp_path / "instructions_harm.txt").write_text("no placeholder\n")
    (tmp_path / "moral_harm.txt").write_text("avoid F\n")
    with pytest.raises(ValueError, match="exactly once"):
        PromptTemplate.from_dir(tmp_path)


def test_o200k_gives_one_token_per_cell_with_flower_beds(o200k_tokenizer):
    ids = o200k_tokenizer("3 # _ F _ A F #\n", add_special_tokens=False)["input_ids"]
    pieces = [o200k_tokenizer.decode([i]) for i in ids]
    assert pieces == ["3", " #", " _", " F", " _", " A", " F", " #\n"]
