"""Position probes (probes/position.py): a planted position is read out above every baseline;
random features are not."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.probes.position import PositionPrior, PositionProbe, evaluate_positions
from goalprobe.probes.splits import split_by_grid


def planted_positions(n_grids=120, steps=4, d_model=48, informative=True, seed=0):
    rng = np.random.default_rng(seed)
    n = n_grids * steps
    grid_ids = np.repeat(np.arange(n_grids), steps).astype(str)
    sizes = np.repeat(rng.choice([7, 9], n_grids), steps)
    pos = np.stack([rng.integers(1, s - 1) for s in sizes] + [], axis=0)
    pos = np.stack([pos, np.array([rng.integers(1, s - 1) for s in sizes])], axis=1)
    acts = rng.standard_normal((n, 3, d_model)).astype(np.float32)
    if informative:  # one-hot codes of row and column written into the last token
        acts[np.arange(n), -1, pos[:, 0]] += 5.0
        acts[np.arange(n), -1, 16 + pos[:, 1]] += 5.0
    return acts, pos, grid_ids, sizes


@pytest.mark.parametrize("informative", [True, False])
def test_a_planted_position_beats_every_baseline_and_noise_does_not(informative):
    acts, pos, ids, sizes = planted_positions(informative=informative)
    split = split_by_grid(ids, test_fraction=0.25, random_state=0)
    tr, te = split.train, split.test
    probe = PositionProbe().fit(acts[tr], pos[tr])
    prior = PositionPrior().fit(sizes[tr], pos[tr])
    shuffled_pos = pos[tr][np.random.default_rng(1).permutation(len(tr))]
    shuffled = PositionProbe().fit(acts[tr], shuffled_pos)
    open_cells = (sizes[te] - 2) ** 2
    result = evaluate_positions(
        {
            "probe": probe.predict(acts[te]),
            "prior_size": prior.predict(sizes[te]),
            "shuffled": shuffled.predict(acts[te]),
        },
        pos[te],
        ids[te],
        chance=1.0 / open_cells,
        n_boot=300,
    )
    top1 = result["selectivity"]["top1"]
    assert result["n_grids"] == len(np.unique(ids[te]))
    if informative:
        assert result["models"]["probe"]["top1"]["value"] > 0.9
        assert top1["above_baseline"]
    else:
        assert not top1["above_baseline"]
        assert result["models"]["probe"]["top1"]["value"] < 0.15


def test_the_prior_predicts_the_most_frequent_position_of_the_size():
    sizes = np.array([7, 7, 7, 9, 9])
    pos = np.array([[1, 1], [1, 1], [2, 3], [4, 4], [4, 4]])
    prior = PositionPrior().fit(sizes, pos)
    assert prior.predict(np.array([7, 9, 11])).tolist() == [[1, 1], [4, 4], [1, 1]]


def test_convergence_is_recorded_not_printed(recwarn):
    """A solver stopped by its iteration limit says so in ``converged_`` (the demo writes it
    next to the scores) instead of printing scikit-learn's warning."""
    acts, pos, _, _ = planted_positions(n_grids=40)
    assert PositionProbe().fit(acts, pos).converged_
    assert not PositionProbe(max_iter=2).fit(acts, pos).converged_
    assert not [w for w in recwarn if "converge" in str(w.message)]


def test_train_probe_position_target_reads_a_planted_agent_from_a_real_store(
    tmp_path, goalprobe_cli
):
    """``goalprobe train-probe --target position`` on a real HDF5 store: the agent's position
    written into one block's anchors is read there (above the size prior and the shuffled
    control), not in the other block, and the random goal nowhere; the test grids are the
    cell-type sweep's (same seed and fraction)."""
    import json

    from goalprobe.probes.probe_sweep import StoreProbeLoader
    from store_fixtures import make_batch, write_store

    rng = np.random.default_rng(4)
    batches = []
    for start in range(0, 160, 40):
        batch = make_batch(rng, [f"g{i // 4}" for i in range(start, start + 40)], start)
        agent = batch.labels["agent_row_col"].astype(np.int64)
        planted = batch.acts["pre_reasoning"][3]
        planted[np.arange(len(agent)), 0, agent[:, 0]] += 6.0  # row one-hot in token 0
        planted[np.arange(len(agent)), 1, agent[:, 1]] += 6.0  # column one-hot in token 1
        batches.append(batch)
    store = write_store(tmp_path / "planted.h5", batches)
    out = tmp_path / "positions"
    result = goalprobe_cli("train-probe", store, "--target", "position", "--layers", "1,3",
                           "--out", out, "--n-bootstrap", 200)  # fmt: skip
    assert result.exit_code == 0, result.output
    sweep = json.loads((out / "positions.json").read_text())
    assert sweep["schema"] == "goalprobe.position_sweep" and sweep["schema_version"] == 1
    runs = {run["layer"]: run for run in sweep["runs"]}
    loader = StoreProbeLoader(store)
    split = split_by_grid(
        loader.all_grid_ids, test_fraction=0.2, stratify=loader.all_grid_sizes, random_state=0
    )
    assert runs[3]["n_test_grids"] == len(np.unique(loader.all_grid_ids[split.test]))

    def top1(layer, target, model="probe"):
        return runs[layer][target]["models"][model]["top1"]["value"]

    assert top1(3, "agent") > 0.9
    assert runs[3]["agent"]["selectivity"]["top1"]["above_baseline"]
    assert top1(3, "agent", "shuffled") < 0.3 and top1(1, "agent") < 0.3
    assert top1(1, "goal") < 0.3 and top1(3, "goal") < 0.3
    assert "position probes" in result.output
