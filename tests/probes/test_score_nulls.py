"""Nulls of the belief scores (goalprobe.probes.scoring.nulls) on constructed steps with known answers.

Steps are built without the code under test: grids from the generator, a noisy agent at random
open cells (an optimal action with probability 0.6, else a uniformly random one), the true optimal
sets from ``solve``. Three kinds of decoded maps:

* ``truth``: the one-hot true map of the step (agent and goal where they are). Its decoded
  optimal actions are the true ones, so Acc Dec beats any map that knows nothing of the step;
* ``believed``: the true map with the goal on the cell the action moves to (when that cell is
  open). The action is then the decoded grid's unique optimal action, so Recovery beats any
  uninformative map;
* ``random``: Dirichlet noise, independent of the step. The ``other_grid`` null of random maps is
  random maps again (same distribution), so the excess must be zero within its interval.
"""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import Action, CellType
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.scoring.belief_table import (
    StepTable,
    belief_metrics,
    score_rows,
    trajectory_weights,
)
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.probes.scoring.nulls import fit_prior, other_grid_sources, score_nulls

CANVAS = 9
ALL_CLASSES = np.asarray([int(c) for c in CellType], dtype=np.uint8)
STEPS_PER_GRID = 8


def _canvas(grid, agent, goal) -> np.ndarray:
    cells = np.full((CANVAS, CANVAS), CellType.PADDING, dtype=np.int64)
    n = grid.size
    cells[:n, :n] = np.where(grid.walls, CellType.WALL, CellType.OPEN)
    cells[goal] = CellType.GOAL
    cells[agent] = CellType.AGENT
    return cells


def _one_hot(cells: np.ndarray) -> np.ndarray:
    return (cells[..., None] == ALL_CLASSES).astype(np.float32)


def _steps(grids, rng):
    """A step table of noisy actions at random cells, with the three kinds of maps."""
    table = StepTable(run_id="synthetic")
    truth, believed, grid_ids = [], [], []
    for g in grids:
        masks = solve(g).action_masks[0, 0]
        free = [
            (r, c)
            for r in range(g.size)
            for c in range(g.size)
            if not g.walls[r, c] and (r, c) != g.goal
        ]
        for k, i in enumerate(rng.choice(len(free), size=STEPS_PER_GRID, replace=False)):
            cell = free[int(i)]
            optimal = np.flatnonzero(masks[cell])
            if rng.random() < 0.6:
                action = int(rng.choice(optimal))
            else:
                action = int(rng.integers(len(Action)))
            table.index[(g.grid_id, 0, k)] = len(table.action)
            table.action.append(action)
            table.optimal.append(tuple(bool(x) for x in masks[cell]))
            table.door_locked.append(False)
            table.size.append(g.size)
            table.density.append(float(g.density))
            table.variant.append(g.variant)
            table.episode.append(0)
            table.agent.append(cell)
            table.goal.append(g.goal)
            table.grid_id.append(g.grid_id)
            table.walls[g.grid_id] = np.asarray(g.walls, dtype=bool)
            dr, dc = Action(action).delta_row_col
            nxt = (cell[0] + dr, cell[1] + dc)
            inside = 0 <= nxt[0] < g.size and 0 <= nxt[1] < g.size
            goal = nxt if inside and not g.walls[nxt] else g.goal
            truth.append(_canvas(g, cell, g.goal))
            believed.append(_canvas(g, cell, goal))
            grid_ids.append(g.grid_id)
    return table, np.stack(truth), np.stack(believed), np.asarray(grid_ids, dtype=object)


