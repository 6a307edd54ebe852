"""The extraction planner (issue 32, item 4): GPT-OSS-20B's weights as transformers loads them,
the activation model, batches by a token budget that keep the rows of a plain extraction, MXFP4
detected from what is installed, and the demo's extraction planned by the same planner."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.activations.extract import ExtractConfig, batch_bounds
from goalprobe.activations.plan import (
    GPT_OSS_20B,
    ExtractionDoesNotFitError,
    ModelShape,
    activation_bytes,
    mxfp4_status,
    plan_extraction,
    replay_lengths,
    require_fits,
)

GB = 1e9


def test_gpt_oss_20b_weights_as_loaded():
    counts = GPT_OSS_20B.parameters()
    assert 20.8e9 < sum(counts.values()) < 21.0e9  # 20.9 billion parameters
    assert GPT_OSS_20B.weight_bytes(mxfp4=True) / GB == pytest.approx(13.8, abs=0.1)
    assert GPT_OSS_20B.weight_bytes(mxfp4=False) / GB == pytest.approx(41.8, abs=0.1)


def test_activation_model_is_quadratic_in_the_replayed_length():
    one = activation_bytes(GPT_OSS_20B, 1, 1_000)
    assert activation_bytes(GPT_OSS_20B, 4, 1_000) == 4 * one
    assert 3.5 < activation_bytes(GPT_OSS_20B, 1, 2_000) / one < 4.1
    # the eager attention scores dominate: 3 x 64 heads x T x (T + 1) bf16 values
    assert activation_bytes(GPT_OSS_20B, 1, 4_000) / GB == pytest.approx(6.4, abs=0.1)


def test_plan_from_short_replays_fills_the_batch_and_long_ones_get_a_token_budget():
    weights = GPT_OSS_20B.weight_bytes(mxfp4=False)
    short = plan_extraction([400] * 100, GPT_OSS_20B, memory_bytes=80 * GB, weights_bytes=weights)
    assert short.batch_size == 64 and short.max_batch_tokens == 0 and short.fits
    assert short.peak_gb < 0.85 * 80
    lengths = [4_000] + [400] * 100
    long = plan_extraction(lengths, GPT_OSS_20B, memory_bytes=80 * GB, weights_bytes=weights)
    per_sequence = activation_bytes(GPT_OSS_20B, 1, 4_000)
    batch = long.max_batch_tokens // 4_000
    assert batch == int(long.budget_gb * GB // per_sequence) and 1 <= batch < 64
    assert long.peak_gb <= 0.85 * 80 - 1.5 + 1e-9
    # under the token budget, every batch of shorter steps takes less memory than the first
    bounds = batch_bounds(sorted(lengths, reverse=True), 64, long.max_batch_tokens)
    sizes = np.diff([*bounds, len(lengths)])
    assert sizes[0] == batch and sizes[1] == long.max_batch_tokens // 400
    none = plan_extraction([10_000], GPT_OSS_20B, memory_bytes=40 * GB, weights_bytes=weights)
    assert not none.fits and none.max_batch_tokens == 10_000  # one at a time, flagged


def test_batch_bounds_respect_both_limits():
    assert batch_bounds([10, 9, 5, 5, 5, 1], 4) == [0, 4]
    assert batch_bounds([10, 9, 5, 5, 5, 1], 4, max_batch_tokens=20) == [0, 2]
    assert batch_bounds([50, 5], 4, max_batch_tokens=20) == [0, 1]  # at least one sequence
    assert batch_bounds([8, 8, 8, 2, 2], 8, max_batch_tokens=16) == [0, 2, 4]
    with pytest.raises(ValueError, match="max_batch_tokens"):
        ExtractConfig(layers=(0,), max_batch_tokens=-1)
    assert "max_batch_tokens" not in ExtractConfig(layers=(0,)).to_json()  # old identities
    assert ExtractConfig(layers=(0,), max_batch_tokens=9).to_json()["max_batch_tokens"] == 9


def test_shape_from_a_config():
    from transformers import GptOssConfig

    config = GptOssConfig(
        hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        num_local_experts=32, num_experts_per_tok=4, intermediate_size=2880,
        num_hidden_layers=24, vocab_size=201_088,
    )  # fmt: skip
    assert ModelShape.from_config(config) == GPT_OSS_20B
    assert ModelShape.from_config(config.to_dict()) == GPT_OSS_20B


def test_mxfp4_is_detected_from_what_is_installed():
    import importlib.util

    import torch

    status = mxfp4_status()
    kernels = importlib.util.find_spec("kernels") is not None
    triton = importlib.util.find_spec("triton") is not None
    if not (torch.cuda.is_available() and kernels and triton):
        assert not status.available and status.reason  # says why it would dequantise
    if not triton:
        assert "triton" in status.reason.lower()


def test_eager_attention_grows_quadratically_and_flex_linearly():
    eager = [activation_bytes(GPT_OSS_20B, 1, t) for t in (4_000, 8_000, 16_000)]
    flex = [
        activation_bytes(GPT_OSS_20B, 1, t, attention="flex_attention")
        for t in (4_000, 8_000, 16_000)
    ]
    assert 3.9 < eager[2] / eager[1] < 4.1 and 3.9 < eager[1] / eager[0] < 4.1
    assert flex[2] / flex[1] == pytest.approx(2.0) and flex[1] / flex[0] == pytest.approx(2.0)
    assert flex[2] < eager[2] / 15  # 5 GB against 100 at T = 16,000
    with pytest.raises(ValueError, match="attention implementation 'sdpa'"):
        activation_bytes(GPT_OSS_20B, 1, 100, attention="sdpa")


def test_a_step_that_does_not_fit_is_refused_with_its_figures():
    """On an H200 (143,771 MiB) with bf16 weights, T = 16,000 ran out of memory under eager
    attention (docs/benchmarks.md); the plan refuses it and names flex attention."""
    h200 = 143_771 * 2**20
    weights = GPT_OSS_20B.weight_bytes(mxfp4=False)
    fits = plan_extraction([8_000] * 16, GPT_OSS_20B, memory_bytes=h200, weights_bytes=weights)
    require_fits(fits, GPT_OSS_20B)  # T = 8,000 ran (batch 3, 118 GB)
    assert fits.max_batch_tokens == 3 * 8_000
    long = plan_extraction([16_000] * 16, GPT_OSS_20B, memory_bytes=h200, weights_bytes=weights)
    with pytest.raises(ExtractionDoesNotFitError, match=r"16,000 tokens\) needs 100\.0 GB") as err:
        require_fits(long, GPT_OSS_20B)
    assert "flex_attention" in str(err.value) and "84." in str(err.value)
    assert "not eager" in str(err.value)
    flex = plan_extraction(
        [16_000] * 16,
        GPT_OSS_20B,
        memory_bytes=h200,
        weights_bytes=weights,
        attention="flex_attention",
    )
    require_fits(flex, GPT_OSS_20B)
    assert flex.attention == "flex_attention" and flex.max_batch_tokens == 17 * 16_000
    # a card too small for the weights themselves: refused under either implementation
    tiny = plan_extraction(
        [500], GPT_OSS_20B, memory_bytes=40 * GB, weights_bytes=weights, attention="flex_attention"
    )
    with pytest.raises(ExtractionDoesNotFitError, match="0.0 GB are left"):
        require_fits(tiny, GPT_OSS_20B)


class TritonTensorStandIn:
    """What transformers' MXFP4 loading puts in place of an expert weight: not a torch tensor
    nor a module parameter; its packed bytes live in ``.storage.data`` (triton_kernels'
    ``Tensor``), its scales in a precision config's ``weight_scale``."""

    def __init__(self, data) -> None:
        from types import SimpleNamespace

        self.storage = SimpleNamespace(data=data, layout="swizzled")
        self.shape = data.shape


