"""The belief loop on constructed data (issue 29): decoded maps whose agent and goal come from
the position read-out, the nulls sharing that read-out, the study's Agreement, per-grid
weighting, the decoded-map schema and a decoded goal following the drawn grid.

Steps are built without the code under test: grids from the generator, the agent's cell drawn at
random among open cells, the true optimal sets from ``solve``.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from goalprobe.gridworld.core import Action, CellType
from goalprobe.gridworld.false_belief import (
    STALE_GOAL,
    FalseBeliefSetConfig,
    generate_false_belief_set,
    pair_facts,
)
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.baselines import covariates
from goalprobe.probes.decoded_maps import (
    POSITION_READOUT,
    Readout,
    decode_rows,
    read_decoded_maps,
    write_decoded_maps,
)
from goalprobe.probes.position import PositionProbe
from goalprobe.probes.scoring.belief_table import (
    StepTable,
    belief_metrics,
    score_rows,
    trajectory_weights,
)
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.probes.scoring.false_belief import Bootstrap, goal_follows, oracle_table
from goalprobe.probes.scoring.nulls import fit_prior, score_nulls
from goalprobe.probes.serialization import load_probe, save_probe

CANVAS = 9
ALL = np.asarray([int(c) for c in CellType], dtype=np.uint8)


def _cells(grid, agent=None, goal=None) -> np.ndarray:
    cells = np.full((CANVAS, CANVAS), CellType.PADDING, dtype=np.int64)
    n = grid.size
    cells[:n, :n] = np.where(grid.walls, CellType.WALL, CellType.OPEN)
    if goal is not None:
        cells[goal] = CellType.GOAL
    if agent is not None:
        cells[agent] = CellType.AGENT
    return cells


def _point(cell) -> np.ndarray:
    out = np.zeros((CANVAS, CANVAS), dtype=np.float32)
    out[cell] = 1.0
    return out


def _world(density: float, optimal_share: float, seed: int, n_per_cell: int = 12):
    """Steps of an agent acting optimally with probability ``optimal_share`` (else at random),
    two episodes per grid, and per step the true map and the true agent/goal read-outs."""
    grids = generate_grid_set(
        GridSetConfig(sizes=(7,), densities=(density,), n_per_cell=n_per_cell, seed=seed)
    )
    rng = np.random.default_rng(seed)
    table = StepTable(run_id="constructed")
    truth, agents, goals, ids = [], [], [], []
    for g in grids:
        masks = solve(g).action_masks[0, 0]
        free = [
            (r, c)
            for r in range(g.size)
            for c in range(g.size)
            if not g.walls[r, c] and (r, c) != g.goal and masks[r, c].any()
        ]
        table.walls[g.grid_id] = np.asarray(g.walls, dtype=bool)
        for episode in range(2):
            for t, i in enumerate(rng.choice(len(free), size=min(5, len(free)), replace=False)):
                cell = free[int(i)]
                optimal = np.flatnonzero(masks[cell])
                if rng.random() < optimal_share:
                    action = int(rng.choice(optimal))
                else:
                    action = int(rng.integers(len(Action)))
                table.index[(g.grid_id, episode, t)] = len(table.action)
                table.action.append(action)
                table.optimal.append(tuple(bool(x) for x in masks[cell]))
                table.door_locked.append(False)
                table.size.append(g.size)
                table.density.append(float(g.density))
                table.variant.append(g.variant)
                table.episode.append(episode)
                table.agent.append(cell)
                table.goal.append(g.goal)
                table.grid_id.append(g.grid_id)
                truth.append(_cells(g, cell, g.goal))
                agents.append(_point(cell))
                goals.append(_point(g.goal))
                ids.append(g.grid_id)
    train = generate_grid_set(
        GridSetConfig(sizes=(7,), densities=(density,), n_per_cell=10, seed=seed + 100)
    )
    labels = np.stack([_cells(g, g.start, g.goal) for g in train])
    prior = fit_prior(labels, np.full(len(train), 7), np.full(len(train), float(density)))
    return {
        "table": table,
        "truth": (np.stack(truth)[..., None] == ALL).astype(np.float32),
        "agent": np.stack(agents),
        "goal": np.stack(goals),
        "grid_ids": np.asarray(ids, dtype=object),
        "prior": (prior, len(train)),
    }


def _score(world, probs, config):
    table = world["table"]
    idx = np.arange(len(table.action))
    readout = dict(agent=world["agent"], goal=world["goal"])
    scores = score_rows(probs, ALL, table.facts(idx), config.top_k, **readout)
    nulls = score_nulls(
        probs,
        ALL,
        idx,
        world["grid_ids"],
        scores,
        table,
        config,
        world["prior"],
        seed_text="loop",
        **readout,
    )
    return scores, nulls


CONFIG = ScoreConfig(n_bootstrap=500, random_state=1)


@pytest.fixture(scope="module")
def dense():
    return _world(density=0.6, optimal_share=1.0, seed=3)


def test_prior_walls_with_the_true_agent_and_goal_have_zero_excess_over_the_prior_map(dense):
    table = dense["table"]
    prior, _ = dense["prior"]
    probs = prior.predict_proba(covariates(np.asarray(table.size), np.asarray(table.density)))
    classes = prior.classes_
    full = np.zeros((*probs.shape[:3], len(ALL)), dtype=np.float32)
    full[..., np.asarray(classes, dtype=np.int64)] = probs
    _, nulls = _score(dense, full, CONFIG)
    excess = nulls["nulls"]["prior"]["excess"]
    for metric in ("acc_dec", "agreement", "acc_top3", "expected_optimality", "wall_acc_far"):
        stat = excess[metric]
        assert stat["value"] == pytest.approx(0.0, abs=1e-12), (metric, stat)
        assert not stat["above_baseline"], (metric, stat)


def test_true_walls_beat_the_prior_walls(dense):
    scores, nulls = _score(dense, dense["truth"], CONFIG)
    excess = nulls["nulls"]["prior"]["excess"]
    # the true walls make every optimal action of this (optimal) agent optimal on the map
    assert excess["acc_dec"]["value"] > 0.05 and excess["acc_dec"]["ci_low"] > 0, excess
    assert excess["agreement"]["ci_low"] > 0
    assert excess["wall_acc_near"]["value"] > 0 and excess["wall_acc_far"]["value"] > 0
    names = belief_metrics(CONFIG.top_k)
    num, den = scores
    for metric in ("acc_dec", "agent_found", "goal_found", "wall_acc_near", "wall_acc_far"):
        j = names.index(metric)
        assert num[:, j].sum() == den[:, j].sum() > 0, metric  # all right on the true map


def test_the_study_agreement_exceeds_optimal_on_both():
    # an agent that errs half the time, decoded on the true map: the two optimal policies agree
    # everywhere, while 'optimal on both' is bounded by the agent's accuracy
    world = _world(density=0.4, optimal_share=0.5, seed=8, n_per_cell=6)
    num, den = score_rows(
        world["truth"],
        ALL,
        world["table"].facts(np.arange(len(world["table"].action))),
        (1,),
        agent=world["agent"],
        goal=world["goal"],
    )
    names = belief_metrics((1,))
    rate = {m: num[:, names.index(m)].sum() / den[:, names.index(m)].sum() for m in names}
    assert rate["agreement"] == 1.0
    assert rate["optimal_on_both"] == pytest.approx(rate["acc_gt"]) and rate["acc_gt"] < 0.9


def test_the_position_read_out_places_agent_and_goal_where_the_cell_channels_do_not(dense):
    # the cell channels say 'agent' nowhere (the prior map), the read-out puts it right
    table = dense["table"]
    prior, _ = dense["prior"]
    probs = prior.predict_proba(covariates(np.asarray(table.size), np.asarray(table.density)))
    classes = prior.classes_
    idx = np.arange(len(table.action))
    names = belief_metrics((1,))
    j = names.index("agent_found")
    with_readout = score_rows(
        probs, classes, table.facts(idx), (1,), agent=dense["agent"], goal=dense["goal"]
    )
    without = score_rows(probs, classes, table.facts(idx), (1,))
    assert with_readout[0][:, j].mean() == 1.0
    assert without[0][:, j].mean() < 0.5


def test_trajectory_weights_give_the_mean_over_grids_of_episode_means():
    grid_ids = np.array(["a"] * 5 + ["b"] * 2)
    episodes = np.array(["a/0", "a/0", "a/0", "a/1", "a/1", "b/0", "b/0"])
    num = np.array([[1.0], [1.0], [0.0], [0.0], [0.0], [1.0], [1.0]])
    den = np.ones_like(num)
    w = trajectory_weights(den, grid_ids, episodes)
    value = (num * w).sum() / (den * w).sum()
    # grid a: episodes 2/3 and 0 -> 1/3; grid b: 1 -> mean 2/3 (the ratio of sums says 4/7)
    assert value == pytest.approx((1 / 3 + 1.0) / 2)


def test_a_decoded_goal_on_the_drawn_grid_is_counted_as_following_it():
    grids = generate_false_belief_set(
        FalseBeliefSetConfig(size=7, pairs_per_kind=3, kinds=(STALE_GOAL,), seed=4)
    )
    rows = []
    for grid in grids:
        facts = pair_facts(grid)
        drawn = grid.prompt_grid.goal
        probs = (_cells(grid)[..., None] == ALL).astype(np.float32)
        follows = goal_follows(grid, _point(drawn), probs)
        if facts["role"] == "false_belief":
            assert drawn != grid.goal and follows == "shown"
            assert goal_follows(grid, _point(grid.goal), probs) == "true"
            other = next(
                (r, c)
                for r in range(grid.size)
                for c in range(grid.size)
                if (r, c) not in (drawn, grid.goal)
            )
            assert goal_follows(grid, _point(other), probs) == "neither"
        else:
            assert follows == "both"
        rows.append(
            {
                "grid_id": grid.grid_id,
                "pair_id": facts["pair_id"],
                "kind": facts["kind"],
                "role": facts["role"],
                "episode": 0,
                "step": 0,
                "action": "UP",
                "opt_gt": False,
                "opt_oracle": True,
                "opt_dec": True,
                "decoded_goal": follows,
                "n_opt_gt": 1,
                "n_opt_oracle": 1,
                "follows_shown": True,
                "follows_true": False,
            }
        )
    table = oracle_table(rows, Bootstrap(n_resamples=50))
    fb = table[STALE_GOAL]["false_belief"]
    assert fb["episodes_decoded_goal_shown"]["value"] == 1.0
    assert fb["episodes_decoded_goal_true"]["value"] == 0.0
    assert fb["acc_dec_minus_gt"]["value"] == 1.0


def test_position_probe_cell_distribution_saves_and_reads_back(tmp_path):
    rng = np.random.default_rng(0)
    n = 240
    sizes = rng.choice([5, 7], n)
    pos = np.stack([rng.integers(0, s) for s in sizes] + [], axis=0)
    pos = np.stack([pos, np.array([rng.integers(0, s) for s in sizes])], axis=1)
    acts = rng.standard_normal((n, 2, 32)).astype(np.float32)
    acts[np.arange(n), -1, pos[:, 0]] += 4.0
    acts[np.arange(n), -1, 8 + pos[:, 1]] += 4.0
    probe = PositionProbe().fit(acts, pos)
    cells = probe.cell_proba(acts, sizes, CANVAS)
    assert cells.shape == (n, CANVAS, CANVAS)
    np.testing.assert_allclose(cells.sum(axis=(1, 2)), 1.0, atol=1e-9)
    for i in range(n):  # nothing outside the grid; the argmax is the predicted cell
        s = sizes[i]
        assert cells[i, s:].sum() == 0 and cells[i, :, s:].sum() == 0
    inside = (probe.predict(acts) < sizes[:, None]).all(axis=1)
    top = np.array([np.unravel_index(c.argmax(), c.shape) for c in cells])
    assert np.array_equal(top[inside], probe.predict(acts)[inside])
    save_probe(probe, tmp_path / "position_agent")
    again = load_probe(tmp_path / "position_agent")
    assert np.array_equal(again.cell_proba(acts, sizes, CANVAS), cells)


def test_decoded_maps_record_the_read_out_and_version_1_still_reads(tmp_path):
    class Cells:  # a fitted cell probe's interface: uniform over 3 classes
        classes_ = np.array([CellType.OPEN, CellType.WALL, CellType.AGENT])

        def predict_proba(self, X):
            return np.full((len(X), CANVAS, CANVAS, 3), 1 / 3, dtype=np.float32)

    rng = np.random.default_rng(1)
    acts = rng.standard_normal((40, 2, 16)).astype(np.float32)
    pos = rng.integers(0, 5, size=(40, 2))
    sizes = np.full(40, 5)
    agent = PositionProbe().fit(acts, pos)
    decoded = decode_rows(Cells(), acts, sizes, agent_probe=agent, readout=Readout(agent_probe="a"))
    assert decoded.readout.agent == POSITION_READOUT and decoded.readout.goal == "cell probe"
    assert decoded.goal is None and decoded.readout.agent_probe == "a"
    card = {"fitted": {"classes_": [int(c) for c in Cells.classes_]}, "class": "X"}
    keep = Cells.classes_.astype(np.int64)
    path = write_decoded_maps(
        tmp_path / "m.h5",
        decoded.probs[..., keep],
        np.arange(40),
        card,
        agent=decoded.agent,
        readout=decoded.readout,
        role="headline",
    )
    maps = read_decoded_maps(path)
    assert maps.schema_version == 3 and maps.readout == decoded.readout
    assert maps.goal is None and maps.attrs == {"role": "headline"}
    np.testing.assert_allclose(maps.agent, decoded.agent, atol=1e-3)
    with h5py.File(path, "a") as f:  # a version-1 file (never shipped) is refused
        f.attrs["schema_version"] = 1
    with pytest.raises(ValueError, match="schema_version 1 is not supported"):
        read_decoded_maps(path)
