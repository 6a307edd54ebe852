"""Reasoning rows of the activation store (schema version 2): ragged rows at every k-th token of
each step's analysis message and its last token, equal to a plain forward hook and to
``output_hidden_states`` at those positions, through every capture backend, parts, shards and
merge; version 1 stores (no reasoning rows) still read."""

from __future__ import annotations

import copy
import shutil

import h5py
import numpy as np
import pytest
import torch
from agent_fixtures import replay_model
from goalprobe.activations.capture import make_backend
from goalprobe.activations.extract import ExtractConfig, extract
from goalprobe.activations.store import ActivationStore, StoreFormatError, concatenate_stores
from goalprobe.activations.store.merge import merge_shards
from goalprobe.agents.trajectories import read_steps

LAYERS = (0, 1, 2)
EVERY = 3


@pytest.fixture(scope="module")
def model(tokenizer):
    return replay_model(tokenizer).eval()


CONFIG = ExtractConfig(layers=LAYERS, batch_size=3, rows_per_part=4, reasoning_every=EVERY)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, trajectories, model, tokenizer):
    out = tmp_path_factory.mktemp("ref") / "reference.h5"
    capture = make_backend("hooks", model, tokenizer)
    extract(trajectories, out, capture, tokenizer, CONFIG, model_id="tiny")
    return out


def store_contents(path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
            )
        )
    return out


def block_outputs(model, ids) -> tuple[dict[int, torch.Tensor], tuple[torch.Tensor, ...]]:
    """A plain forward of one whole, unpadded sequence: each block's output by a forward hook,
    and ``output_hidden_states`` (whose last entry is after the final norm)."""
    hidden: dict[int, torch.Tensor] = {}
    handles = [
        model.model.layers[x].register_forward_hook(
            lambda m, a, o, x=x: hidden.__setitem__(x, o[0] if isinstance(o, tuple) else o)
        )
        for x in LAYERS
    ]
    try:
        with torch.inference_mode():
            states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    finally:
        for h in handles:
            h.remove()
    return hidden, states


@pytest.mark.parametrize("backend", ["hooks", "nnsight", "transformer_lens"])
def test_reasoning_rows_equal_a_forward_hook_and_hidden_states(
    tmp_path, trajectories, model, tokenizer, backend
):
    target = copy.deepcopy(model) if backend == "transformer_lens" else model
    options = {"copy_model": False} if backend == "transformer_lens" else {}
    capture = make_backend(backend, target, tokenizer, **options)
    out = tmp_path / "s.h5"
    extract(trajectories, out, capture, tokenizer, CONFIG, model_id="tiny")
    steps = list(read_steps(trajectories))
    with ActivationStore(out) as store:
        assert store.schema_version == 3 and store.reasoning_every == EVERY
        offsets = store.reasoning_offsets()
        assert offsets.shape == (len(steps) + 1,) and offsets[0] == 0
        index = store.reasoning_rows()
        assert np.array_equal(index.row, np.repeat(np.arange(len(steps)), np.diff(offsets)))
        with_rows = 0
        for i, step in enumerate(steps):
            sel = index.row == i
            if not step.reasoning:
                assert not sel.any()
                continue
            with_rows += 1
            ids = [*step.prompt_token_ids, *step.generated_token_ids]
            tokens, positions = index.tokens[sel], index.positions[sel]
            length = int(index.length[sel][0])
            start = int(positions[0] - tokens[0])
            # the rows' span holds exactly the recorded reasoning text
            assert tokenizer.decode(ids[start : start + length]) == step.reasoning
            assert tokens.tolist() == sorted({*range(EVERY - 1, length, EVERY), length - 1})
            np.testing.assert_allclose(index.fraction[sel], (tokens + 1) / length, rtol=1e-6)
            assert index.fraction[sel][-1] == 1.0
            hooked, states = block_outputs(model, ids)
            for layer in LAYERS:
                got = store.read_reasoning(layer, index.index[sel]).astype(np.float32)
                want = hooked[layer][0, positions].float().numpy()
                np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
                if layer + 1 < len(states) - 1:  # the last entry is after the final norm
                    hs = states[layer + 1][0, positions].float().numpy()
                    np.testing.assert_allclose(got, hs, atol=2e-3, rtol=2e-3)
        assert 0 < with_rows < len(steps)


