"""The headline probe across seeds, and the power of the wall-map verdict, on synthetic
activations."""

from __future__ import annotations

import pytest
from goalprobe.probes.cell_probes import CoordinateCellProbe
from goalprobe.probes.probe_sweep import (
    ProbeSweepConfig,
    intervals_disjoint,
    seed_runs,
    seed_verdict,
)
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.wall_planting import (
    PowerDesign,
    as_probe_data,
    planted_cell_data,
    summarise,
    wall_power,
)

from goalprobe.stats import seed_pooled


def test_seed_spread_widens_the_interval():
    same = [{"value": 0.6, "ci_low": 0.5, "ci_high": 0.7}] * 5
    spread = [
        {"value": v, "ci_low": v - 0.1, "ci_high": v + 0.1} for v in (0.4, 0.5, 0.6, 0.7, 0.8)
    ]
    a, b = seed_pooled(same), seed_pooled(spread)
    assert a["value"] == pytest.approx(0.6) and a["seed_sd"] == 0.0
    assert (a["ci_low"], a["ci_high"]) == pytest.approx((0.5, 0.7), abs=1e-9)
    assert b["value"] == pytest.approx(0.6)
    assert b["ci_high"] - b["ci_low"] > 2 * (a["ci_high"] - a["ci_low"])
    assert b["ci_low"] <= 0.3 and b["ci_high"] >= 0.9  # the envelope of every seed's interval
    assert seed_pooled([{"value": None}])["n_seeds"] == 0


def test_seed_pooled_interval_stays_in_the_statistics_range():
    """Seeds that disagree widely (the control's agent localisation: 4% and 96% top-1 across
    seeds) widen the interval to the whole range, never beyond it (the default run printed
    66.1% [-8.0%, 140.2%] before the bounds)."""
    seeds = [
        {"value": v, "ci_low": v - 0.03, "ci_high": v + 0.03} for v in (0.04, 0.96, 0.95, 0.9, 0.5)
    ]
    wide = seed_pooled(seeds)
    assert wide["ci_low"] < 0 and wide["ci_high"] > 1  # Rubin's rules alone overshoot
    cut = seed_pooled(seeds, bounds=(0.0, 1.0))
    assert cut["ci_low"] == 0.0 and cut["ci_high"] == 1.0 and cut["value"] == wide["value"]
    inside = [{"value": v, "ci_low": v - 0.01, "ci_high": v + 0.01} for v in (0.5, 0.52, 0.51)]
    assert seed_pooled(inside, bounds=(0.0, 1.0)) == seed_pooled(inside)  # no effect inside


def _probe(epochs: int = 4):
    return CoordinateCellProbe(hidden_size=32, max_epochs=epochs, batch_size=32, random_state=0)


def test_seed_runs_pool_every_seed_and_read_the_verdict_across_them():
    data = as_probe_data(
        planted_cell_data(40, steps_per_grid=3, sizes=(5, 7), d_model=24, signal=3.0)
    )
    split = split_by_grid(data.grid_ids, test_fraction=0.3, stratify=data.grid_sizes)
    config = ProbeSweepConfig(shuffled_control=False, n_bootstrap=100)
    out = seed_runs(_probe(), data, split.train, split.test, config, seeds=(0, 1, 2))
    assert out["seeds"] == [0, 1, 2] and len(out["per_seed"]) == 3
    wall = out["pooled"]["auc/wall"]
    assert wall["probe"]["n_seeds"] == 3 and len(set(wall["probe"]["values"])) > 1
    assert wall["selectivity"]["baseline"].startswith("prior")
    assert "shuffled" not in str(out["per_seed"][0]["auc/wall"]["selectivity"]["baseline"])


def test_power_summary_finds_the_smallest_detected_strength():
    design = PowerDesign(signals=(0.0, 0.5, 1.0), seeds=(0, 1))
    trials = [
        {"signal": s, "seed": k, "detected": s >= 0.5 and (s > 0.5 or k == 0), "auc": s}
        for s in design.signals
        for k in design.seeds
    ]
    out = summarise(trials, design)
    assert out["detection"] == {"0": 0.0, "0.5": 0.5, "1": 1.0}
    assert out["minimum_detectable_effect"] == 1.0 and out["auc_at_mde"] == 1.0
    none = summarise([{**t, "detected": False} for t in trials], design)
    assert none["minimum_detectable_effect"] is None


