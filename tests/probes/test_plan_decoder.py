"""Tests of the one-shot plan decoder, its metrics, artefacts and capacity sweep.

Synthetic activations encode a known plan linearly (every step's token one-hot, projected by a
fixed random matrix into each of the three anchor tokens, plus noise), so a decoder that works
must recover the plan and one trained on activations shuffled across examples must not.
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from goalprobe.gridworld.core import PLAN_END, PLAN_PAD
from goalprobe.probes.plan_decoder import PlanDecoder
from goalprobe.probes.plan_metrics import (
    canonical_plans,
    encode_plans,
    majority_plan,
    plan_lengths,
    plan_metrics,
    plan_metrics_by_group,
    prefix_hits,
    random_baseline,
    read_plan_runs,
    read_predicted_plans,
    truncate_plans,
    validate_plans,
    write_predicted_plans,
)
from goalprobe.probes.plan_sweep import (
    PlanDataset,
    PlanSweepConfig,
    StorePlanLoader,
    run_plan_sweep,
)
from goalprobe.probes.serialization import load_plan_decoder, save_plan_decoder
from goalprobe.probes.training import train_module
from safetensors.torch import load_file

D_MODEL = 64
E, P = PLAN_END, PLAN_PAD


def synthetic(n: int, seed: int, noise: float = 0.1):
    """``(acts (n, 3, 64) float32, plans (n, 10) int8)``: plans of 0..12 random actions."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, 4, size=k) for k in rng.integers(0, 13, size=n)]
    plans = encode_plans(seqs, 10)
    one_hot = np.eye(6)[plans].reshape(n, -1)
    proj = np.random.default_rng(1234).normal(size=(3, one_hot.shape[1], D_MODEL))
    acts = np.einsum("nf,kfd->nkd", one_hot, proj) + noise * rng.normal(size=(n, 3, D_MODEL))
    return acts.astype(np.float32), plans


def small_decoder(**kw) -> PlanDecoder:
    params = dict(
        n_layers=1,
        n_heads=4,
        d_bottleneck=32,
        learning_rate=5e-3,
        batch_size=128,
        max_epochs=30,
        n_iter_no_change=5,
        dropout=0.0,
        device="cpu",
        random_state=0,
    )
    params.update(kw)
    return PlanDecoder(**params)


@pytest.fixture(scope="module")
def data():
    return {"train": synthetic(512, 0), "val": synthetic(128, 1), "test": synthetic(256, 2)}


@pytest.fixture(scope="module")
def fitted(data):
    (X, y), (Xv, yv) = data["train"], data["val"]
    return small_decoder().fit(X, y, X_val=Xv, y_val=yv)


# ---- plan format ---------------------------------------------------------------------------


def test_encode_truncates_long_plans_and_marks_end():
    plans = encode_plans([[0, 1, 2], [3] * 12, [], [1] * 10], 10)
    assert plans[0].tolist() == [0, 1, 2, E, P, P, P, P, P, P]
    assert plans[1].tolist() == [3] * 10  # truncated, not dropped, no END in the window
    assert plans[2].tolist() == [E] + [P] * 9
    assert plans[3].tolist() == [1] * 10
    assert plan_lengths(plans).tolist() == [3, 10, 0, 10]
    assert truncate_plans(plans, 2).tolist() == [[0, 1], [3, 3], [E, P], [1, 1]]


@pytest.mark.parametrize(
    "row, message",
    [
        ([0, P, P], "PAD before any END"),
        ([0, E, 1], "an action after END"),
        ([E, E, P], "a second END"),
        ([0, 7, 1], "not a plan token"),
    ],
)
def test_validate_plans_names_the_problem(row, message):
    with pytest.raises(ValueError, match=message) as err:
        validate_plans(np.array([[0, 1, 2], row]))
    assert "[1, " in str(err.value)  # names the row


