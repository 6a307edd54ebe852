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


def _planted_store(path, n: int = 480, d: int = 16, seed: int = 0):
    """A real activation store (schema 2) whose residual streams carry a planted decision:
    the action is written into block 1 from 75% of the reasoning on (and at the post-reasoning
    anchor), the agent's cell into every bin of every block, the goal's cell nowhere."""
    from goalprobe.activations.store import ReasoningRows, RowBatch, StoreLayout, StoreWriter
    from goalprobe.activations.store.schema import LABEL_FIELDS
    from goalprobe.gridworld.core import PLAN_END, PLAN_PAD

    rng = np.random.default_rng(seed)
    layers = (0, 1)
    action = rng.integers(0, 4, n)
    agent = rng.integers(0, 5, (n, 2))
    goal = rng.integers(0, 5, (n, 2))
    optimal = np.eye(4, dtype=bool)[(action + 1 + rng.integers(0, 3, n)) % 4]
    plan = np.full((n, LABEL_FIELDS["plan"].shape[0]), PLAN_PAD, dtype=np.uint8)
    plan[:, 0], plan[:, 1] = action, PLAN_END

    def code(layer: int, where: str) -> np.ndarray:
        x = rng.normal(size=(n, d))
        x[:, :5] += 3.0 * np.eye(5)[agent[:, 0]]  # the agent's row and column: everywhere
        x[:, 5:10] += 3.0 * np.eye(5)[agent[:, 1]]
        if layer == 1 and where == "late":
            x[:, 10:14] += 3.0 * np.eye(4)[action]
        return x

    fractions = np.asarray([0.25, 0.5, 0.75, 1.0])  # 8 reasoning tokens, every 2nd
    stage = {"pre_reasoning": "early", "post_reasoning": "late"}
    acts = {
        s: {x: np.repeat(code(x, w)[:, None], 3, axis=1) for x in layers} for s, w in stage.items()
    }
    along = {x: np.zeros((n, 4, d)) for x in layers}
    for k, f in enumerate(fractions):
        for x in layers:
            along[x][:, k] = code(x, "late" if f >= 0.75 else "early")
    labels = {
        "cell_types": np.zeros((n, 15, 15), np.uint8),
        "agent_row_col": agent,
        "goal_row_col": goal,
        "grid_size": np.full(n, 5),
        "density": np.full(n, 0.3),
        "variant": np.asarray(["plain"] * n, dtype=object),
        "distance_to_goal": np.ones(n),
        "plan": plan,
        "optimal_actions": optimal,
        "action": action,
        "action_valid": np.ones(n, bool),
        "has_key": np.zeros(n, bool),
        "door_open": np.zeros(n, bool),
        "run_id": np.asarray(["r"] * n, dtype=object),
        "grid_id": np.asarray([f"g{i % 48}" for i in range(n)], dtype=object),
        "episode": np.zeros(n),
        "step": np.arange(n),
        "step_index": np.arange(n),
        "seq_len": np.full(n, 100),
    }
    reasoning = ReasoningRows(
        counts=np.full(n, 4),
        length=np.full(n, 8),
        positions=np.tile(np.asarray([51, 53, 55, 57]), n),
        tokens=np.tile(np.asarray([1, 3, 5, 7]), n),
        fraction=np.tile(fractions, n),
        acts={x: along[x].reshape(n * 4, d) for x in layers},
    )
    layout = StoreLayout(tuple(stage), layers, d, reasoning_every=2)
    positions = {s: np.tile(np.asarray([[40, 41, 42]]), (n, 1)) for s in stage}
    present = {s: np.ones(n, bool) for s in stage}
    with StoreWriter(path, layout, {"model_id": "planted"}) as writer:
        writer.append(RowBatch(acts, positions, present, labels, reasoning=reasoning))
    return path


def test_store_readout_recovers_a_planted_decision_time(tmp_path):
    from goalprobe.activations.store import ActivationStore
    from goalprobe.probes.reasoning_readout import (
        READOUT_BINS,
        first_readable,
        reasoning_readout,
    )

    with ActivationStore(_planted_store(tmp_path / "planted.h5")) as store:
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
    # the plan's first move is the action on these rows: the same curve
    first_move = out["targets"]["first move"]
    assert [[c["verdict"] for c in row] for row in first_move["by_layer"]] == verdicts
    # the agent's cell is readable everywhere; the goal's nowhere (a verdict that can say no)
    agent = out["targets"]["agent cell"]
    assert all(row[b]["verdict"] == "yes" for row in agent["by_layer"] for b in (0, 2, 6))
    assert first_readable(out["targets"]["goal cell"]) is None
    assert out["targets"]["goal cell"]["strongest"] == "most frequent cell of the size"


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