def test_parts_shards_and_merge_keep_the_ragged_rows(
    tmp_path, trajectories, model, tokenizer, reference
):
    capture = make_backend("hooks", model, tokenizer)
    one_part = tmp_path / "one.h5"
    config = ExtractConfig(layers=LAYERS, batch_size=5, rows_per_part=1000, reasoning_every=EVERY)
    extract(trajectories, one_part, capture, tokenizer, config, model_id="tiny")
    want = store_contents(reference)
    got = store_contents(one_part)
    assert want.keys() == got.keys() and int(want["reasoning/offsets"][-1]) > 0
    for name in want:  # batches differ: activations agree to float16 rounding only
        if "layer_" in name:
            np.testing.assert_allclose(
                got[name].astype(np.float32), want[name].astype(np.float32), atol=2e-3
            )
        else:
            assert np.array_equal(got[name], want[name]), name
    shards = []
    for index in range(2):
        sharded = ExtractConfig(
            layers=LAYERS, batch_size=3, rows_per_part=2, reasoning_every=EVERY, shard=f"{index}/2"
        )
        path = tmp_path / f"shard{index}.h5"
        extract(trajectories, path, capture, tokenizer, sharded, model_id="tiny")
        shards.append(path)
    merged = merge_shards(list(reversed(shards)), tmp_path / "merged.h5")
    got = store_contents(merged)
    for name in want:
        if "layer_" in name:
            np.testing.assert_allclose(
                got[name].astype(np.float32), want[name].astype(np.float32), atol=2e-3
            )
        else:
            assert np.array_equal(got[name], want[name]), name
    # reordering rows carries each row's reasoning rows with it
    with ActivationStore(reference) as store:
        n = len(store)
        order = np.random.default_rng(0).permutation(n)
        attrs = {k: v for k, v in store.attrs.items() if k in ("model_id", "config")}
        before = store.row_batch(order)
    shuffled = concatenate_stores([reference], tmp_path / "shuffled.h5", attrs, order=order)
    with ActivationStore(shuffled) as store:
        after = store.row_batch(np.arange(n))
    assert before.reasoning is not None and after.reasoning is not None
    assert np.array_equal(before.reasoning.counts, after.reasoning.counts)
    assert np.array_equal(before.reasoning.positions, after.reasoning.positions)
    assert np.array_equal(before.reasoning.acts[1], after.reasoning.acts[1])


def test_a_version_1_store_is_refused(tmp_path, reference):
    """The version 1 layout (no /reasoning group) never shipped in a release: refused, by name."""
    old = tmp_path / "old.h5"
    shutil.copy(reference, old)
    with h5py.File(old, "r+") as f:
        del f["reasoning"]
        f.attrs["schema_version"] = 1
    with pytest.raises(StoreFormatError, match="store schema version 1, this goalprobe reads"):
        ActivationStore(old)


def test_reasoning_every_is_validated():
    for bad in (-1, True):
        with pytest.raises(ValueError, match="reasoning_every"):
            ExtractConfig(layers=(0,), reasoning_every=bad)
    assert ExtractConfig(layers=(0,), reasoning_every=4).to_json()["reasoning_every"] == 4


def test_cli_refuses_a_bad_k_before_loading_a_model(tmp_path, trajectories):
    from typer.testing import CliRunner

    from goalprobe.cli import app

    result = CliRunner().invoke(
        app,
        [
            "extract",
            str(trajectories),
            "--out",
            str(tmp_path / "x.h5"),
            "--model",
            str(tmp_path / "no-such-model"),
            "--reasoning-every",
            "-2",
        ],
    )
    assert result.exit_code == 2
    assert "--reasoning-every" in result.output and "no-such-model" not in result.output
    assert not (tmp_path / "x.h5").exists()