def test_canonical_plans_pads_after_first_end():
    raw = np.array([[0, E, 1, E], [1, 2, 3, 0]])
    assert canonical_plans(raw).tolist() == [[0, E, P, P], [1, 2, 3, 0]]


def test_majority_plan_is_most_frequent_row():
    plans = encode_plans([[0], [1, 1], [1, 1], [2]], 4)
    assert majority_plan(plans).tolist() == [1, 1, E, P]


# ---- metrics against hand-computed values ----------------------------------------------------


def test_prefix_accuracy_and_length_metrics_match_hand_computation():
    target = encode_plans([[0, 1, 2], [3, 3, 3, 3, 3], [0], [], [2] * 12], 6)
    predicted = np.array(
        [
            [0, 1, 2, E, 3, 3],  # whole plan right (tokens after END ignored)
            [3, 3, 0, 3, 3, 3],  # wrong at step 3, predicts 6 actions
            [0, 1, 1, 1, 1, 1],  # right action, misses END at step 2, length 6
            [E, 0, 0, 0, 0, 0],  # empty plan right
            [2, 2, 2, 2, E, 0],  # 4 of a truncated 6-action plan, ends early
        ]
    )
    hits = prefix_hits(predicted, target)
    assert hits.astype(int).tolist() == [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0],
    ]
    m = plan_metrics(predicted, target, np.array(["a", "b", "c", "d", "e"]), n_bootstrap=0)
    np.testing.assert_allclose(m.prefix_accuracy, [5 / 5, 4 / 5, 3 / 5, 3 / 5, 2 / 5, 2 / 5])
    # at least N actions: lengths are 3, 5, 1, 0, 6
    assert m.n_min_length.tolist() == [4, 3, 3, 2, 2, 1]
    np.testing.assert_allclose(m.prefix_accuracy_min_length, [1, 1, 2 / 3, 1 / 2, 0, 0])
    np.testing.assert_allclose(m.random_baseline, 0.25 ** np.arange(1, 7))
    # predicted lengths 3, 6, 6, 0, 4 against true 3, 5, 1, 0, 6
    assert m.exact_length_match == pytest.approx(2 / 5)
    assert m.mean_predicted_length == pytest.approx(19 / 5)
    assert m.mean_true_length == pytest.approx(15 / 5)
    assert m.length_bias == pytest.approx(4 / 5)
    assert m.median_abs_length_error == pytest.approx(1.0)  # errors 0, 1, 5, 0, 2
    assert np.isnan(m.prefix_accuracy_ci).all()  # no bootstrap asked for


