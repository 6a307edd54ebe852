"""Policy against decoded belief: hand-built cases with known answers."""

import numpy as np
import pytest
from belief_reference import point_values
from goalprobe.gridworld.core import Action, CellType, Grid, State
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import padded_cell_types
from goalprobe.probes.scoring.belief import (
    StepBelief,
    belief_weighted_scores,
    optimal_mask_for_pair,
    score_step,
    topk_optimal_mask,
)

N_CLASSES = 7


def one_hot_map(cell_map: np.ndarray, sharp: float = 0.9) -> np.ndarray:
    """Probabilities that put ``sharp`` on the labelled class and spread the rest."""
    probs = np.full(cell_map.shape + (N_CLASSES,), (1 - sharp) / (N_CLASSES - 1))
    np.put_along_axis(probs, cell_map[..., None].astype(int), sharp, axis=-1)
    return probs


def open_room(n: int = 5, start=(1, 1), goal=(1, 3)) -> Grid:
    walls = np.zeros((n, n), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    return Grid(walls=walls, goal=goal, start=start)


def test_pair_mask_matches_exact_solver_on_true_map():
    grid = open_room(7, start=(1, 1), goal=(4, 5))
    policy = solve(grid)
    for row in range(1, 6):
        for col in range(1, 6):
            if (row, col) == grid.goal:
                continue
            expected = policy.action_mask(State(agent=(row, col)))
            got = optimal_mask_for_pair(grid.walls, (row, col), grid.goal)
            assert np.array_equal(expected, got), (row, col)


def test_decoded_equals_true_when_probe_is_perfect():
    grid = open_room(5, start=(1, 1), goal=(3, 3))
    probs = one_hot_map(padded_cell_types(grid), sharp=0.99999)
    true_opt = solve(grid).action_mask(grid.initial_state)
    for action in Action:
        score = score_step(StepBelief(probs, 5, int(action), true_opt))
        assert score.opt_gt == score.opt_dec == bool(true_opt[action])
        assert score.belief.expected_optimality == pytest.approx(float(true_opt[action]), abs=1e-3)


def test_recovery_when_decoded_goal_is_elsewhere():
    # true goal to the right; the probe believes the goal is below the agent
    grid = open_room(5, start=(1, 1), goal=(1, 3))
    believed = open_room(5, start=(1, 1), goal=(3, 1))
    probs = one_hot_map(padded_cell_types(believed))
    true_opt = solve(grid).action_mask(grid.initial_state)
    down = score_step(StepBelief(probs, 5, int(Action.DOWN), true_opt))
    right = score_step(StepBelief(probs, 5, int(Action.RIGHT), true_opt))
    assert (down.opt_gt, down.opt_dec) == (False, True)
    assert (right.opt_gt, right.opt_dec) == (True, False)
    table = point_values([down, right])
    assert table["acc_gt"][0] == 0.5
    assert table["acc_dec"][0] == 0.5
    assert table["agreement"][0] == 0.0
    assert table["recovery"][0] == 1.0  # the one GT-suboptimal action is decoded-optimal
    assert table["inverse_recovery"][0] == 1.0


def test_topk_includes_second_goal_candidate():
    probs = one_hot_map(padded_cell_types(open_room(5, start=(1, 1), goal=(3, 1))))
    probs[1, 3, CellType.GOAL] = 0.5  # the true goal is the runner-up goal cell
    assert not topk_optimal_mask(probs, 5, 1)[Action.RIGHT]
    assert topk_optimal_mask(probs, 5, 3)[Action.RIGHT]
    assert topk_optimal_mask(probs, 5, 3)[Action.DOWN]


def test_blocked_move_is_never_optimal_and_walls_are_respected():
    grid = open_room(5, start=(1, 1), goal=(3, 3))
    walls = grid.walls.copy()
    walls[1, 2] = True
    mask = optimal_mask_for_pair(walls, (1, 1), (3, 3))
    assert mask.tolist() == [False, True, False, False]  # only DOWN
    assert not optimal_mask_for_pair(walls, (3, 3), (3, 3)).any()


def test_belief_weighted_splits_between_two_goals():
    grid = open_room(5, start=(1, 1), goal=(1, 3))
    probs = one_hot_map(padded_cell_types(grid), sharp=0.99999)
    probs[..., CellType.GOAL] = 0.0
    probs[1, 3, CellType.GOAL] = 0.7
    probs[3, 1, CellType.GOAL] = 0.3

    def score(action):
        return belief_weighted_scores(probs, 5, int(action), mass=0.9999)

    # hand computation, Q(u) = -(1 + distance after u); both goals are 2 steps away:
    # RIGHT: 0.7 * -2 + 0.3 * -4 = -2.6; DOWN: 0.7 * -4 + 0.3 * -2 = -3.4; UP/LEFT bump: -3
    right = score(Action.RIGHT)
    assert right.q_bar == pytest.approx([-3.0, -3.4, -3.0, -2.6], abs=1e-3)
    assert right.qmdp_optimal.tolist() == [False, False, False, True]
    assert right.expected_optimality == pytest.approx(0.7, abs=1e-3)
    assert right.qmdp_regret == pytest.approx(0.0, abs=1e-9)
    assert score(Action.DOWN).expected_optimality == pytest.approx(0.3, abs=1e-3)
    assert score(Action.DOWN).qmdp_regret == pytest.approx(0.8, abs=1e-3)
    assert score(Action.UP).qmdp_regret == pytest.approx(0.4, abs=1e-3)
    assert score(Action.UP).expected_optimality < 1e-3


def test_invalid_action_is_not_optimal():
    grid = open_room()
    probs = one_hot_map(padded_cell_types(grid))
    s = score_step(StepBelief(probs, 5, None, np.ones(4, dtype=bool)))
    assert not s.opt_gt and not s.opt_dec and not any(s.opt_topk.values())


def test_belief_weighted_matches_brute_force_over_all_pairs():
    """The vectorised belief-weighted score equals the sum over every (agent, goal) pair of
    the scalar reference :func:`optimal_mask_for_pair`, on random 5 x 5 beliefs."""
    from goalprobe.probes.scoring.belief import (
        belief_weighted_scores,
        decoded_walls,
        optimal_mask_for_pair,
    )

    rng = np.random.default_rng(3)
    n = 5
    for trial in range(20):
        logits = rng.normal(size=(15, 15, 7)) * 2.0
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        action = int(rng.integers(4))
        got = belief_weighted_scores(probs, n, action, mass=1.0, max_cells=n * n)
        walls = decoded_walls(probs, n)
        pa = probs[:n, :n, 3] / probs[:n, :n, 3].sum()
        pg = probs[:n, :n, 2] / probs[:n, :n, 2].sum()
        num = den = 0.0
        for agent in np.ndindex(n, n):
            for goal in np.ndindex(n, n):
                if agent != goal:
                    weight = pa[agent] * pg[goal]
                    num += weight * optimal_mask_for_pair(walls, agent, goal)[action]
                    den += weight
        assert got.expected_optimality == pytest.approx(num / den, abs=1e-9), trial


def test_shared_bfs_cache_gives_the_same_scores_and_is_shared():
    """The cache a caller passes (keyed by decoded walls) changes no score; steps that decode
    the same walls share one entry, different walls get their own."""
    rng = np.random.default_rng(3)
    walls = open_room(7).walls.copy()
    walls[3, 1:4] = True  # a second wall map
    rooms = [open_room(7, start=(1, 1), goal=(5, 5)), Grid(walls=walls, goal=(1, 5), start=(2, 3))]
    cache: dict = {}
    for step in range(24):
        grid = rooms[step % 2]
        probs = one_hot_map(padded_cell_types(grid), sharp=float(rng.uniform(0.5, 0.99)))
        probs = probs * rng.uniform(0.8, 1.2, probs.shape)  # agent/goal read-outs vary
        action = int(rng.integers(4))
        true_opt = solve(grid).action_mask(grid.initial_state)
        alone = score_step(StepBelief(probs, 7, action, true_opt), (1, 3))
        shared = score_step(StepBelief(probs, 7, action, true_opt), (1, 3), cache)
        assert alone.opt_dec == shared.opt_dec and alone.opt_topk == shared.opt_topk
        assert alone.agreement == shared.agreement
        assert np.array_equal(alone.dec_optimal, shared.dec_optimal)
        assert alone.belief.expected_optimality == shared.belief.expected_optimality
        assert np.array_equal(alone.belief.q_bar, shared.belief.q_bar)
    assert len(cache) == 2
