"""The plan decoder's state-only baselines and its verdict (issue 33, item 3), on constructed
data where the verdict must say "no" (activations that hold the state and nothing else) and
where it may say "yes" (activations that hold the plan, whose ties no state predicts)."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import Action, State
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import padded_cell_types
from goalprobe.probes.plan_decoder import PlanDecoder
from goalprobe.probes.plan_metrics import encode_plans, prefix_hits
from goalprobe.probes.plan_sweep import (
    CHANCE,
    PlanDataset,
    PlanSweepConfig,
    StatePlanDecoder,
    departure_mask,
    optimal_plans,
    prefix_verdicts,
    run_plan_sweep,
    state_features,
)
from goalprobe.probes.splits import grid_folds

HORIZON = 10
D_MODEL = 48


def rows(n_grids: int = 60, states: int = 6, seed: int = 0) -> dict:
    """States on generated grids with the agent's plan: an optimal path whose ties are broken
    at random (so the state does not tell which way the agent goes at a tie)."""
    rng = np.random.default_rng(seed)
    out = {k: [] for k in ("grid", "size", "agent", "goal", "cells", "plan", "optimal", "mask")}
    for g in range(n_grids):
        grid = generate_grid(int(rng.choice([7, 9])), 0.0, rng, min_distance=4, grid_id=f"p{g}")
        policy = solve(grid)
        open_cells = [
            (r, c)
            for r in range(grid.size)
            for c in range(grid.size)
            if not grid.walls[r, c] and (r, c) != grid.goal
        ]
        for i in rng.permutation(len(open_cells))[:states]:
            state = State(agent=open_cells[i])
            _, actions = policy.optimal_trajectory(rng=rng, start=state)
            mask = np.zeros(4, bool)
            mask[[int(a) for a in policy.optimal_actions(state)]] = True
            out["grid"].append(grid.grid_id)
            out["size"].append(grid.size)
            out["agent"].append(state.agent)
            out["goal"].append(grid.goal)
            out["cells"].append(padded_cell_types(grid, state))
            out["plan"].append([int(a) for a in actions])
            out["mask"].append(mask)
    out = {k: np.asarray(v) if k != "plan" else v for k, v in out.items()}
    out["plan"] = encode_plans(out["plan"], HORIZON)
    return out


@pytest.fixture(scope="module")
def data():
    return rows()


def embed(features: np.ndarray, seed: int) -> np.ndarray:
    """``(N, 3, D_MODEL)`` float32: ``features`` through a fixed random projection, plus noise."""
    rng = np.random.default_rng(seed)
    proj = np.random.default_rng(99).normal(size=(3, features.shape[1], D_MODEL))
    acts = np.einsum("nf,kfd->nkd", features, proj) + 0.05 * rng.normal(
        size=(len(features), 3, D_MODEL)
    )
    return acts.astype(np.float32)


def one_hot_cells(data) -> np.ndarray:
    """What a state-only representation holds: the agent's and goal's cells, one-hot."""
    eye = np.eye(15)
    parts = [eye[data[k][:, i]] for k in ("agent", "goal") for i in (0, 1)]
    return np.concatenate(parts, axis=1)


def sweep(data, acts):
    dataset = PlanDataset(
        acts=acts,
        plans=data["plan"],
        grid_ids=data["grid"],
        row_ids=np.arange(len(acts)),
        sizes=data["size"],
        agent_row_col=data["agent"],
        goal_row_col=data["goal"],
        optimal_plans=optimal_plans(
            data["cells"], data["agent"], data["goal"], data["size"], HORIZON
        ),
        departs=departure_mask(
            data["plan"], data["mask"], data["plan"][:, 0], np.ones(len(acts), bool)
        ),
    )

    def load(stage, layer):
        return dataset

    load.stages, load.layers = ("pre_reasoning",), (1,)
    config = PlanSweepConfig(
        decoder_layers=(1,), control_decoder_layers=(), n_folds=5, validation_fraction=0.2,
        n_bootstrap=300,
    )  # fmt: skip
    decoder = PlanDecoder(
        n_layers=1, n_heads=4, d_bottleneck=32, learning_rate=5e-3, batch_size=64,
        max_epochs=40, n_iter_no_change=5, dropout=0.0, device="cpu", random_state=0,
    )  # fmt: skip
    result = run_plan_sweep(load, config, decoder)
    return {r.kind: r for r in result.runs}, result


def test_optimal_plans_follow_the_optimal_policy(data):
    plans = optimal_plans(data["cells"], data["agent"], data["goal"], data["size"], HORIZON)
    first = plans[:, 0]
    assert data["mask"][np.arange(len(first)), first].all()  # every first step is optimal
    # the agent breaks ties at random: its first step agrees with the lowest-index tie-break
    # exactly where there is no tie
    ties = data["mask"].sum(axis=1) > 1
    assert (first == data["plan"][:, 0])[~ties].all()
    assert not (first == data["plan"][:, 0])[ties].all()
    # a key or a door in the cells: the state is not the cells alone
    cells = data["cells"].copy()
    cells[0, 0, 0] = 4
    assert optimal_plans(cells, data["agent"], data["goal"], data["size"], HORIZON) is None


def test_departures_are_ties_and_suboptimal_first_steps():
    plans = encode_plans([[0, 1], [2], [3], [1]], HORIZON)
    mask = np.array([[1, 0, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0]], bool)
    action = np.array([0, 2, 3, 1])
    valid = np.array([True, True, True, False])
    assert departure_mask(plans, mask, action, valid).tolist() == [False, True, True, False]


def test_prefix_verdicts_take_the_strongest_baseline():
    grids = np.repeat(np.arange(40), 5).astype(str)
    rng = np.random.default_rng(0)
    state = rng.random((200, 3)) < 0.5
    same = {"decoder": state.copy(), "state": state, "majority": np.zeros((200, 3), bool)}
    verdicts = prefix_verdicts(same, "decoder", grids, n_resamples=200)
    assert [v["strongest"] for v in verdicts] == ["state"] * 3
    assert all(v["verdict"] == "no" and v["difference"]["value"] == 0 for v in verdicts)
    # nothing beats chance: the chance line is the strongest baseline
    nothing = {"decoder": np.zeros((200, 3), bool), "majority": np.zeros((200, 3), bool)}
    (first,) = prefix_verdicts(nothing, "decoder", grids, horizons=range(1, 2), n_resamples=200)
    assert first["strongest"] == CHANCE and first["verdict"] == "no"
    better = {"decoder": np.ones((200, 3), bool), "state": state}
    assert all(v["verdict"] == "yes" for v in prefix_verdicts(better, "decoder", grids))


def test_a_state_only_representation_gives_a_decoder_verdict_of_no(data):
    """Activations that hold the agent's and goal's cells and nothing else: the decoder may beat
    0.25^N and the majority plan by far, but not the state-only baselines, at any N."""
    runs, result = sweep(data, embed(one_hot_cells(data), seed=1))
    decoder = runs["decoder"]
    assert result.splits["pre_reasoning/layer1"]["test"]["n_grids"] == 60  # every grid tested
    first = decoder.verdicts[0]
    assert first["baselines"][CHANCE] == 0.25
    assert first["decoder"]["ci_low"] > 0.25 + 0.1  # far above the study's chance line
    assert first["strongest"] in ("pre_reasoning/layer1/state_only",
                                  "pre_reasoning/layer1/optimal_policy")  # fmt: skip
    assert all(v["verdict"] == "no" for v in decoder.verdicts), [
        (v["n"], v["strongest"], v["difference"]) for v in decoder.verdicts
    ]
    assert decoder.departures["n_rows"] > 30
    assert decoder.departures["verdict_n1"]["verdict"] == "no"


def test_a_plan_representation_beats_the_state_on_ties(data):
    """Activations that hold the agent's first move (ties broken at random): only a plan
    read-out predicts a tie, so the decoder beats every state-only baseline at N = 1 and on
    the departure rows."""
    first = np.eye(4)[data["plan"][:, 0]]
    runs, _ = sweep(data, embed(np.concatenate([one_hot_cells(data), 3 * first], 1), seed=2))
    decoder = runs["decoder"]
    assert decoder.verdicts[0]["verdict"] == "yes", decoder.verdicts[0]
    assert decoder.departures["verdict_n1"]["verdict"] == "yes"
    assert runs["state_only"].departures["accuracy_n1"]["value"] < 0.8


def test_grid_folds_partition_the_grids():
    grids = np.repeat([f"g{i}" for i in range(23)], 3)
    sizes = np.repeat(np.arange(23) % 3, 3)
    folds = grid_folds(grids, 5, validation_fraction=0.2, stratify=sizes, random_state=4)
    test = np.concatenate([f.test for f in folds])
    assert sorted(test.tolist()) == list(range(len(grids)))
    for fold in folds:
        fold.check_disjoint(grids)
        assert len(fold.validation) and len(fold.train)
    with pytest.raises(ValueError, match="n_folds"):
        grid_folds(grids, 1)


def test_state_plan_decoder_is_one_shot_and_seeded(data):
    features = state_features(data["agent"], data["goal"], data["size"])
    a = StatePlanDecoder(random_state=3).fit(features, data["plan"]).predict(features[:20])
    b = StatePlanDecoder(random_state=3).fit(features, data["plan"]).predict(features[:20])
    np.testing.assert_array_equal(a, b)
    assert a.shape == (20, HORIZON) and a.dtype == np.int8
    assert prefix_hits(a, data["plan"][:20]).shape == (20, HORIZON)
    assert Action(int(a[0, 0])) in Action
