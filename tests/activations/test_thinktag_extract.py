"""Extraction on a think-tag model: Qwen3's real tokenizer and chat template, a tiny random
``Qwen3ForCausalLM``; rows at the think-tag anchors and reasoning positions equal an independent
forward hook, and the store records the chat format (earlier stores read as harmony)."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
import torch
from agent_fixtures import OracleBackend
from goalprobe.activations.capture import make_backend
from goalprobe.activations.extract import ExtractConfig, extract
from goalprobe.activations.store import ActivationStore
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.models import load_model
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_steps
from goalprobe.gridworld.generator import generate_grid

LAYERS = (0, 1)
EVERY = 3


@pytest.fixture(scope="module")
def qwen3(qwen3_tiny):
    return load_model(str(qwen3_tiny.directory), device="cpu")


@pytest.fixture(scope="module")
def think_trajectories(tmp_path_factory, qwen3):
    """Oracle episodes rendered in Qwen3's chat format (some steps skip the reasoning)."""
    path = tmp_path_factory.mktemp("traj") / "qwen3.jsonl"
    grids = [
        generate_grid(size, density, np.random.default_rng(i), grid_id=f"plain-n{size}-i{i}")
        for i, (size, density) in enumerate([(5, 0.5), (7, 1.0), (5, 1.0)])
    ]
    config = RolloutConfig(episodes_per_grid=1, retries=0, batch_size=4, horizon_factor=1.0)
    backend = OracleBackend(qwen3.tokenizer, chat_format_for(qwen3.tokenizer))
    run_rollouts(grids, backend, config, path, progress=False)
    return path


def _block_outputs(model, ids: list[int]) -> dict[int, torch.Tensor]:
    hidden: dict[int, torch.Tensor] = {}
    handles = [
        model.model.layers[x].register_forward_hook(
            lambda m, a, o, x=x: hidden.__setitem__(x, o[0] if isinstance(o, tuple) else o)
        )
        for x in LAYERS
    ]
    try:
        with torch.inference_mode():
            model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return hidden


def test_rows_at_think_tag_anchors_equal_a_forward_hook(tmp_path, think_trajectories, qwen3):
    tokenizer, model = qwen3.tokenizer, qwen3.model
    fmt = chat_format_for(tokenizer)
    config = ExtractConfig(layers=LAYERS, batch_size=3, rows_per_part=4, reasoning_every=EVERY)
    out = tmp_path / "qwen3.h5"
    extract(
        think_trajectories,
        out,
        make_backend("hooks", model, tokenizer),
        tokenizer,
        config,
        model_id="qwen3-tiny",
    )
    steps = list(read_steps(think_trajectories))
    think_open, think_close = (tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>"))
    with ActivationStore(out) as store:
        assert store.schema_version == 3
        assert store.chat_format == fmt.describe() and store.chat_format["name"] == "think_tag"
        assert "anchor_token_ids" not in store.attrs
        pre, post = store.positions("pre_reasoning"), store.positions("post_reasoning")
        has_reasoning = np.asarray([bool(s.reasoning) for s in steps])
        assert np.array_equal(store.present("post_reasoning"), has_reasoning)
        assert 0 < has_reasoning.sum() < len(steps)
        index = store.reasoning_rows()
        for i, step in enumerate(steps):
            ids = [*step.prompt_token_ids, *step.generated_token_ids]
            pieces = [tokenizer.decode([ids[p]]) for p in pre[i]]
            assert pieces == ["<|im_start|>", "assistant", "\n"]
            assert pre[i][2] == len(step.prompt_token_ids) - 1
            sel = index.row == i
            if has_reasoning[i]:
                assert ids[len(step.prompt_token_ids)] == think_open
                assert ids[post[i][1]] == think_close and post[i][0] == post[i][1] - 1
                assert tokenizer.decode([ids[post[i][2]]]) == "\n\n"
                positions, tokens = index.positions[sel], index.tokens[sel]
                length = int(index.length[sel][0])
                start = int(positions[0] - tokens[0])
                text = tokenizer.decode(ids[start : start + length])
                assert text in (step.reasoning, step.reasoning + "\n")
                assert start + length == post[i][1]  # the last reasoning token is before </think>
            else:
                assert not sel.any()
            hooked = _block_outputs(model, ids)
            for layer in LAYERS:
                stages = [("pre_reasoning", pre)] + (
                    [("post_reasoning", post)] if has_reasoning[i] else []
                )
                for stage, pos in stages:
                    want = hooked[layer][0, pos[i]].float().numpy()
                    got = store.read(stage, layer, [i])[0].astype(np.float32)
                    np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
                if sel.any():
                    got = store.read_reasoning(layer, index.index[sel]).astype(np.float32)
                    want = hooked[layer][0, index.positions[sel]].float().numpy()
                    np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)

    # a store written before chat formats were recorded (version 2) reads as harmony
    old = tmp_path / "old.h5"
    shutil.copy(out, old)
    with h5py.File(old, "r+") as f:
        f.attrs["schema_version"] = 2
        del f.attrs["chat_format"]
    with ActivationStore(old) as store:
        assert store.schema_version == 2 and store.chat_format == {"name": "harmony"}


def test_harmony_store_records_its_format(tmp_path, trajectories, tokenizer):
    """The bundled agent's trajectories: the store's chat format is harmony, with its ids."""
    from agent_fixtures import replay_model

    model = replay_model(tokenizer)
    out = tmp_path / "harmony.h5"
    config = ExtractConfig(layers=(0,), batch_size=4, rows_per_part=100)
    extract(
        trajectories, out, make_backend("hooks", model, tokenizer), tokenizer, config, model_id="t"
    )
    with ActivationStore(out) as store:
        assert store.chat_format == chat_format_for(tokenizer).describe()
        assert store.chat_format["name"] == "harmony"
        assert store.attrs["anchor_token_ids"] == store.chat_format["token_ids"]