@pytest.mark.slow  # a few small probe fits
def test_no_planted_wall_map_is_not_detected_and_a_strong_one_is():
    design = PowerDesign(
        n_grids=80, steps_per_grid=4, sizes=(5, 7), d_model=32, signals=(0.0, 8.0), seeds=(0,),
        n_bootstrap=200,
    )  # fmt: skip
    out = wall_power(_probe(epochs=30), design)
    detected = {t["signal"]: t["detected"] for t in out["trials"]}
    assert detected == {0.0: False, 8.0: True}, out["trials"]
    assert out["minimum_detectable_effect"] == 8.0


def test_power_plants_on_the_demo_grids_when_given_their_seed():
    """With ``grid_seed`` the planted data carry the demo generator's own walls and goals
    (bordered, connected grids at every density), not random walls."""
    from goalprobe.gridworld.core import CellType
    from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
    from goalprobe.probes.wall_planting import demo_layouts

    design = PowerDesign(n_grids=4, sizes=(7, 9), densities=(0.4, 1.0), grid_seed=3)
    grids = generate_grid_set(
        GridSetConfig(sizes=(7, 9), densities=(0.4, 1.0), n_per_cell=1, seed=3)
    )
    layouts = demo_layouts(design)
    assert layouts is not None and len(layouts) == 4
    data = planted_cell_data(
        4, steps_per_grid=3, sizes=(7, 9), d_model=8, layouts=layouts, random_state=0
    )
    for g, grid in enumerate(grids):
        n = grid.size
        labels = data.labels[3 * g]
        assert ((labels[:n, :n] == CellType.WALL) == grid.walls).all()
        assert labels[grid.goal] == CellType.GOAL and data.densities[3 * g] == grid.density
    assert demo_layouts(PowerDesign()) is None  # the random-wall design stays available
    with pytest.raises(ValueError, match="layouts for"):
        planted_cell_data(5, sizes=(7, 9), layouts=layouts)


def _stats(values, half):
    return [{"value": v, "ci_low": v - half, "ci_high": v + half} for v in values]


def test_seeds_that_disagree_give_unstable_not_no():
    # the control's agent localisation over five seeds (93 / 44 / 20 / 91 / 9%, minus a 10%
    # prior), each interval +-8 points: the pool straddles 0, but the seeds disagree
    disagree = _stats([0.83, 0.34, 0.10, 0.81, -0.01], 0.08)
    pooled = seed_pooled(disagree, bounds=(-1.0, 1.0))
    assert pooled["ci_low"] <= 0 and intervals_disjoint(disagree)
    assert seed_verdict(disagree, pooled) == "unstable"
    # seeds that agree, all near 0: a plain "no"
    agree = _stats([0.01, -0.02, 0.0, 0.02, -0.01], 0.08)
    assert not intervals_disjoint(agree)
    assert seed_verdict(agree, seed_pooled(agree, bounds=(-1.0, 1.0))) == "no"
    # one seed alone above its baseline while the pool is not: unstable
    one = _stats([0.09, -0.02, 0.0], 0.08)
    assert seed_verdict(one, seed_pooled(one, bounds=(-1.0, 1.0))) == "unstable"
    # seeds that all clear the baseline: yes, even where their sizes differ
    yes = _stats([0.5, 0.3, 0.45], 0.05)
    assert seed_verdict(yes, seed_pooled(yes, bounds=(-1.0, 1.0))) == "yes"


def test_linear_probe_seeds_agree_exactly():
    data = as_probe_data(
        planted_cell_data(40, steps_per_grid=3, sizes=(5, 7), d_model=24, signal=3.0)
    )
    split = split_by_grid(data.grid_ids, test_fraction=0.3, stratify=data.grid_sizes)
    config = ProbeSweepConfig(shuffled_control=False, n_bootstrap=100)
    probe = CoordinateCellProbe(family="linear", class_balance="weighted_loss")
    out = seed_runs(probe, data, split.train, split.test, config, seeds=(0, 1, 2))
    wall = out["pooled"]["auc/wall"]
    assert len(set(wall["probe"]["values"])) == 1 and wall["probe"]["seed_sd"] == 0.0
    assert not wall["probe"]["seeds_disagree"]
    assert wall["selectivity"]["verdict"] in ("yes", "no")
