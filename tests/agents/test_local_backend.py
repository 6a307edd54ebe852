"""LocalBackend on a tiny random GPT-OSS: batching, seeding, loading without the network."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from agent_fixtures import tiny_gpt_oss
from goalprobe.agents.backend import Backend, SamplingConfig
from goalprobe.agents.harmony import HarmonyTokenIds, find_anchors
from goalprobe.agents.local_backend import LocalBackend, PerRowSampler
from goalprobe.agents.models import HubUnavailableError
from goalprobe.agents.prompts import build_messages
from goalprobe.agents.tokenizer import build_tokenizer
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.text import render
from transformers import GptOssForCausalLM


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def backend(tokenizer):
    return LocalBackend(tiny_gpt_oss(tokenizer, sliding_window=16), tokenizer)


def _batch(sizes=(5, 7, 9)):
    rng = np.random.default_rng(0)
    return [
        build_messages(render(generate_grid(n, 0.5, rng)), variant=Variant.PLAIN, has_key=False)
        for n in sizes
    ]


def _ids(completions):
    return [c.generated_token_ids for c in completions]


def test_generate_shapes_and_fields(backend, tokenizer):
    assert isinstance(backend, Backend)
    batch = _batch()
    completions = backend.generate(batch, SamplingConfig(max_new_tokens=12, seed=1))
    assert len(completions) == len(batch)
    special = HarmonyTokenIds.from_tokenizer(tokenizer)
    for messages, c in zip(batch, completions, strict=True):
        assert c.prompt_token_ids == backend.encode_prompt(messages, "low")
        n = len(c.prompt_token_ids)
        assert find_anchors(c.prompt_token_ids, special).pre_reasoning == (n - 3, n - 2, n - 1)
        assert 1 <= len(c.generated_token_ids) <= 12
        assert tokenizer.pad_token_id not in c.generated_token_ids[:-1]
        assert c.text == tokenizer.decode(c.generated_token_ids, skip_special_tokens=False)
        assert c.token_ids_source == "model"
        stopped = c.generated_token_ids[-1] in special.stop_ids
        assert c.finish_reason == ("stop" if stopped else "length")


def test_same_seed_same_generation(backend):
    batch = _batch()
    sampling = SamplingConfig(max_new_tokens=10, seed=7)
    first = backend.generate(batch, sampling)
    assert _ids(backend.generate(batch, sampling)) == _ids(first)
    other = backend.generate(batch, SamplingConfig(max_new_tokens=10, seed=8))
    assert _ids(other) != _ids(first)


def test_rows_do_not_depend_on_their_batch(backend):
    """With per-conversation seeds a conversation's completion ignores the other rows."""
    batch = _batch((5, 7, 9, 11))
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.0, top_p=1.0)
    together = backend.generate(batch, sampling, seeds=[11, 12, 13, 14])
    alone = backend.generate(batch[2:3], sampling, seeds=[13])
    assert alone[0].generated_token_ids == together[2].generated_token_ids
    reordered = backend.generate(batch[::-1], sampling, seeds=[14, 13, 12, 11])
    assert _ids(reordered)[::-1] == _ids(together)
    with pytest.raises(ValueError, match="seeds"):
        backend.generate(batch, sampling, seeds=[1])


def test_greedy_left_padding_matches_unbatched(backend):
    batch = _batch((5, 9, 13))
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    together = backend.generate(batch, greedy)
    for messages, c in zip(batch, together, strict=True):
        assert backend.generate([messages], greedy)[0].generated_token_ids == c.generated_token_ids


class _NoPrefixBackend(LocalBackend):
    """The same backend without the shared-prefix cache (every call left-pads full prompts)."""

    def shared_prefix_length(self, prompt):
        return 0


def test_shared_prefix_cache_matches_full_prompts(backend):
    """The cached system/developer prefix gives the same samples as encoding whole prompts,
    with sliding-window attention (window 16) crossing the prefix boundary."""
    batch = _batch((5, 7, 7, 9))
    prompt = backend.encode_prompt(batch[0])
    assert 100 < backend.shared_prefix_length(prompt) < len(prompt) - 20
    torch.manual_seed(1)  # large weights: samples that react to every context token
    config = backend.model.config.__class__(
        **{**backend.model.config.to_dict(), "initializer_range": 1.0}
    )
    backend = LocalBackend(GptOssForCausalLM(config), backend.tokenizer)
    plain = _NoPrefixBackend(backend.model, backend.tokenizer)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=16)
    seeds = [3, 4, 5, 6]
    cached = backend.generate(batch, sampling, seeds=seeds)
    assert backend._prefix_cache is not None  # the prefix path ran
    assert _ids(cached) == _ids(plain.generate(batch, sampling, seeds=seeds))
    assert _ids(backend.generate(batch, sampling, seeds=seeds)) == _ids(cached)  # cache reused


def test_sampling_config_validation():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="reasoning_effort"):
        SamplingConfig(reasoning_effort="max")


def test_from_pretrained_local_dir(backend, tmp_path, monkeypatch):
    backend.model.save_pretrained(tmp_path)
    backend.tokenizer.save_pretrained(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = LocalBackend.from_pretrained(tmp_path, device="cpu", dtype=torch.float32)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    batch = _batch((5,))
    assert _ids(loaded.generate(batch, greedy)) == _ids(backend.generate(batch, greedy))
    with pytest.raises(FileNotFoundError, match="config.json"):
        LocalBackend.from_pretrained(tmp_path / "..", device="cpu")


def test_hub_id_offline_fails_fast(monkeypatch, tmp_path):
    """Offline, an uncached hub id fails at once: no connection is even attempted."""
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # empty cache
    with pytest.raises(HubUnavailableError, match="not in the Hugging Face cache"):
        LocalBackend.from_pretrained("goalprobe-test/no-such-model")


def _full_sort_nucleus(scores: torch.Tensor, seeds, temperature: float, top_p: float):
    """The sampler as first written: a full sort of the vocabulary per row (the reference)."""
    probs = torch.softmax(scores.float() / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    return [int(torch.multinomial(probs[r], 1, generator=g)) for r, g in enumerate(generators)]


@pytest.mark.parametrize("sharpness", [0.1, 1.0, 8.0])
def test_nucleus_from_top_k_draws_what_a_full_sort_draws(sharpness):
    """Sampling from the top-k candidates (k grown until every row's nucleus fits) draws the
    same token as a full sort of the vocabulary, from flat to peaked distributions."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 201_088, generator=gen) * sharpness
    for seed in range(4):
        seeds = [seed * 10 + r for r in range(6)]
        sampler = PerRowSampler(seeds, temperature=0.7, top_p=0.95, device=torch.device("cpu"))
        drawn = sampler(None, scores.clone()).argmax(dim=-1).tolist()
        assert drawn == _full_sort_nucleus(scores, seeds, 0.7, 0.95)