@pytest.fixture(scope="module")
def world():
    config = GridSetConfig(sizes=(7,), densities=(0.2, 0.4), n_per_cell=15, seed=5, min_distance=3)
    grids = generate_grid_set(config)
    rng = np.random.default_rng(0)
    table, truth, believed, grid_ids = _steps(grids, rng)
    train_grids = generate_grid_set(
        GridSetConfig(sizes=(7,), densities=(0.2, 0.4), n_per_cell=6, seed=11, min_distance=3)
    )
    train_table, train_truth, _, _ = _steps(train_grids, rng)
    prior = fit_prior(train_truth, np.asarray(train_table.size), np.asarray(train_table.density))
    noise = rng.dirichlet(np.ones(len(ALL_CLASSES)), size=(len(truth), CANVAS, CANVAS))
    return {
        "table": table,
        "grid_ids": grid_ids,
        "maps": {
            "truth": _one_hot(truth),
            "believed": _one_hot(believed),
            "random": noise.astype(np.float32),
        },
        "prior": (prior, len(train_grids)),
    }


CONFIG = ScoreConfig(n_bootstrap=1000, random_state=3)


def _nulls(world, kind: str) -> dict:
    table, probs = world["table"], world["maps"][kind]
    idx = np.arange(len(table.action))
    scores = score_rows(probs, ALL_CLASSES, table.facts(idx), CONFIG.top_k)
    out = score_nulls(
        probs,
        ALL_CLASSES,
        idx,
        world["grid_ids"],
        scores,
        table,
        CONFIG,
        world["prior"],
        seed_text=kind,
    )
    out["scores"] = scores
    return out


def test_random_maps_get_zero_excess_recovery(world):
    out = _nulls(world, "random")
    assert set(out["nulls"]) == {"other_grid", "prior"} and out["nulls_unavailable"] == {}
    other = out["nulls"]["other_grid"]
    assert other["stratified_by"] == "size_density"
    for metric in ("recovery", "acc_dec", "agreement"):
        excess = other["excess"][metric]
        # no evidence of an excess (whether the interval covers 0 on every single draw is a
        # matter of chance: 95% coverage is checked over many draws below)
        assert excess["ci_low"] < 0.0 and not excess["above_baseline"], (metric, excess)
    assert not out["excess"]["recovery"]["above_baseline"]
    # random maps do make some GT-suboptimal actions look optimal: Recovery alone rewards them
    assert other["overall"]["recovery"]["value"] > 0.1


@pytest.mark.slow
def test_random_maps_excess_is_zero_over_many_draws(world):
    # Calibration over draws of random maps (the steps fixed): each draw's excess is centred on
    # 0 by construction (the probe's and the null's maps are exchangeable), so a calibrated 95%
    # interval covers 0 on Binomial(n, 0.95) of n independent draws. The test was ">= 8 of 10";
    # since issue 29 scores per grid (Fig. 4) the excess spreads more (about 0.10 over draws,
    # not 0.075; a grid with one GT-suboptimal step weighs as much as one with five), and 7 of
    # 10 came up on this seed, an outcome a calibrated interval gives 1.2% of the time and a
    # 90% one 7%: ten draws cannot tell the two apart. Checked with 40 draws and the variance
    # of the per-grid excess over 60 more: the draws' variance of the total equals the sum of
    # the grids' variances (the grid bootstrap's assumption holds; the derangement couples no
    # grids); coverage was 35 of 40 and the bootstrap's standard error 0.86 of the spread over
    # draws (which 40 draws estimate to about 11%). No evidence against the method, so it stands
    # and the test asks, over 40 draws, what a calibrated interval must pass.
    from scipy.stats import binom

    config = ScoreConfig(n_bootstrap=400, random_state=3, nulls=("other_grid",))
    table, grid_ids = world["table"], world["grid_ids"]
    idx = np.arange(len(table.action))
    rng = np.random.default_rng(2024)
    n_draws = 40
    covered, values, errors = 0, [], []
    for draw in range(n_draws):
        probs = rng.dirichlet(np.ones(len(ALL_CLASSES)), size=(len(idx), CANVAS, CANVAS))
        scores = score_rows(probs, ALL_CLASSES, table.facts(idx), config.top_k)
        out = score_nulls(
            probs, ALL_CLASSES, idx, grid_ids, scores, table, config, (None, 0), seed_text=str(draw)
        )
        excess = out["nulls"]["other_grid"]["excess"]["recovery"]
        covered += excess["ci_low"] <= 0.0 <= excess["ci_high"]
        values.append(excess["value"])
        errors.append((excess["ci_high"] - excess["ci_low"]) / (2 * 1.96))
    spread = float(np.std(values, ddof=1))
    # coverage: not below 95% beyond what chance gives one time in a hundred
    assert binom.cdf(covered, n_draws, 0.95) >= 0.01, covered
    # no bias: the mean excess within three standard errors of 0
    assert abs(np.mean(values)) < 3 * spread / np.sqrt(n_draws), values
    # the interval's width matches the spread over draws (40 draws estimate the spread to
    # about 11%: bounds at about three of those)
    assert 0.7 < np.mean(errors) / spread < 1.4, (np.mean(errors), spread)


