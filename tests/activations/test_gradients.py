"""Gradient runs through the capture backends (issue 41): on the tiny random GPT-OSS in float64,
``dM/da`` at every block output and position equals central finite differences of the metric
under an added perturbation (relative error < 1e-4), for the hooks reference and nnsight; GradDrop
routes the gradient around one block's branch; MXFP4 weights and a backend without gradients
are refused."""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest
import torch
from goalprobe.activations.capture import Patch, make_backend
from goalprobe.activations.capture.gradients import GradientUnsupportedError, is_mxfp4

TEXT = "A is at (1, 2). G is at (3, 0). Next to A: UP _ DOWN #. Plan: UP."


@pytest.fixture(scope="module")
def model64(gptoss_model):
    """The tiny random GPT-OSS (2 blocks, MoE, sinks) in float64, a private copy. Transformers'
    default grouped-GEMM experts take no float64 (its eager experts compute the same MoE), and
    its RMSNorm computes in float32 whatever the dtype, which would limit finite differences to
    float32's precision: the copy's norms compute the same formula in float64."""
    model = copy.deepcopy(gptoss_model).double().eval()
    model.set_experts_implementation("eager")
    for module in model.modules():
        if type(module).__name__ == "GptOssRMSNorm":
            module.forward = types.MethodType(rms_norm_float64, module)
    return model


def rms_norm_float64(self, hidden: torch.Tensor) -> torch.Tensor:
    """GptOssRMSNorm's formula without its float32 cast."""
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture(scope="module")
def ids(o200k_tokenizer):
    return np.asarray(o200k_tokenizer.encode(TEXT, add_special_tokens=False), dtype=np.int64)


READOUTS = (6, 13)
TOKENS = (16, 220, 17)  # arbitrary vocabulary ids the metric reads


def metric(logits: torch.Tensor) -> torch.Tensor:
    """A nonlinear metric of two readout rows: a log-probability plus a logit difference."""
    logp = torch.log_softmax(logits, dim=-1)
    return logp[0, TOKENS[0]] + logits[1, TOKENS[1]] - logits[1, TOKENS[2]]