def test_median_of_even_count_averages_middle_values():
    target = encode_plans([[0], [0], [0], [0]], 4)
    predicted = encode_plans([[0], [0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], 4)  # errors 0,1,3,3
    m = plan_metrics(predicted, target, np.arange(4), n_bootstrap=0)
    assert m.median_abs_length_error == pytest.approx(2.0)


def test_bootstrap_resamples_grids_and_brackets_the_estimate():
    rng = np.random.default_rng(0)
    target = encode_plans([rng.integers(0, 4, 5) for _ in range(200)], 10)
    predicted = target.copy()
    wrong = rng.random(200) < 0.4
    predicted[wrong, 0] = (predicted[wrong, 0] + 1) % 4
    grids = np.repeat(np.arange(40), 5)
    m = plan_metrics(predicted, target, grids, n_bootstrap=500, random_state=0)
    low, high = m.prefix_accuracy_ci[:, 0]
    assert low < m.prefix_accuracy[0] < high
    assert high - low < 0.3
    # one grid only: nothing to resample
    one = plan_metrics(predicted, target, np.zeros(200), n_bootstrap=100)
    assert np.isnan(one.prefix_accuracy_ci).all()
    # when every example of a grid is right or wrong together, the interval is wider than
    # when errors are spread evenly across grids
    clustered = np.repeat(rng.random(40) < 0.4, 5)
    pred_c = target.copy()
    pred_c[clustered, 0] = (pred_c[clustered, 0] + 1) % 4
    mc = plan_metrics(pred_c, target, grids, n_bootstrap=500, random_state=0)
    spread = np.tile(np.arange(5) < 2, 40)
    pred_s = target.copy()
    pred_s[spread, 0] = (pred_s[spread, 0] + 1) % 4
    ms = plan_metrics(pred_s, target, grids, n_bootstrap=500, random_state=0)
    width = lambda x: np.diff(x.prefix_accuracy_ci[:, 0])[0]  # noqa: E731
    assert width(mc) > 2 * width(ms)


def test_breakdown_by_group():
    target = encode_plans([[0], [1], [2], [3]], 3)
    predicted = encode_plans([[0], [1], [0], [0]], 3)
    by = plan_metrics_by_group(
        predicted, target, np.arange(4), np.array([7, 7, 9, 9]), n_bootstrap=0
    )
    assert list(by) == ["7", "9"]
    assert by["7"].prefix_accuracy[0] == 1.0 and by["9"].prefix_accuracy[0] == 0.0


# ---- the decoder ---------------------------------------------------------------------------


def test_decoder_recovers_encoded_plan(fitted, data):
    X, y = data["test"]
    pred = fitted.predict(X)
    assert pred.shape == y.shape and pred.dtype == np.int8
    validate_plans(pred)
    m = plan_metrics(pred, y, np.arange(len(y)), n_bootstrap=0)
    acc = m.prefix_accuracy_min_length
    assert acc[0] > 0.85 and acc[1] > 0.7 and acc[2] > 0.55 and acc[4] > 0.3
    assert (acc[:5] > 2 * random_baseline(10)[:5] + 0.2).all()
    assert m.exact_length_match > 0.7
    proba = fitted.predict_proba(X)
    assert proba.shape == (len(X), 10, 5)
    np.testing.assert_allclose(proba.sum(-1), 1.0, atol=1e-5)
    assert fitted.best_epoch_ <= fitted.n_epochs_ and fitted.input_mean_.shape == (3, D_MODEL)


def test_decoder_on_shuffled_activations_sits_at_baseline(data):
    (X, y), (Xv, yv), (Xt, yt) = data["train"], data["val"], data["test"]
    rng = np.random.default_rng(7)
    dec = small_decoder(n_iter_no_change=3).fit(
        X[rng.permutation(len(X))], y, X_val=Xv[rng.permutation(128)], y_val=yv
    )
    m = plan_metrics(dec.predict(Xt), yt, np.arange(len(yt)), n_bootstrap=0)
    majority = np.tile(majority_plan(y), (len(yt), 1))
    mm = plan_metrics(majority, yt, np.arange(len(yt)), n_bootstrap=0)
    assert m.prefix_accuracy_min_length[0] < 0.25 + 0.1
    assert m.prefix_accuracy_min_length[2] < 0.05
    # over all examples nothing beats the best constant first token by much
    best_constant = np.bincount(yt[:, 0], minlength=6).max() / len(yt)
    assert m.prefix_accuracy[0] < best_constant + 0.1
    assert m.prefix_accuracy[1] < 0.15 and mm.prefix_accuracy[0] < best_constant + 0.1


def test_fit_is_deterministic_with_random_state(data):
    (X, y), (Xv, yv) = data["train"], data["val"]
    X, y = X[:128], y[:128]
    a = small_decoder(max_epochs=2, dropout=0.1).fit(X, y, X_val=Xv, y_val=yv).predict_proba(Xv)
    b = small_decoder(max_epochs=2, dropout=0.1).fit(X, y, X_val=Xv, y_val=yv).predict_proba(Xv)
    c = small_decoder(max_epochs=2, dropout=0.1, random_state=1).fit(X, y, X_val=Xv, y_val=yv)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c.predict_proba(Xv))


