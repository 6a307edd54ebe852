"""A real activation store (schema 2) with a planted decision time, for the read-out over
reasoning time (tests/probes/test_decision_time.py, tests/app/test_decision_readout_report.py),
and the model's own action distribution, the logit lens's identity check."""

from __future__ import annotations

import numpy as np


def planted_store(path, n: int = 480, d: int = 16, seed: int = 0, tokens=(1, 3, 5, 7), length=8):
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

    offsets = np.asarray(tokens)
    fractions = (offsets + 1) / length  # default: 8 reasoning tokens, every 2nd
    stage = {"pre_reasoning": "early", "post_reasoning": "late"}
    acts = {
        s: {x: np.repeat(code(x, w)[:, None], 3, axis=1) for x in layers} for s, w in stage.items()
    }
    along = {x: np.zeros((n, len(offsets), d)) for x in layers}
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
        counts=np.full(n, len(offsets)),
        length=np.full(n, length),
        positions=np.tile(50 + offsets, n),
        tokens=np.tile(offsets, n),
        fraction=np.tile(fractions, n).astype(np.float32),
        acts={x: along[x].reshape(n * len(offsets), d) for x in layers},
    )
    layout = StoreLayout(tuple(stage), layers, d, reasoning_every=2)
    positions = {s: np.tile(np.asarray([[40, 41, 42]]), (n, 1)) for s in stage}
    present = {s: np.ones(n, bool) for s in stage}
    with StoreWriter(path, layout, {"model_id": "planted"}) as writer:
        writer.append(RowBatch(acts, positions, present, labels, reasoning=reasoning))
    return path


def model_probs(model, ids, positions, candidates) -> np.ndarray:
    """``(len(positions), len(candidates))`` the model's own next-token distribution over
    ``candidates`` at ``positions`` of ``ids`` (a plain forward pass)."""
    import torch

    with torch.no_grad():
        device = next(model.parameters()).device
        logits = model(torch.as_tensor([list(ids)], device=device)).logits[0]
        picked = logits[list(positions)][:, list(candidates)].float()
        return torch.softmax(picked, dim=-1).cpu().numpy().astype(np.float32)
