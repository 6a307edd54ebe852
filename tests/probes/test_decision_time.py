"""Decision-time curves (goalprobe.probes.decision_time) on constructed lens readings with a
planted decision time: the curves find it, and a lens that never names the action stays at 0."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.probes.decision_time import StepLens, decision_curves
from readout_fixtures import planted_store


def _steps(decide_at: float | None, n_steps: int = 40, n_layers: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    fractions = np.arange(1, 11) / 10
    out = []
    for i in range(n_steps):
        action = int(rng.integers(0, 4))
        other = (action + 1) % 4
        chunks = np.full((n_layers, len(fractions), 4), 0.1)
        chunks[..., other] = 0.7  # before the decision the lens names another action
        if decide_at is not None:
            late = fractions > decide_at
            chunks[-1, late, :] = 0.1
            chunks[-1, late, action] = 0.7
        answer = np.full((n_layers, 4), 0.1)
        answer[:, other] = 0.7
        if decide_at is not None:
            answer[-1] = 0.1
            answer[-1, action] = 0.7
        out.append(StepLens(f"g{i % 10}", action, fractions, chunks, answer))
    return out


def test_a_planted_decision_time_is_recovered():
    curves = decision_curves(_steps(0.6), n_resamples=200)
    last = curves["progress_by_layer"][-1]
    assert [round(b["value"], 6) for b in last] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert curves["answer_by_layer"][-1]["value"] == 1.0
    assert curves["answer_by_layer"][-1]["ci_low"] < 1.0  # 40/40 is not [100, 100]
    assert curves["answer_by_layer"][0]["value"] == 0.0
    assert curves["first_stable"]["quartiles"] == pytest.approx([0.7, 0.7, 0.7])
    assert curves["grids"] == 10 and curves["answer_by_layer"][-1]["ci_low"] is not None


def test_a_lens_that_never_names_the_action_stays_at_zero():
    curves = decision_curves(_steps(None), n_resamples=200)
    assert all(b["value"] == 0.0 for row in curves["progress_by_layer"] for b in row)
    assert curves["first_stable"]["steps"] == 0 and curves["first_stable"]["quartiles"] is None
    assert 0.0 < curves["majority"]["value"] <= 1.0


def test_an_empty_bin_has_no_value():
    steps = _steps(0.6)
    late = [
        StepLens(s.grid_id, s.action, s.fractions[3:], s.chunks[:, 3:], s.answer) for s in steps
    ]  # no chunk ends in the first two fifths
    curves = decision_curves(late, n_resamples=100)
    first = curves["progress_by_layer"][-1][0]
    assert first["value"] is None and first["n"] == 0


def test_no_steps_is_an_error():
    with pytest.raises(ValueError, match="no steps"):
        decision_curves([])


def test_readout_finds_a_planted_decision_only_after_it_is_made():
    from goalprobe.probes.decision_time import readout_curves

    rng = np.random.default_rng(0)
    n, layers, bins, d = 240, 2, 5, 8
    actions = rng.integers(0, 4, n)
    ids = np.asarray([f"g{i % 40}" for i in range(n)])
    train = np.isin(ids, [f"g{i}" for i in range(20)])
    features = rng.normal(size=(n, layers, bins, d))
    features[:, 1, 3:, :4] += 3.0 * np.eye(4)[actions][:, None, :]  # readable from bin 3 on
    present = np.ones((n, bins), dtype=bool)
    majority = np.full(n, np.bincount(actions[train]).argmax())
    out = readout_curves(
        features, present, actions, ids, train, {"majority": majority}, n_resamples=1000
    )
    assert out["strongest"] == "majority"
    assert [c["verdict"] for c in out["by_layer"][1]] == ["no", "no", "no", "yes", "yes"]
    assert all(c["verdict"] == "no" for c in out["by_layer"][0])
    # a baseline that already knows the action leaves the probe nothing to add
    oracle = readout_curves(
        features, present, actions, ids, train, {"oracle": actions}, n_resamples=200
    )
    assert all(c["verdict"] == "no" for row in oracle["by_layer"] for c in row)


def test_store_readout_recovers_a_planted_decision_time(tmp_path):
    from goalprobe.activations.store import ActivationStore
    from goalprobe.probes.decision_time import (
        READOUT_BINS,
        first_readable,
        reasoning_readout,
    )

    with ActivationStore(planted_store(tmp_path / "planted.h5")) as store:
        out = reasoning_readout(store, n_resamples=300)
    assert out["bins"] == list(READOUT_BINS) and out["every"] == 2
    assert out["rows_by_bin"] == [480, 0, 480, 480, 480, 480, 480]  # no row in the first fifth
    action = out["targets"]["action"]
    verdicts = [[c["verdict"] for c in row] for row in action["by_layer"]]
    # block 1 reads the action from the 60-80% fifth (fraction 0.75) on; block 0 never does
    assert verdicts[1] == ["no", "undecided", "no", "no", "yes", "yes", "yes"]
    assert "yes" not in verdicts[0]
    assert first_readable(action) == {"bin": 4, "name": "60-80%", "layer_index": 1}
    assert action["by_layer"][1][5]["value"] > 0.9 and action["by_layer"][1][5]["ci_high"] <= 1
    # the plan's first move is the action on valid steps: one target, not two
    assert list(out["targets"]) == ["action", "agent cell", "goal cell"]
    # the agent's cell is readable everywhere; the goal's nowhere (a verdict that can say no)
    agent = out["targets"]["agent cell"]
    assert all(row[b]["verdict"] == "yes" for row in agent["by_layer"] for b in (0, 2, 6))
    assert first_readable(out["targets"]["goal cell"]) is None
    assert out["targets"]["goal cell"]["strongest"] == "uniform guess among open cells"


def test_a_row_at_exactly_a_fifth_s_edge_falls_in_that_fifth(tmp_path):
    """Bins are (low, high]: offset 1 of 10 tokens (fraction 0.2, stored as float32 0.2000...03)
    is the end of the first fifth."""
    from goalprobe.activations.store import ActivationStore
    from goalprobe.probes.decision_time import bin_features

    path = planted_store(tmp_path / "edges.h5", n=8, tokens=(1, 3, 5, 7, 9), length=10)
    with ActivationStore(path) as store:
        features, present = bin_features(store)
        along = store.reasoning_rows()
        first = store.read_reasoning(0, along.index[along.row == 0])
    assert present.all()
    np.testing.assert_array_equal(features[0, 0, 1:6], first.astype(np.float32))


def test_readout_intervals_stay_honest_at_0_and_100_percent():
    from goalprobe.probes.decision_time import readout_curves

    rng = np.random.default_rng(1)
    n = 160
    actions = rng.integers(0, 4, n)
    ids = np.asarray([f"g{i % 32}" for i in range(n)])
    train = np.isin(ids, [f"g{i}" for i in range(16)])
    features = rng.normal(size=(n, 1, 1, 8))
    features[:, 0, 0, :4] += 10.0 * np.eye(4)[actions]  # perfectly readable
    never = (actions + 1) % 4  # a baseline that is always wrong
    out = readout_curves(
        features, np.ones((n, 1), bool), actions, ids, train, {"wrong": never}, n_resamples=300
    )
    cell, base = out["by_layer"][0][0], out["baselines"]["wrong"]
    assert cell["value"] == 1.0 and cell["ci_low"] < 1.0 and cell["ci_high"] == 1.0
    assert base["value"] == 0.0 and base["ci_low"] == 0.0 and base["ci_high"] > 0.0
    assert cell["verdict"] == "yes"


def test_bonferroni_margin_tails_are_stable_across_bootstrap_seeds():
    """The margin's Bonferroni bound is a far tail: drawn from >= 20,000 resamples it barely
    moves with the bootstrap seed (1,000 resamples moved it by 0.09 in issue 40)."""
    from goalprobe.probes.decision_time import TAIL_RESAMPLES, readout_curves

    rng = np.random.default_rng(4)
    n, grids = 240, 60
    ids = np.repeat(np.arange(grids), n // grids).astype(str)
    actions = rng.integers(0, 4, n)
    right = rng.random(n) < 0.7  # a read-out right 70% of the time
    signal = np.where(right, actions, (actions + 1) % 4)
    # 3 layers x 7 bins: a family of 21, the Bonferroni bound the 0.12% tail
    features = np.eye(4, dtype=np.float32)[signal][:, None, None, :] * 3.0
    features = features + rng.normal(0, 0.1, (n, 3, 7, 4)).astype(np.float32)
    present = np.ones((n, 7), dtype=bool)
    train = np.isin(ids, np.unique(ids)[::2])
    lows = [
        readout_curves(
            features, present, actions, ids, train, {"majority": np.zeros(n, int)},
            n_resamples=1000, random_state=seed,
        )["by_layer"][0][0]["margin_over_strongest"]["ci_low"]
        for seed in range(4)
    ]  # fmt: skip
    assert TAIL_RESAMPLES >= 20_000
    assert max(lows) - min(lows) < 0.015  # 1,000 resamples alone: 0.020 on these data