def test_fit_rejects_bad_input(data):
    X, y = data["train"]
    with pytest.raises(ValueError, match="examples"):
        small_decoder().fit(X[:10], y[:11])
    with pytest.raises(ValueError, match="both X_val and y_val"):
        small_decoder().fit(X, y, X_val=X)
    with pytest.raises(ValueError, match="divisible"):
        small_decoder(n_heads=5).fit(X, y)
    with pytest.raises(ValueError, match="horizon is 12"):
        small_decoder(horizon=12).fit(X, y)


def test_save_load_round_trip(fitted, data, tmp_path):
    X, _ = data["test"]
    path = tmp_path / "decoder.safetensors"
    card_path = save_plan_decoder(fitted, path, metrics={"note": 1}, provenance={"store": "x.h5"})
    card = json.loads(card_path.read_text())
    assert card["hyperparameters"]["d_bottleneck"] == 32
    assert card["provenance"] == {"store": "x.h5"} and card["metrics"] == {"note": 1}
    assert card["fitted"]["best_epoch"] == fitted.best_epoch_
    assert "input_mean" in load_file(str(path))
    loaded = load_plan_decoder(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), fitted.predict_proba(X))
    assert loaded.get_params() == fitted.get_params()
    # a card with the names before the decoder took the probes' (lr: never shipped) is refused
    renamed = json.loads(json.dumps(card))
    renamed["hyperparameters"]["lr"] = renamed["hyperparameters"].pop("learning_rate")
    card_path.write_text(json.dumps(renamed))
    with pytest.raises(ValueError, match="hyperparameters: .*'lr'"):
        load_plan_decoder(path)
    card["schema_version"] = 99
    card_path.write_text(json.dumps(card))
    with pytest.raises(ValueError, match="schema_version 99"):
        load_plan_decoder(path)


def test_predicted_plans_hdf5_round_trip(tmp_path):
    path = tmp_path / "plans.h5"
    plans = encode_plans([[0, 1], [2] * 11], 10)
    write_predicted_plans(path, "post/layer15/decoder2", plans, np.array([4, 9]), card={"a": 1})
    write_predicted_plans(
        path, "pre/layer7/decoder1", plans, np.array([4, 9]), card={}, split=[0, 2]
    )
    assert [r.run for r in read_plan_runs(path)] == ["post/layer15/decoder2", "pre/layer7/decoder1"]
    back = read_predicted_plans(path, "post/layer15/decoder2")
    np.testing.assert_array_equal(back.plans, plans)
    assert back.row_ids.tolist() == [4, 9] and back.card == {"a": 1} and back.split is None
    assert read_predicted_plans(path, "pre/layer7/decoder1").split.tolist() == [0, 2]
    with h5py.File(path) as f:
        assert f.attrs["schema_version"] == 1
        assert f["runs/post/layer15/decoder2/plans"].dtype == np.int8
    with pytest.raises(ValueError, match="already exists"):
        write_predicted_plans(path, "pre/layer7/decoder1", plans, np.array([4, 9]), card={})


# ---- the sweep -----------------------------------------------------------------------------


