"""Patching's memory plan, its out-of-memory halving and the identity patch (issue 43), on a real
tiny random GPT-OSS.

Properties checked: the memory model gives the issue's figures at GPT-OSS-20B's dimensions; a
budget too small for one copy of the longest possible sequence is refused before any greedy
completion, naming a token budget that fits (and that budget is planned as fitting); every
patched forward pass takes at most the batch the memory model allows at its lengths; an
out-of-memory error inside a run halves the batch and ends with exactly the records of a run
without it, recording the halving, and a run started from the recorded batch does not halve
again; the identity patch's action-change rate is reported and is 0 on a deterministic CPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
from goalprobe.activations.capture import make_backend
from goalprobe.activations.plan import GB, GPT_OSS_20B, ModelShape, patched_run_bytes
from goalprobe.agents.bundled import BundledModelConfig, gpt_oss_config
from goalprobe.agents.oom import HalvingBatch, OutOfMemoryAtOneError
from goalprobe.agents.tokenizer import build_tokenizer
from goalprobe.gridworld.generator import generate_grid
from goalprobe.probes.patching.counterfactuals import (
    CounterfactualConfig,
    base_from_grid,
    build_counterfactuals,
)
from goalprobe.probes.patching.experiment import (
    PatchConfig,
    PatchingBudget,
    PatchingContext,
    PatchingDoesNotFitError,
    plan_patching,
    prepare_pairs,
)
from goalprobe.probes.patching.run import run_experiment


@pytest.fixture(scope="module")
def tiny():
    from transformers import GptOssForCausalLM

    tokenizer = build_tokenizer()
    config = gpt_oss_config(
        BundledModelConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=32,
            num_local_experts=2,
            num_experts_per_tok=1,
            sliding_window=64,
        ),
        tokenizer,
    )
    config.initializer_range = 0.5
    torch.manual_seed(0)
    return GptOssForCausalLM(config).eval(), tokenizer


@pytest.fixture(scope="module")
def pairs():
    grids = [
        generate_grid(5, 0.5, np.random.default_rng(seed), grid_id=f"g{seed}", min_distance=2)
        for seed in range(2)
    ]
    config = CounterfactualConfig(moves=("agent", "goal"), disjoint_per_move=1, control_per_move=1)
    return build_counterfactuals([base_from_grid(g) for g in grids], config)


def config(**overrides) -> PatchConfig:
    fields = dict(
        sites=("grid", "pre_reasoning", "answer"),
        layers=("0", "all"),
        reasoning="oracle",
        require_optimal=False,
        max_new_tokens=6,
        batch_size=8,
    )
    fields.update(overrides)
    return PatchConfig(**fields)


def budget_for(model, available_bytes: float) -> PatchingBudget:
    """A budget that leaves ``available_bytes`` to activations (a fake small device)."""
    shape = ModelShape.from_config(model.config)
    return PatchingBudget(
        shape=shape,
        memory_bytes=available_bytes,
        weights_bytes=0.0,
        dtype_bytes=4,
        fraction=1.0,
        reserve_bytes=0.0,
    )


class Recording:
    """The real backend, recording each patched batch and raising PyTorch's out-of-memory
    error for batches above ``limit`` (as a card would)."""

    def __init__(self, inner, limit: int | None = None) -> None:
        self.inner, self.limit, self.calls = inner, limit, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def patched_logits(self, token_ids, patches, readout_position=None):
        if self.limit is not None and len(patches) > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        self.calls.append((len(token_ids), [int(p.positions.min()) for p in patches]))
        return self.inner.patched_logits(token_ids, patches, readout_position)


def test_memory_model_at_gpt_oss_20b_dimensions():
    # issue 43: 16 copies under eager attention need ~32 GB at S = 2,000 and ~113 GB at 4,000
    at_2k = patched_run_bytes(GPT_OSS_20B, 16, 500, 2000) / GB
    at_4k = patched_run_bytes(GPT_OSS_20B, 16, 500, 4000) / GB
    assert 30 < at_2k < 36 and 105 < at_4k < 120
    # linear in the batch; the cached prefix adds keys, not queries
    one = patched_run_bytes(GPT_OSS_20B, 1, 500, 2000)
    assert patched_run_bytes(GPT_OSS_20B, 16, 500, 2000) == pytest.approx(16 * one)
    assert patched_run_bytes(GPT_OSS_20B, 1, 0, 2000) < one
    # the SDPA sinks kernel on CUDA is planned as ~1.7x eager's scores; flex is linear
    sink = patched_run_bytes(GPT_OSS_20B, 1, 0, 4000, attention="sink_attention")
    eager = patched_run_bytes(GPT_OSS_20B, 1, 0, 4000)
    flex = patched_run_bytes(GPT_OSS_20B, 1, 0, 4000, attention="flex_attention")
    assert 1.6 < sink / eager < 1.75 and flex < eager / 4


def test_a_plan_that_cannot_fit_one_copy_is_refused_before_any_generation(tiny, pairs):
    model, tokenizer = tiny
    backend = make_backend("nnsight", model, tokenizer)
    big = config(reasoning="greedy", max_new_tokens=400)
    probe = PatchingContext(backend, big, budget=budget_for(model, 1e12))
    prompts = [len(probe.prompt_ids(p.base.grid, p.base.state)) for p in pairs]
    prompts += [len(probe.prompt_ids(p.cf_grid, p.cf_state)) for p in pairs]
    # room for one copy of a 200-token completion's sequence, not of a 400-token one's
    need_200 = budget_for(model, 1e12).patched_bytes(1, 0, max(prompts) + 200 + 31)
    budget = budget_for(model, need_200)
    context = PatchingContext(backend, big, budget=budget)
    with pytest.raises(PatchingDoesNotFitError, match="patching does not fit") as err:
        prepare_pairs(pairs, context)
    assert context.batches["greedy"].largest == 0  # no greedy completion was made
    message = str(err.value)
    assert "GB" in message and "lower max_new_tokens to" in message
    fitting = int(message.split("lower max_new_tokens to ")[1].split()[0].replace(",", ""))
    assert 150 <= fitting <= 200
    kwargs = dict(batch_size=8, generation_batch_size=8)
    assert plan_patching(prompts, budget, max_new_tokens=fitting, **kwargs).fits
    assert not plan_patching(prompts, budget, max_new_tokens=fitting + 1, **kwargs).fits


def test_each_batch_is_what_the_memory_model_allows(tiny, pairs):
    model, tokenizer = tiny
    inner = make_backend("nnsight", model, tokenizer)
    inner.prefix_cache = False  # every copy runs the whole sequence: the plan's worst case
    plain = Recording(inner)
    run_experiment([], plain, config(), pairs=pairs, n_resamples=50, model_id="tiny")
    longest = max(n for n, _ in plain.calls)
    # room for 3.5 copies of the longest sequence a pair can have (prompt + budget + answer)
    budget = budget_for(model, 3.5 * budget_for(model, 0).patched_bytes(1, 0, longest + 40))
    backend = Recording(inner)
    outcome = run_experiment(
        [], backend, config(), pairs=pairs, budget=budget, n_resamples=50, model_id="tiny"
    )
    assert outcome.records and backend.calls
    for length, starts in backend.calls:
        assert len(starts) <= budget.patched_batch(0, length, 8)
    assert max(len(s) for _, s in backend.calls) <= 4  # the budget, not the config, limited
    assert max(len(s) for _, s in plain.calls) > 3
    memory = outcome.meta["memory"]
    assert memory["plan"]["fits"] and memory["batches"]["teacher_forced"]["halvings"] == []


def _records(outcome) -> str:
    return json.dumps([asdict(r) for r in outcome.records], sort_keys=True)


def test_out_of_memory_halves_and_resumes_with_identical_results(tiny, pairs):
    model, tokenizer = tiny
    inner = make_backend("nnsight", model, tokenizer)
    small = config(sites=("pre_reasoning", "answer"))
    kwargs = dict(pairs=pairs, n_resamples=50, model_id="tiny")
    plain = run_experiment([], inner, small, **kwargs)
    halved_to: list[dict] = []
    faulty = Recording(inner, limit=2)
    outcome = run_experiment(
        [], faulty, small, on_halve=lambda batch: halved_to.append(batch.to_dict()), **kwargs
    )
    batches = outcome.meta["memory"]["batches"]["teacher_forced"]
    first = batches["halvings"][0]
    assert first["from"] > 2 and first["to"] == first["from"] // 2
    assert batches["batch"] <= 2 and batches["largest_run"] == batches["batch"]
    assert [h["batch"] for h in halved_to] == [h["to"] for h in batches["halvings"]]
    assert max(len(s) for _, s in faulty.calls) <= 2
    # a rerun starts from the batch the first one was halved to: no OOM, no halving, and
    # exactly the records the halved run ended with
    again = Recording(inner, limit=2)
    rerun = run_experiment(
        [], again, small, batch_limits={"teacher_forced": batches["batch"]}, **kwargs
    )
    assert rerun.meta["memory"]["batches"]["teacher_forced"]["halvings"] == []
    assert _records(rerun) == _records(outcome)
    # and the run at the full batch differs only by floating-point reassociation (the cached
    # prefix ends at each batch's first patched position)
    assert [r.patched_action for r in outcome.records] == [r.patched_action for r in plain.records]
    np.testing.assert_allclose(
        [r.ld_patched for r in outcome.records], [r.ld_patched for r in plain.records], atol=1e-5
    )


def test_out_of_memory_at_one_item_is_an_error_with_figures():
    batch = HalvingBatch("teacher_forced", planned=4)

    def always(chunk):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(OutOfMemoryAtOneError, match="one item at a time ran out of memory"):
        batch.run([1, 2, 3, 4], always)
    assert [h["to"] for h in batch.halvings] == [2, 1]

    def other(chunk):
        raise RuntimeError("not memory")

    with pytest.raises(RuntimeError, match="not memory"):
        HalvingBatch("x", planned=2).run([1, 2], other)


def test_identity_patch_floor_is_reported_and_zero_on_cpu(tiny, pairs):
    model, tokenizer = tiny
    outcome = run_experiment(
        [],
        make_backend("nnsight", model, tokenizer),
        config(regenerate=True),
        pairs=pairs,
        n_resamples=50,
        model_id="tiny",
    )
    floor = outcome.meta["identity_floor"]
    forced, regenerated = floor["teacher_forced"], floor["regenerated"]
    # one identity patch per target (pair x direction), in the real patches' batches
    assert forced["n"] == 2 * len(pairs) and regenerated["n"] == 2 * len(pairs)
    assert forced["action_changed"] == 0 and forced["rate"] == 0.0
    assert regenerated["action_changed"] == 0
    assert forced["interval"][0] == 0.0 and 0 < forced["interval"][1] < 0.5
    assert all(r.kind != "identity" for r in outcome.records)


def test_the_patch_command_refuses_with_one_error_line(tmp_path, tiny):
    """``goalprobe patch`` with a token budget no device of this machine could run one copy
    of: one ``error:`` line, exit 2, nothing written, before any generation."""
    from goalprobe.gridworld.io import write_grid_set
    from typer.testing import CliRunner

    from goalprobe.cli import app

    model, tokenizer = tiny
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    grids = [
        generate_grid(5, 0.5, np.random.default_rng(seed), grid_id=f"c{seed}", min_distance=2)
        for seed in range(2)
    ]
    write_grid_set(tmp_path / "grids.jsonl", grids)
    out = tmp_path / "out"
    args = [
        "patch", "--grids", str(tmp_path / "grids.jsonl"), "--model", str(model_dir),
        "--out", str(out), "--reasoning", "greedy", "--allow-suboptimal", "--device", "cpu",
        "--max-new-tokens", "2000000",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert errors[0].startswith("error: patching does not fit: ") and "GB" in errors[0]
    assert not (out / "patch_results.json").exists()