def test_true_map_has_clearly_positive_excess_acc_dec(world):
    out = _nulls(world, "truth")
    excess = out["excess"]["acc_dec"]
    assert excess["baseline"] in ("other_grid", "prior")
    # another grid's whole map (its walls, agent and goal) knows nothing of the step
    other = out["nulls"]["other_grid"]["excess"]["acc_dec"]
    assert other["above_baseline"] and other["value"] > 0.15, other
    # the prior map shares the step's agent and goal read-out: only the walls differ, and on
    # these sparse 7 x 7 grids they rarely change the optimal action (a positive point value;
    # a denser case with a clear interval: test_true_walls_beat_the_prior_walls)
    assert out["nulls"]["prior"]["excess"]["acc_dec"]["value"] > 0
    # a decoded map equal to the true grid reaches its ceiling (the true walls with the same
    # agent/goal read-out); with a random agent/goal read-out the true walls gain nothing
    for name in ("other_grid", "prior"):
        block = out["nulls"][name]
        assert block["ceiling"]["value"] == pytest.approx(block["excess"]["acc_dec"]["value"])
    random = _nulls(world, "random")["nulls"]["prior"]
    assert random["ceiling"]["ci_low"] < 0 < random["ceiling"]["ci_high"], random["ceiling"]
    assert out["nulls"]["other_grid"]["ceiling"]["ci_low"] > 0.15
    # the excess is the probe's point value minus the strongest null's
    names = belief_metrics(CONFIG.top_k)
    num, den = out["scores"]
    j = names.index("acc_dec")
    # per grid, as the study's Figure 4 (CONFIG.weighting == "grid")
    w = trajectory_weights(den, world["grid_ids"], world["table"].episodes(np.arange(len(den))))
    probe_value = (num * w)[:, j].sum() / (den * w)[:, j].sum()
    nulls = {k: v["overall"]["acc_dec"]["value"] for k, v in out["nulls"].items()}
    assert excess["value"] == pytest.approx(probe_value - max(nulls.values()))
    assert excess["baseline"] == max(nulls, key=nulls.get)
    # the true map explains no error: its Recovery is 0 and its excess Recovery negative
    assert out["excess"]["recovery"]["value"] < 0


def test_random_walls_with_the_true_read_out_do_not_beat_the_prior_walls(world):
    # the prior null's must-say-no case: the step's true agent and goal, walls drawn at random
    # (about one cell in seven a wall). Random walls lose to the prior's (about -5 points over
    # eight draws, none above). With a random agent/goal read-out as well, random walls beat the
    # prior map by about 9 points (14 of 15 draws): the prior null isolates the walls only when
    # the read-out is informative (belief.json's agent_found / goal_found say whether it is).
    table = world["table"]
    idx = np.arange(len(table.action))
    truth = world["maps"]["truth"]
    agent = truth[..., list(ALL_CLASSES).index(CellType.AGENT)]
    goal = truth[..., list(ALL_CLASSES).index(CellType.GOAL)]
    rng = np.random.default_rng(7)
    probs = rng.dirichlet(np.ones(len(ALL_CLASSES)), size=(len(idx), CANVAS, CANVAS))
    probs = probs.astype(np.float32)
    config = ScoreConfig(n_bootstrap=300, random_state=3, nulls=("prior",))
    scores = score_rows(probs, ALL_CLASSES, table.facts(idx), config.top_k, agent=agent, goal=goal)
    out = score_nulls(
        probs, ALL_CLASSES, idx, world["grid_ids"], scores, table, config, world["prior"],
        seed_text="walls", agent=agent, goal=goal,
    )  # fmt: skip
    excess = out["nulls"]["prior"]["excess"]["acc_dec"]
    assert not excess["above_baseline"] and excess["value"] < 0, excess