def test_sweep_trains_controls_and_writes_artefacts(tmp_path):
    acts, plans = synthetic(480, 11)
    grids = np.repeat(np.arange(120), 4)
    sizes = np.repeat(np.arange(120) % 2 * 2 + 7, 4)
    calls = []

    def load(stage: str, layer: int) -> PlanDataset:
        calls.append((stage, layer))
        signal = acts if stage == "post" else np.zeros_like(acts)  # "pre" carries no plan
        return PlanDataset(
            acts=signal + 0.0,
            plans=plans,
            grid_ids=grids,
            row_ids=np.arange(480) + 1000,
            sizes=sizes,
            provenance={"synthetic": True},
        )

    config = PlanSweepConfig(
        stages=("pre", "post"),
        layers=(3,),
        decoder_layers=(1,),
        control_decoder_layers=(1,),
        n_bootstrap=50,
    )
    result = run_plan_sweep(load, config, small_decoder(max_epochs=15), out_dir=tmp_path)
    assert calls == [("pre", 3), ("post", 3)]
    runs = {r.name: r for r in result.runs}
    assert set(runs) == {
        f"{s}/layer3/{k}"
        for s in ("pre", "post")
        for k in ("majority_plan", "decoder1", "shuffled_control1")
    }
    post, control = runs["post/layer3/decoder1"], runs["post/layer3/shuffled_control1"]
    assert post.metrics.prefix_accuracy[0] > control.metrics.prefix_accuracy[0] + 0.3
    assert runs["pre/layer3/decoder1"].metrics.prefix_accuracy_min_length[1] < 0.2
    assert set(post.by_size) == {"7", "9"} and post.by_density == {}
    assert post.metrics.n_examples == result.splits["post/layer3"]["test"]["n_rows"]

    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert len(summary["runs"]) == 6 and summary["config"]["layers"] == [3]
    stored = read_predicted_plans(tmp_path / "predicted_plans.h5", "post/layer3/decoder1")
    assert stored.row_ids.tolist() == list(range(1000, 1480))
    assert stored.card["provenance"]["data"] == {"synthetic": True}
    assert (stored.split == 2).sum() == post.metrics.n_examples
    loaded = load_plan_decoder(post.model_path)
    np.testing.assert_array_equal(loaded.predict(acts), stored.plans)
    with pytest.raises(FileExistsError):
        run_plan_sweep(load, config, small_decoder(max_epochs=1), out_dir=tmp_path)


# ---- the store loader and the CLI ----------------------------------------------------------


