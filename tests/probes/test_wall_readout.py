"""The wall read-out's result and verdict: "no" only with shown power, else "undecided"."""

from __future__ import annotations

import json

import pytest
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.wall_planting import (
    PowerDesign,
    WallPowerDesign,
    as_probe_data,
    demo_layouts,
    planted_walls,
    summarise_power,
)
from goalprobe.probes.wall_test import (
    WALL_READOUT_SCHEMA,
    WallTestConfig,
    wall_readout,
    wall_verdict,
)


def _overall(detected, value, low, high):
    return {
        "detected": detected,
        "bits": {"difference": {"value": value, "ci_low": low, "ci_high": high}},
    }


POWER = {"minimum_detectable_strength": 0.25, "bits_at_mds": 0.02}


@pytest.mark.parametrize(
    ("overall", "power", "verdict"),
    [
        (_overall(True, 0.1, 0.05, 0.15), None, "yes"),
        (_overall(False, 0.0, -0.01, 0.01), None, "undecided"),  # no power shown: never "no"
        (_overall(False, 0.0, -0.01, 0.01), {"minimum_detectable_strength": None}, "undecided"),
        (_overall(False, 0.0, -0.01, 0.01), POWER, "no"),  # the detectable 0.02 is excluded
        (_overall(False, 0.01, -0.005, 0.03), POWER, "undecided"),  # interval reaches it
    ],
)
def test_verdict_says_no_only_with_power(overall, power, verdict):
    out = wall_verdict(overall, power)
    assert out["verdict"] == verdict
    assert out["minimum_detectable_bits"] == (power or {}).get("bits_at_mds")


def test_power_summary_minimum_detectable_strength():
    design = WallPowerDesign(strengths=(0.0, 0.25, 0.5), seeds=(0, 1))
    trials = [
        {
            "strength": s,
            "seed": k,
            "detected": s >= 0.5 or (s == 0.25 and k == 0),
            "bits": {"value": s / 10},
        }
        for s in design.strengths
        for k in design.seeds
    ]
    out = summarise_power(trials, design)
    assert out["detection"] == {"0": 0.0, "0.25": 0.5, "0.5": 1.0}
    assert out["minimum_detectable_strength"] == 0.5 and out["bits_at_mds"] == pytest.approx(0.05)
    none = summarise_power([{**t, "detected": False} for t in trials], design)
    assert none["minimum_detectable_strength"] is None and none["bits_at_mds"] is None


def test_wall_readout_result_is_json_with_both_frames_and_verdicts():
    design = PowerDesign(n_grids=64, sizes=(7, 9), densities=(0.4, 0.8), grid_seed=4)
    planted = planted_walls(
        demo_layouts(design), frame="agent", strength=3.0, sizes=design.sizes, d_model=32
    )
    data = as_probe_data(planted)
    split = split_by_grid(data.grid_ids, test_fraction=0.3, stratify=data.grid_sizes)
    power = {"absolute": POWER, "agent": POWER}
    res = wall_readout(data, split, config=WallTestConfig(n_bootstrap=200), power=power)
    json.dumps(res, allow_nan=False)
    assert res["schema"] == WALL_READOUT_SCHEMA and set(res["frames"]) == {"absolute", "agent"}
    assert res["verdicts"]["agent"]["verdict"] == "yes"
    assert set(res["frames"]["agent"]["rings"]) == {"1", "2", "3", "4", "5", "6"}
    assert res["n_test_grids"] + res["n_train_grids"] == 64


def test_committed_power_applies_only_to_its_own_design():
    import json as _json
    from pathlib import Path

    from goalprobe.probes.wall_test import design_power

    committed = _json.loads(
        (Path(__file__).resolve().parents[2] / "probes" / "wall_power.json").read_text()
    )
    d = committed["design"]
    width = d["d_model"] * d["n_anchors"]
    curves, info = design_power(committed, d["n_grids"], 105, width)
    assert info["applies"] and curves is committed["conditional"]["frames"]
    assert curves["agent"]["minimum_detectable_strength"] is not None
    for grids, test, features in ((64, 20, width), (d["n_grids"], 105, width * 2)):
        curves, info = design_power(committed, grids, test, features)
        assert curves is None and not info["applies"] and info["reason"]
    assert design_power(None, 420, 105, width)[0] is None


def test_a_store_off_the_power_design_never_says_no_and_strong_walls_still_say_yes():
    """Constructed: no walls planted on a small design (its power is not the committed
    curve's) must read "undecided", never "no"; strongly planted agent-centred walls "yes"."""
    from goalprobe.probes.wall_test import design_power

    design = PowerDesign(n_grids=64, sizes=(7, 9), densities=(0.4, 0.8), grid_seed=6)
    committed = {
        "design": {"n_grids": 420, "test_fraction": 0.25, "d_model": 32, "n_anchors": 3},
        "conditional": {"frames": {"absolute": POWER, "agent": POWER}},
    }
    verdicts = {}
    for strength in (0.0, 3.0):
        planted = planted_walls(
            demo_layouts(design), frame="agent", strength=strength, sizes=design.sizes, d_model=32
        )
        data = as_probe_data(planted)
        split = split_by_grid(data.grid_ids, test_fraction=0.3, stratify=data.grid_sizes)
        n_test = len(set(data.grid_ids[split.test]))
        curves, info = design_power(committed, 64, n_test, 3 * 32)
        assert curves is None and not info["applies"]
        res = wall_readout(data, split, config=WallTestConfig(n_bootstrap=200), power=curves)
        verdicts[strength] = {f: v["verdict"] for f, v in res["verdicts"].items()}
    assert verdicts[0.0] == {"absolute": "undecided", "agent": "undecided"}
    assert verdicts[3.0]["agent"] == "yes"
    # the same null result with the committed power of its design says "no"
    assert wall_verdict(_overall(False, 0.0, -0.01, 0.01), POWER)["verdict"] == "no"
