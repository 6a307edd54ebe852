"""Decision-time curves (goalprobe.probes.decision_time) on constructed lens readings with a
planted decision time: the curves find it, and a lens that never names the action stays at 0."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.probes.decision_time import StepLens, decision_curves


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