def write_tiny_store(
    path, acts: np.ndarray, plans: np.ndarray, grids: np.ndarray, *, reasoning: bool = True
) -> None:
    """A real activation store with both anchor stages at layer 3 (post holds the plans'
    activations, pre holds noise; the last row has no post-reasoning anchor). Without
    ``reasoning`` no row holds a post-reasoning anchor (an agent that never reasons)."""
    from goalprobe.activations.store import LABEL_FIELDS, StoreLayout, StoreWriter

    n, k, d = acts.shape
    rng = np.random.default_rng(0)
    labels = {
        name: np.zeros((n, *spec.shape), dtype=object if spec.dtype is str else spec.dtype)
        for name, spec in LABEL_FIELDS.items()
    }
    labels["plan"] = plans.astype(np.uint8)
    labels["grid_id"] = np.array([f"g{g}" for g in grids], dtype=object)
    labels["run_id"] = np.array(["run"] * n, dtype=object)
    labels["variant"] = np.array(["plain"] * n, dtype=object)
    labels["grid_size"] = (7 + 2 * (grids % 2)).astype(np.int16)
    labels["density"] = np.full(n, np.nan, dtype=np.float32)
    labels["step"] = np.tile(np.arange(4), n // 4).astype(np.int32)
    present = np.ones(n, bool) if reasoning else np.zeros(n, bool)
    present[-1] = False
    layout = StoreLayout(stages=("pre_reasoning", "post_reasoning"), layers=(3,), d_model=d)
    from goalprobe.activations.store import RowBatch

    batch = RowBatch(
        acts={
            "pre_reasoning": {3: rng.normal(size=acts.shape)},
            "post_reasoning": {3: acts},
        },
        positions={s: np.zeros((n, k), np.int32) for s in layout.stages},
        present={"pre_reasoning": np.ones(n, bool), "post_reasoning": present},
        labels=labels,
    )
    with StoreWriter(path, layout, {"model_id": "synthetic"}) as writer:
        writer.append(batch)


def test_cli_reads_store_and_writes_table_figure_and_artefacts(tmp_path):
    import typer
    from typer.testing import CliRunner

    from goalprobe.commands.train_plan_decoder import command

    acts, plans = synthetic(320, 21)
    grids = np.repeat(np.arange(80), 4)
    store = tmp_path / "acts.h5"
    write_tiny_store(store, acts, plans, grids)

    loader = StorePlanLoader(store)
    post = loader("post_reasoning", 3)
    assert post.acts.shape == (319, 3, D_MODEL) and post.acts.dtype == np.float16
    assert post.row_ids.tolist() == list(range(319)) and post.densities is None
    np.testing.assert_array_equal(post.plans, plans[:319])
    assert post.provenance["model_id"] == "synthetic"
    first = StorePlanLoader(store, first_step_only=True)("pre_reasoning", 3)
    assert first.row_ids.tolist() == list(range(0, 320, 4))

    app = typer.Typer()
    app.command()(command)
    out = tmp_path / "out"
    args = [str(store), "--out", str(out), "--d-bottleneck", "32", "--n-heads", "4"]
    args += ["--decoder-layers", "1", "--control-layers", "1", "--max-epochs", "4"]
    args += ["--learning-rate", "5e-3"]
    args += ["--batch-size", "128", "--n-bootstrap", "20", "--device", "cpu"]
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "decoder 1L" in result.output and "shuffled 1L" in result.output
    assert "majority plan" in result.output and "0.25^N" in result.output
    figure = json.loads((out / "prefix_accuracy.json").read_text())
    names = {trace["name"] for trace in figure["data"]}
    assert "random 0.25^N" in names and "1-layer decoder" in names
    assert (out / "prefix_accuracy.html").stat().st_size > 1000
    runs = [r.run for r in read_plan_runs(out / "predicted_plans.h5")]
    assert "pre_reasoning/layer3/shuffled_control1" in runs and len(runs) == 4
    again = runner.invoke(app, args)
    assert again.exit_code != 0 and "exists" in again.output
    bad = runner.invoke(app, [*args, "--layers", "9", "--overwrite"])
    assert bad.exit_code != 0 and "not in the store" in bad.output


def test_sweep_of_a_store_without_reasoning_rows_uses_the_pre_reasoning_stage(tmp_path):
    acts, plans = synthetic(160, 5)
    store = tmp_path / "acts.h5"
    write_tiny_store(store, acts, plans, np.repeat(np.arange(40), 4), reasoning=False)
    loader = StorePlanLoader(store)
    assert loader.stages == ("pre_reasoning",) and loader.layers == (3,)
    config = PlanSweepConfig(decoder_layers=(1,), control_decoder_layers=(), n_bootstrap=0)
    result = run_plan_sweep(loader, config, small_decoder(max_epochs=1))
    assert result.config.stages == ("pre_reasoning",) and result.config.layers == (3,)
    names = [r.name for r in result.runs]
    assert names[0] == "pre_reasoning/layer3/majority_plan"
    assert names[-1] == "pre_reasoning/layer3/decoder1"
    # the state-only baselines sit between them (the store holds the agent's and goal's cells)
    assert "pre_reasoning/layer3/state_only" in names


def test_decoder_stops_early_on_the_shared_loop(data):
    (X, y), (Xv, yv) = data["train"], data["val"]
    dec = small_decoder(max_epochs=200, n_iter_no_change=2, learning_rate=3e-2)
    dec.fit(X[:128], y[:128], X_val=Xv, y_val=yv)
    losses = [h["validation_loss"] for h in dec.history_]
    assert dec.n_epochs_ < 200 and dec.n_epochs_ == dec.best_epoch_ + 2
    assert dec.best_validation_loss_ == min(losses) == losses[dec.best_epoch_ - 1]
    assert all(h["seconds"] >= 0 for h in dec.history_)


def test_even_batching_splits_an_epoch_into_near_equal_batches():
    sizes: dict[str, list[int]] = {"even": [], "slices": []}
    for batching, seen in sizes.items():
        module = torch.nn.Linear(2, 1)

        def batch_loss(positions, seen=seen, module=module):
            seen.append(len(positions))
            return module(torch.ones(len(positions), 2)).sum() * 0.0, torch.tensor(1.0)

        train_module(
            module,
            n_examples=100,
            batch_loss=batch_loss,
            validation_loss=None,
            max_epochs=1,
            batch_size=48,
            learning_rate=1e-3,
            weight_decay=0.0,
            n_iter_no_change=1,
            tol=0.0,
            rng=np.random.default_rng(0),
            progress=False,
            description="test",
            batching=batching,
        )
    assert sizes == {"even": [34, 33, 33], "slices": [48, 48, 4]}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_decoder_trains_on_cuda_and_predicts_like_cpu(data, tmp_path):
    (X, y), (Xv, yv), (Xt, yt) = data["train"], data["val"], data["test"]
    dec = small_decoder(device="cuda").fit(X, y, X_val=Xv, y_val=yv)
    m = plan_metrics(dec.predict(Xt), yt, np.arange(len(yt)), n_bootstrap=0)
    assert m.prefix_accuracy_min_length[0] > 0.85
    save_plan_decoder(dec, tmp_path / "gpu.safetensors")
    on_cpu = load_plan_decoder(tmp_path / "gpu.safetensors", device="cpu")
    np.testing.assert_allclose(on_cpu.predict_proba(Xt), dec.predict_proba(Xt), atol=1e-4)


def test_demo_stages_sweep_only_the_stages_a_store_has_rows_for(tmp_path):
    """The plans and distance stages of the demo on a store of an agent that never reasons."""
    from goalprobe.run_layout import RunLayout
    from goalprobe.sections import DistanceConfig, PlanDecoderTraining, PlansConfig, ProbeTraining
    from goalprobe.stages import distance, plans
    from goalprobe.stages.context import StageContext
    from goalprobe.stages.registry import Settings

    layout = RunLayout(tmp_path / "run")
    layout.store.parent.mkdir(parents=True)
    acts, labels = synthetic(160, 5)
    write_tiny_store(layout.store, acts, labels, np.repeat(np.arange(40), 4), reasoning=False)
    context = StageContext(layout)
    config = PlansConfig(
        sweep=PlanSweepConfig(decoder_layers=(1,), control_decoder_layers=(), n_bootstrap=0),
        decoder=PlanDecoderTraining(d_bottleneck=8, n_heads=2, max_epochs=1, n_iter_no_change=1),
    )
    _, summary = plans.run(context, Settings(plans=config, device="cpu"), tmp_path / "plans")
    assert summary["best"] == "pre_reasoning/layer3/decoder1"
    sweep = json.loads(layout.plan_sweep.read_text())
    assert sweep["config"]["stages"] == ["pre_reasoning"]
    assert {run["stage"] for run in sweep["runs"]} == {"pre_reasoning"}
    regressors = DistanceConfig(
        families=("linear",), training=ProbeTraining(hidden_size=8, max_epochs=1), n_bootstrap=0
    )
    _, summary = distance.run(
        context, Settings(distance=regressors, device="cpu"), tmp_path / "distance"
    )
    assert len(summary["main_linear"]) == 1 and "pre_reasoning" in next(
        iter(summary["main_linear"])
    )


def test_a_card_names_its_estimator(fitted, data, tmp_path):
    """A card records the class by its import path; another path (the module before the one
    ``goalprobe.*`` namespace, which never shipped) is refused."""
    X, _ = data["test"]
    path = tmp_path / "decoder.safetensors"
    card_path = save_plan_decoder(fitted, path)
    card = json.loads(card_path.read_text())
    assert card["estimator"] == "goalprobe.probes.plan_decoder.PlanDecoder"
    np.testing.assert_array_equal(load_plan_decoder(path).predict_proba(X), fitted.predict_proba(X))
    card["estimator"] = "probes.plan_decoder.PlanDecoder"
    card_path.write_text(json.dumps(card))
    with pytest.raises(ValueError, match="unknown estimator 'probes.plan_decoder.PlanDecoder'"):
        load_plan_decoder(path)