def perturbed_metric(model, ids, layer: int, delta: torch.Tensor) -> float:
    """The metric with ``delta (S, d)`` added to block ``layer``'s output (an independent plain
    forward with one hook: the finite-difference reference)."""

    def add(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden + delta[None]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = model.model.layers[layer].register_forward_hook(add)
    try:
        with torch.no_grad():
            logits = model(torch.as_tensor(ids)[None], use_cache=False).logits[0]
    finally:
        handle.remove()
    return float(metric(logits[list(READOUTS)]))


@pytest.mark.parametrize("backend_name", ["hooks", "nnsight"])
def test_gradients_equal_finite_differences(model64, o200k_tokenizer, ids, backend_name):
    backend = make_backend(backend_name, model64, o200k_tokenizer)
    positions = np.arange(len(ids))
    run = backend.gradient_run(ids, [0, 1], positions, metric, READOUTS)
    assert run.grads.dtype == torch.float64 and run.grads.shape == (1, 2, len(ids), 16)
    assert run.metric == pytest.approx(perturbed_metric(model64, ids, 0, torch.zeros(1, 16)))
    # after the last readout nothing reads the stream: the gradient is exactly zero there
    assert torch.all(run.grad()[:, READOUTS[1] + 1 :] == 0)
    assert torch.any(run.grad()[:, READOUTS[0] + 1 : READOUTS[1]] != 0)
    rng = np.random.default_rng(0)
    eps = 1e-5
    for layer in (0, 1):
        # every position at once along a random direction, then single positions
        directions = [torch.as_tensor(rng.standard_normal((len(ids), 16)))]
        for position in (0, READOUTS[0], READOUTS[1] - 1):
            one = torch.zeros(len(ids), 16, dtype=torch.float64)
            one[position] = torch.as_tensor(rng.standard_normal(16))
            directions.append(one)
        for v in directions:
            plus = perturbed_metric(model64, ids, layer, eps * v)
            minus = perturbed_metric(model64, ids, layer, -eps * v)
            numeric = (plus - minus) / (2 * eps)
            analytic = float((run.grad()[layer] * v).sum())
            assert abs(analytic - numeric) <= 1e-4 * abs(numeric), (layer, analytic, numeric)
    # activations equal a clean run's
    clean = backend.clean_run(ids, [0, 1], positions)
    assert torch.allclose(run.acts.float(), clean.acts, atol=1e-5)
    # parameters are left as they were
    assert all(p.requires_grad for p in model64.parameters())


def test_hooks_and_nnsight_gradients_agree_on_reasoning_positions(model64, o200k_tokenizer, ids):
    positions = np.array([2, 5, 9, 12])
    runs = [
        make_backend(name, model64, o200k_tokenizer).gradient_run(
            ids, [1], positions, metric, READOUTS
        )
        for name in ("hooks", "nnsight")
    ]
    assert torch.allclose(runs[0].grads, runs[1].grads, rtol=1e-10, atol=1e-12)
    assert torch.allclose(runs[0].acts, runs[1].acts, rtol=1e-10, atol=1e-12)


def test_graddrop_routes_the_gradient_around_one_branch(model64, o200k_tokenizer, ids):
    backend = make_backend("hooks", model64, o200k_tokenizer)
    positions = np.arange(len(ids))
    run = backend.gradient_run(ids, [0, 1], positions, metric, READOUTS, drops=(None, 0, 1))
    plain = run.grad(None)
    # dropping block 1's branch: the gradient at block 0's output is the one at block 1's
    assert torch.allclose(run.grad(1)[0], plain[1], rtol=1e-12, atol=1e-14)
    assert not torch.allclose(plain[0], plain[1])
    # dropping block 0 changes nothing downstream of it
    assert torch.allclose(run.grad(0), plain, rtol=1e-12, atol=1e-14)
    with pytest.raises(KeyError, match="not computed"):
        run.grad(5)
    with pytest.raises(ValueError, match="outside"):
        backend.gradient_run(ids, [0], positions, metric, READOUTS, drops=(7,))
    nn_backend = make_backend("nnsight", model64, o200k_tokenizer)
    with pytest.raises(GradientUnsupportedError, match="hooks backend only"):
        nn_backend.gradient_run(ids, [0], positions, metric, READOUTS, drops=(None, 1))


def test_patched_logits_at_reads_several_positions(model64, o200k_tokenizer, ids):
    backend = make_backend("hooks", model64, o200k_tokenizer)
    values = torch.zeros(1, 1, 16, dtype=torch.float64)
    patch = Patch((0,), torch.as_tensor([3]), values)
    many = backend.patched_logits_at(ids, [patch], [5, 9, 12])
    for i, position in enumerate((5, 9, 12)):
        one = backend.patched_logits(ids, [patch], readout_position=position)
        assert torch.allclose(many[0, i], one[0].to(many.dtype), atol=1e-6)


def test_mxfp4_weights_and_backends_without_gradients_are_refused(model64, o200k_tokenizer, ids):
    quantized = copy.copy(model64)
    quantized.config = copy.deepcopy(model64.config)
    quantized.config.quantization_config = {"quant_method": "mxfp4", "dequantize": False}
    assert is_mxfp4(quantized)
    backend = make_backend("hooks", quantized, o200k_tokenizer)
    with pytest.raises(GradientUnsupportedError, match="forward-only.*bf16"):
        backend.gradient_run(ids, [0], np.arange(3), metric, READOUTS)
    quantized.config.quantization_config = {"quant_method": "mxfp4", "dequantize": True}
    assert not is_mxfp4(quantized)
    with pytest.raises(ValueError, match="outside"):
        make_backend("hooks", model64, o200k_tokenizer).gradient_run(
            ids, [0], np.arange(3), metric, [len(ids)]
        )