def mxfp4_stand_in(model) -> int:
    """Replace every expert weight of ``model`` the way transformers' MXFP4 loading does
    (packed uint8 values, 4 bits each, and one uint8 scale per block of 32); returns the bytes
    put in place."""
    from types import SimpleNamespace

    import torch

    added = 0
    for module in model.modules():
        for name in ("gate_up_proj", "down_proj"):
            weight = module._parameters.get(name)
            if weight is None or weight.dim() != 3:
                continue
            packed = torch.zeros(*weight.shape[:-1], weight.shape[-1] // 2, dtype=torch.uint8)
            scales = torch.zeros(*weight.shape[:-1], weight.shape[-1] // 32, dtype=torch.uint8)
            del module._parameters[name]
            setattr(module, name, TritonTensorStandIn(packed))
            precision = SimpleNamespace(weight_scale=TritonTensorStandIn(scales), flex_ctx=None)
            setattr(module, f"{name}_precision_config", precision)
            added += packed.numel() + scales.numel()
    return added


def test_mxfp4_expert_weights_are_counted(tmp_path, trajectories, tokenizer):
    """transformers replaces each MXFP4 expert parameter with a Triton tensor, which
    ``model.parameters()`` does not list (issue 43: 3.6 of GPT-OSS-20B's 13.8 GB were seen):
    the planner counts every tensor the model holds."""
    from types import SimpleNamespace

    import torch
    from agent_fixtures import replay_model
    from goalprobe.activations.plan import loaded_weights_bytes, model_bytes

    from goalprobe.stages.activations import planned_config

    model = replay_model(tokenizer)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert model_bytes(model) == parameters + buffers  # plain model: parameters and buffers
    experts = sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if n.endswith(("gate_up_proj", "down_proj"))
    )
    added = mxfp4_stand_in(model)
    left = sum(p.numel() * p.element_size() for p in model.parameters())
    assert left == parameters - experts  # what summing model.parameters() would plan with
    assert model_bytes(model) == left + buffers + added
    assert loaded_weights_bytes(model, "cpu") == model_bytes(model)
    # a tensor shared by two modules is counted once
    model.model.layers[1].shared = model.model.layers[0].mlp.experts.gate_up_proj
    assert model_bytes(model) == left + buffers + added
    # the demo's planner is fed with them: a device with room for one replay of the longest
    # step beside the parameters alone (half the experts to spare), not beside all weights
    loaded = SimpleNamespace(model=model, tokenizer=tokenizer)
    config = ExtractConfig(layers=(0,), batch_size=4)
    lengths = replay_lengths(trajectories, tokenizer, config)
    one = activation_bytes(ModelShape.from_config(model.config), 1, max(lengths), 4)
    memory = (left + buffers + 1.5 * GB + one + added / 2) / 0.85
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("goalprobe.stages.activations.device_memory_bytes", lambda device: memory)
        with pytest.raises(ExtractionDoesNotFitError):
            planned_config(config, trajectories, loaded, "cpu")
        mxfp4_memory = memory + added / 0.85
        patch.setattr(
            "goalprobe.stages.activations.device_memory_bytes", lambda device: mxfp4_memory
        )
        assert planned_config(config, trajectories, loaded, "cpu").max_batch_tokens > 0
    assert torch.is_tensor(model.model.layers[0].mlp.experts.gate_up_proj.storage.data)


def test_the_mxfp4_kernel_is_checked_by_loading_it(monkeypatch):
    """transformers fetches the MXFP4 kernel from the Hub only at load time: the check loads it
    (here, without a GPU, it says why MXFP4 would be dequantised; with transformers' own checks
    passing but the kernel not loadable, it names the kernel and how to pre-fetch it)."""
    import importlib.util

    import torch
    from goalprobe.activations import compute
    from goalprobe.activations.plan import Mxfp4Status

    loads, message = compute.mxfp4_kernel_check()
    if not torch.cuda.is_available():
        assert not loads and message.startswith("MXFP4 would be dequantised to bf16: ")
    if importlib.util.find_spec("kernels") is None:
        monkeypatch.setattr(
            "goalprobe.activations.plan.mxfp4_status", lambda: Mxfp4Status(True, "")
        )
        loads, message = compute.mxfp4_kernel_check()
        assert not loads and "kernels-community/gpt-oss-triton-kernels" in message
        assert compute.PREFETCH in message and "offline" in message