def test_believed_map_has_clearly_positive_excess_recovery(world):
    out = _nulls(world, "believed")
    excess = out["nulls"]["other_grid"]["excess"]["recovery"]
    assert excess["above_baseline"] and excess["value"] > 0.15, excess
    # regret is lower-is-better: the excess is null minus probe, positive for the believed map
    assert out["nulls"]["other_grid"]["excess"]["qmdp_regret"]["value"] > 0
    assert "acc_gt" not in out["excess"]  # the same for every map
    # the prior's map (an open room, agent and goal at their most frequent cells) has wide
    # decoded optimal sets, so its Recovery is high too: the excess is over the strongest null
    recovery = {k: v["overall"]["recovery"]["value"] for k, v in out["nulls"].items()}
    assert recovery["prior"] > recovery["other_grid"]
    assert out["excess"]["recovery"]["baseline"] == "prior"


def test_other_grid_null_never_pairs_a_grid_with_itself():
    rng = np.random.default_rng(7)
    for seed in range(30):
        n_grids = int(rng.integers(2, 12))
        sizes = rng.choice([7, 9], size=n_grids)
        densities = rng.choice([0.2, 0.4], size=n_grids)
        rows = rng.integers(1, 6, size=n_grids)
        grid_of_row = np.repeat(np.arange(n_grids), rows)
        grid_ids = np.asarray([f"g{g}" for g in grid_of_row], dtype=object)
        found = other_grid_sources(
            grid_ids, sizes[grid_of_row], densities[grid_of_row], random_state=seed
        )
        source, level = found
        assert (grid_ids[source] != grid_ids).all(), (seed, level)
        if level == "size_density":
            assert (sizes[grid_of_row[source]] == sizes[grid_of_row]).all()
            assert (densities[grid_of_row[source]] == densities[grid_of_row]).all()
        elif level == "size":
            assert (sizes[grid_of_row[source]] == sizes[grid_of_row]).all()
        # seeded: the same pairing again
        again, _ = other_grid_sources(
            grid_ids, sizes[grid_of_row], densities[grid_of_row], random_state=seed
        )
        assert (again == source).all()


def test_other_grid_null_backs_off_and_needs_two_grids():
    ids = np.asarray(["a", "a", "b", "c"], dtype=object)
    sizes = np.asarray([7, 7, 7, 7])
    densities = np.asarray([0.2, 0.2, 0.2, 0.4])  # "c" is alone in its (size, density)
    source, level = other_grid_sources(ids, sizes, densities, random_state=0)
    assert level == "size" and (ids[source] != ids).all()
    source, level = other_grid_sources(ids, np.asarray([7, 7, 9, 11]), densities, random_state=0)
    assert level == "all" and (ids[source] != ids).all()
    assert other_grid_sources(ids[:2], sizes[:2], densities[:2], random_state=0) is None


def test_nulls_can_be_switched_off_and_are_validated():
    assert ScoreConfig(nulls=()).nulls == ()
    with pytest.raises(ValueError, match="nulls"):
        ScoreConfig(nulls=("shuffled",))
    with pytest.raises(ValueError, match="nulls"):
        ScoreConfig(nulls=("prior", "prior"))
