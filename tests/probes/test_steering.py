"""The steering test (issue 39 item 6): the edited map, the calibration on planted directions,
and the verdict on constructed outcomes where it must say yes and where it must say no."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import Action, CellType, Grid, State
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.steering import (
    CONDITIONS,
    SteeringConfig,
    calibrate,
    choose_edits,
    directions,
    fit_probe,
    summarise,
    toggled,
)
from goalprobe.probes.wall_test import offsets


def _open_grid(n=7, agent=(3, 3), goal=(3, 5)) -> Grid:
    walls = np.zeros((n, n), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    return Grid(walls=walls, goal=goal, start=agent, density=0.0, grid_id="g")


def test_the_target_edit_makes_a_non_optimal_action_optimal_and_the_irrelevant_one_does_not():
    grid = _open_grid()
    state = State(agent=(3, 3))
    assert solve(grid).optimal_actions(state) == {Action.RIGHT}
    alpha = [1.0] * len(offsets(1))
    for seed in range(5):
        target, other = choose_edits(grid, state, alpha, np.random.default_rng(seed))
        true_opt = solve(grid).optimal_actions(state)
        assert target.optimal - true_opt  # a new action becomes optimal
        assert target.optimal == solve(toggled(grid, target.cell)).optimal_actions(state)
        assert tuple(np.abs(np.subtract(target.cell, state.agent))) in {(0, 1), (1, 0)}
        assert solve(toggled(grid, other.cell)).optimal_actions(state) == true_opt
        assert other.cell != target.cell and max(np.abs(np.subtract(other.cell, (3, 3)))) == 1
    # the only neighbour that matters here is the open step towards the goal: adding a wall there
    assert target.cell == (3, 4) and target.add


def test_a_removed_wall_that_opens_a_shorter_path_is_a_target():
    walls = np.zeros((7, 7), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    walls[1:5, 4] = True  # a wall between A and G, passable below row 4
    grid = Grid(walls=walls, goal=(2, 5), start=(2, 3), density=0.5, grid_id="w")
    state = State(agent=(2, 3))
    assert solve(grid).optimal_actions(state) == {Action.DOWN}
    drawn = {}
    for seed in range(20):
        target, _ = choose_edits(grid, state, [1.0] * 8, np.random.default_rng(seed))
        drawn[target.cell] = target
    # removing the wall to the right opens the direct path; blocking the only optimal step
    # below is the other candidate
    assert set(drawn) == {(2, 4), (3, 3)}
    assert not drawn[(2, 4)].add and drawn[(2, 4)].optimal == {Action.RIGHT}
    assert drawn[(3, 3)].add and Action.DOWN not in drawn[(3, 3)].optimal


def test_a_state_without_a_candidate_is_dropped_with_its_reason():
    grid = _open_grid()
    assert choose_edits(grid, State(agent=(3, 3)), [None] * 8, np.random.default_rng(0)) == (
        "no neighbour whose toggle makes a non-optimal action optimal"
    )


def _planted(n_rows=600, d=24, strength=3.0, seed=0):
    """Anchors carrying the wall right of the agent along a planted direction."""
    rng = np.random.default_rng(seed)
    planted = rng.standard_normal(3 * d)
    planted /= np.linalg.norm(planted)
    acts, types, sizes, dens, agents, ids = [], [], [], [], [], []
    for i in range(n_rows):
        g = i // 3
        grid_rng = np.random.default_rng([seed, g])
        walls = grid_rng.random((7, 7)) < 0.3
        walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
        walls[3, 3] = False
        cells = np.where(walls, CellType.WALL, CellType.OPEN).astype(np.uint8)
        canvas = np.full((15, 15), CellType.PADDING, dtype=np.uint8)
        canvas[:7, :7] = cells
        x = rng.standard_normal(3 * d) + strength * walls[3, 4] * planted
        acts.append(x.reshape(3, d))
        types.append(canvas)
        sizes.append(7)
        dens.append(0.4)
        agents.append((3, 3))
        ids.append(f"g{g}")
    arrays = (np.array(acts), np.array(types), np.array(sizes), np.array(dens), np.array(agents))
    return (*arrays, np.array(ids)), planted


def test_the_direction_of_a_planted_wall_is_found_and_its_strength_flips_the_read_out():
    (acts, types, sizes, dens, agents, ids), planted = _planted()
    config = SteeringConfig()
    probe, cal = fit_probe(acts, types, sizes, dens, agents, ids, config)
    right = offsets(1).tolist().index([0, 1])
    unit, gain = directions(probe)
    assert abs(unit[right] @ planted) > 0.8 and gain[right] > 0
    assert cal["gap"][right] > 1.0  # about the planted strength along the direction
    assert cal["train_flip"][right] >= config.flip_target
    assert cal["alpha"][right] == pytest.approx(cal["multiple"][right] * cal["gap"][right])


def test_no_planted_direction_gives_no_strength_worth_the_name():
    (acts, types, sizes, dens, agents, ids), _ = _planted(strength=0.0)
    from goalprobe.probes.wall_test import wall_inputs

    config = SteeringConfig()
    probe, _ = fit_probe(acts, types, sizes, dens, agents, ids, config)
    cal = calibrate(probe, wall_inputs(acts, sizes, dens, agents), types, config)
    right = offsets(1).tolist().index([0, 1])
    # without a planted wall the head flips few rows even at the largest multiple
    assert cal["train_flip"][right] is None or cal["train_flip"][right] < config.flip_target


def _records(
    rates: dict[str, float], n_states: int, per_grid: int, seed: int = 0, flip: float = 0.95
) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_states):
        success = {c: bool(rng.random() < rates.get(c, 0.0)) for c in CONDITIONS}
        out.append({
            "grid_id": f"g{i // per_grid}",
            "success": success,
            "invalid": dict.fromkeys(CONDITIONS, False),
            "target_uncertain": True,
            "target_train_flip": flip,
            "read_before": 0.2,
            "read_after": {"probe": 0.8, "random": 0.2, "irrelevant": 0.2},
        })  # fmt: skip
    return out


def test_the_verdict_says_yes_when_the_probe_edit_moves_the_action_beyond_both_controls():
    records = _records({"probe": 0.8, "random": 0.05, "irrelevant": 0.1}, 80, 2)
    out = summarise(records, {}, SteeringConfig(n_bootstrap=400))
    assert out["verdict"] == "yes"
    for c in ("random", "irrelevant"):
        d = out["differences"][c]
        assert d["ci_low"] > 0 and d["n"] == 80 and d["n_grids"] == 40
    assert out["tested"]["p_draws"] < 0.05
    assert out["rates"]["probe"]["ci_low"] > out["rates"]["random"]["ci_high"]
    assert out["read_flip"] == {"probe": 1.0, "random": 0.0, "irrelevant": 0.0, "n": 80}


def test_the_verdict_says_no_when_the_probe_edit_does_no_more_than_a_control_at_a_large_n():
    records = _records({"probe": 0.1, "random": 0.1, "irrelevant": 0.1}, 600, 3)
    out = summarise(records, {}, SteeringConfig(n_bootstrap=400))
    assert out["verdict"] == "no"
    assert out["detectable"] is not None and out["detectable"] < 0.15


def test_the_verdict_is_not_yes_when_only_one_control_is_beaten():
    records = _records({"probe": 0.8, "random": 0.05, "irrelevant": 0.8}, 80, 2)
    out = summarise(records, {}, SteeringConfig(n_bootstrap=400))
    assert out["verdict"] != "yes"
    assert out["tested"]["control"] == "irrelevant"


def test_zero_successes_everywhere_is_never_yes_and_has_an_honest_interval():
    records = _records({}, 12, 1)
    out = summarise(records, {"unedited action not optimal": 3}, SteeringConfig(n_bootstrap=200))
    assert out["verdict"] in ("no", "undecided")
    rate = out["rates"]["probe"]
    assert rate["value"] == 0 and rate["ci_low"] == 0 and rate["ci_high"] > 0.2
    d = out["differences"]["random"]
    assert d["ci_low"] < 0 < d["ci_high"]  # every grid agrees on 0, yet the interval has width
    assert out["dropped"] == {"unedited action not optimal": 3}


def test_no_state_kept_is_undecided():
    out = summarise([], {"no irrelevant ring-1 cell": 4}, SteeringConfig())
    assert out["verdict"] == "undecided" and out["n_states"] == 0


def test_an_edit_that_cannot_flip_the_probe_read_out_is_undecided_not_no():
    """A probe with nothing to read (the default agent's walls): the strongest edit flips its
    read-out on few training rows, so an unmoved action says nothing about its direction."""
    records = _records({"probe": 0.1, "random": 0.1, "irrelevant": 0.1}, 600, 3, flip=0.02)
    out = summarise(records, {}, SteeringConfig(n_bootstrap=400))
    assert out["verdict"] == "undecided" and "no direction to test" in out["reason"]
    assert out["target_train_flip"] == pytest.approx(0.02)


@pytest.mark.parametrize(
    "bad",
    [{"multiples": ()}, {"multiples": (2.0, 1.0)}, {"flip_target": 0.0}, {"max_states": 0},
     {"radius": 0}, {"batch_size": 0}],
)  # fmt: skip
def test_a_bad_setting_is_refused(bad):
    with pytest.raises(ValueError):
        SteeringConfig(**bad)
