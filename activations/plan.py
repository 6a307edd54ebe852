"""Plan an extraction from the *replayed* lengths (:func:`replay_lengths`): batches by a token
budget that fit the device beside the weights as loaded.

**Memory model** (:func:`activation_bytes`, per forward pass of ``B`` sequences padded to ``T``):
eager attention holds ``3 x B x heads x T x (T + 1)`` scores, two ``B x T x T`` masks and a few
vectors per token; the MoE phase ``4 x d_model + 6 x expert width`` per (token, expert) pair
times :data:`MOE_CALIBRATION`. Blocks run one after another, so this is the peak whatever the
depth (docs/benchmarks.md). GPT-OSS-20B's experts stay MXFP4 (13.8 GB) only when transformers'
kernels can run, else bf16 (41.8 GB): :func:`mxfp4_status`. Attribution's gradient runs
(:func:`plan_attribution`, one sequence at a time) refuse MXFP4 weights (forward-only kernels)
and a longest sequence whose backward peak is over the same budget."""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from logging.handlers import BufferingHandler
from pathlib import Path
from typing import Any

from goalprobe.activations.compute import config_value
from goalprobe.activations.extract import ExtractConfig, GridCellLocator, episode_rows
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.trajectories import read_trajectories

GB = 1e9
MXFP4_BITS = 4.25
"""Bits per MXFP4 expert parameter: 4-bit values plus one 8-bit scale per block of 32."""


@dataclass(frozen=True)
class ModelShape:
    """The dimensions the memory model needs (a GPT-OSS ``config.json``'s fields)."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int
    experts_per_token: int
    expert_width: int
    vocab_size: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """From a transformers config object or a ``config.json`` dict (GPT-OSS field names;
        a dense model without experts counts as one expert of its MLP width)."""
        get = functools.partial(config_value, config)
        heads = int(get("num_attention_heads"))
        return cls(
            n_layers=int(get("num_hidden_layers")),
            d_model=int(get("hidden_size")),
            n_heads=heads,
            n_kv_heads=int(get("num_key_value_heads", heads) or heads),
            head_dim=int(get("head_dim", None) or int(get("hidden_size")) // heads),
            n_experts=int(get("num_local_experts", 1) or 1),
            experts_per_token=int(get("num_experts_per_tok", 1) or 1),
            expert_width=int(get("intermediate_size")),
            vocab_size=int(get("vocab_size")),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_model_dir(cls, directory: str | os.PathLike) -> ModelShape:
        """From a local model directory's ``config.json``."""
        text = (Path(directory) / "config.json").read_text(encoding="utf-8")
        return cls.from_config(json.loads(text))

    def parameters(self) -> dict[str, int]:
        """Parameter counts: ``experts`` (expert matrices and biases) and ``other`` (the rest)."""
        d, w, hd = self.d_model, self.expert_width, self.head_dim
        attention = (d + 1) * (self.n_heads + 2 * self.n_kv_heads) * hd
        attention += (self.n_heads * hd + 1) * d + self.n_heads
        experts = self.n_experts * ((d + 1) * 2 * w + (w + 1) * d)
        router = (d + 1) * self.n_experts
        embeddings = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        other = self.n_layers * (attention + router + 2 * d) + d + embeddings
        return {"experts": self.n_layers * experts, "other": other}

    def weight_bytes(self, *, mxfp4: bool, dtype_bytes: int = 2) -> float:
        """Bytes of the loaded weights: experts in MXFP4 (``mxfp4``) or the compute dtype, the rest
        in the compute dtype."""
        counts = self.parameters()
        experts = counts["experts"] * (MXFP4_BITS / 8 if mxfp4 else dtype_bytes)
        return experts + counts["other"] * dtype_bytes


GPT_OSS_20B = ModelShape(
    n_layers=24,
    d_model=2880,
    n_heads=64,
    n_kv_heads=8,
    head_dim=64,
    n_experts=32,
    experts_per_token=4,
    expert_width=2880,
    vocab_size=201_088,
)
"""GPT-OSS-20B's dimensions (its ``config.json``): 20.9 billion parameters."""


ATTENTION_IMPLEMENTATIONS = ("eager", "flex_attention", "sink_attention")
"""Attention implementations the planner models (``sink_attention``: CUDA's SDPA call with
sinks, :data:`SINK_ATTENTION_CUDA` times eager's attention phase)."""

SINK_ATTENTION_CUDA = 1.7
"""The SDPA sinks kernel's attention phase on CUDA relative to eager's: PyTorch's math fallback
(GQA with a float mask) upcasts the scores to fp32 (planned, not measured)."""


def planned_attention(implementation: str, device: str) -> str:
    """The memory model of kernel ``implementation`` on ``device`` (eager unless CUDA's sinks or
    flex variants)."""
    implementation = str(implementation or "eager")
    if not str(device).startswith("cuda"):
        return "eager"
    if implementation.startswith("flex"):
        return "flex_attention"
    return "sink_attention" if implementation == "sink_attention" else "eager"


MOE_CALIBRATION = 1.35
"""Factor on the MoE phase's ``4 x d_model + 6 x expert width`` elements per (token, expert)
pair: an H200 measurement, not a derivation (docs/benchmarks.md)."""


def activation_bytes(
    shape: ModelShape,
    batch: int,
    tokens: int,
    dtype_bytes: int = 2,
    attention: str = "eager",
) -> float:
    """Peak activation bytes of one teacher-forced forward of ``batch`` sequences of ``tokens``
    (module docstring): the larger of one block's attention and MoE phases."""
    t = int(tokens)
    return (
        float(dtype_bytes) * batch * max(_attention_phase(shape, t, t, attention), _moe(shape, t))
    )


def _attention_phase(shape: ModelShape, queries: int, keys: int, attention: str) -> float:
    """Elements per sequence of one block's attention: ``queries`` positions against ``keys``."""
    _check_attention(attention)
    q, k = int(queries), int(keys)
    if attention == "flex_attention":
        return q * (5 * shape.n_heads * shape.head_dim + 3 * shape.d_model + 2 * shape.n_heads)
    attn = 3 * shape.n_heads * q * (k + 1) + 2 * q * k
    attn += q * (3 * shape.n_heads * shape.head_dim + 3 * shape.d_model)
    return attn * (SINK_ATTENTION_CUDA if attention == "sink_attention" else 1.0)


def _check_attention(attention: str) -> None:
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation {attention!r}: expected one of {ATTENTION_IMPLEMENTATIONS}"
        )


def _moe(shape: ModelShape, tokens: int) -> float:
    per_pair = 4 * shape.d_model + 6 * shape.expert_width
    return tokens * per_pair * max(1.0, MOE_CALIBRATION * shape.experts_per_token)


def kv_cache_bytes(shape: ModelShape, batch: int, tokens: int, dtype_bytes: int = 2) -> float:
    """A KV cache of ``batch`` sequences of ``tokens`` positions in every block (sliding-window
    blocks counted in full: an upper bound)."""
    per_token = shape.n_layers * 2 * shape.n_kv_heads * shape.head_dim
    return float(dtype_bytes) * batch * tokens * per_token


def patched_run_bytes(
    shape: ModelShape,
    batch: int,
    prefix: int,
    suffix: int,
    dtype_bytes: int = 2,
    attention: str = "eager",
) -> float:
    """Peak bytes of a batch of patched copies: ``prefix`` tokens from a cached KV prefix,
    ``suffix`` tokens run, plus that KV cache and one fp32 logits row per copy."""
    s, p = int(suffix), int(prefix)
    phase = max(_attention_phase(shape, s, p + s, attention), _moe(shape, s))
    kv = kv_cache_bytes(shape, batch, p + s, dtype_bytes) if p > 0 else 0.0
    logits = batch * shape.vocab_size * (4 + dtype_bytes)
    return float(dtype_bytes) * batch * phase + kv + logits


def generation_bytes(
    shape: ModelShape,
    batch: int,
    prompt: int,
    new_tokens: int,
    dtype_bytes: int = 2,
    attention: str = "eager",
) -> float:
    """Peak activation bytes of greedy generation of ``batch`` prompts of ``prompt`` tokens for up
    to ``new_tokens`` tokens: the prefill's peak, the full KV cache and one step's fp32 logits."""
    phase = max(_attention_phase(shape, prompt, prompt, attention), _moe(shape, prompt))
    kv = kv_cache_bytes(shape, batch, int(prompt) + int(new_tokens), dtype_bytes)
    return float(dtype_bytes) * batch * phase + kv + batch * shape.vocab_size * (4 + dtype_bytes)


@dataclass(frozen=True)
class Mxfp4Status:
    """Whether transformers would keep GPT-OSS's MXFP4 weights here; ``reason`` says why not (''
    when ``available``)."""

    available: bool
    reason: str


def mxfp4_status() -> Mxfp4Status:
    """Ask the installed transformers' own quantizer whether it would keep MXFP4 weights here."""
    try:
        from transformers import Mxfp4Config
        from transformers.quantizers.quantizer_mxfp4 import Mxfp4HfQuantizer
    except ImportError as err:
        return Mxfp4Status(False, f"this transformers has no MXFP4 support ({err})")
    quantizer = Mxfp4HfQuantizer(Mxfp4Config(), pre_quantized=True)
    handler = BufferingHandler(capacity=1 << 20)  # the warnings it logs while validating
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("transformers.quantizers.quantizer_mxfp4")
    logger.addHandler(handler)
    try:
        quantizer.validate_environment()
    except (ImportError, ValueError, RuntimeError) as err:
        return Mxfp4Status(False, str(err))
    finally:
        logger.removeHandler(handler)
    if quantizer.quantization_config.dequantize:
        why = handler.buffer[-1].getMessage() if handler.buffer else _missing_parts()
        return Mxfp4Status(False, why or "transformers would dequantise to bf16")
    return Mxfp4Status(True, "")


def _missing_parts() -> str:
    """What of MXFP4's requirements is missing (for a message when transformers logged none)."""
    import torch
    from transformers.utils import is_kernels_available, is_triton_available

    missing = []
    if not torch.cuda.is_available():
        missing.append("no CUDA device")
    elif torch.cuda.get_device_capability() < (7, 5):
        missing.append("GPU compute capability < 7.5")
    if not is_triton_available("3.4.0"):
        missing.append("triton >= 3.4 is not installed")
    if not is_kernels_available():
        missing.append("the kernels package is not installed")
    return "; ".join(missing)


def device_memory_bytes(device: str) -> float:
    """Total memory of ``device`` (a CUDA device's, else this machine's RAM)."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        return float(torch.cuda.get_device_properties(index).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def model_bytes(model) -> float:
    """Bytes of every tensor ``model`` holds (each storage once), including tensors kept as plain
    attributes (transformers' MXFP4 experts are Triton tensors, not parameters)."""
    import torch

    seen: set[tuple] = set()
    total = 0

    def count(value, depth: int) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            key = (str(value.device), storage.data_ptr(), storage.nbytes())
            if key not in seen and storage.nbytes():
                seen.add(key)
                total += storage.nbytes()
            return
        if depth == 0 or value is None or isinstance(value, (str, bytes, int, float, bool)):
            return
        if isinstance(value, torch.nn.Module):
            return  # counted as a module of its own
        if isinstance(value, (list, tuple)):
            for item in value:
                count(item, depth - 1)
            return
        for name in ("storage", "data", "weight_scale", "scale"):
            inner = getattr(value, name, None)
            if inner is not None and inner is not value and not callable(inner):
                count(inner, depth - 1)

    for module in model.modules():
        for tensor in (*module._parameters.values(), *module._buffers.values()):
            if tensor is not None:
                count(tensor, 0)
        for name, value in vars(module).items():
            if not name.startswith("_"):
                count(value, 3)
    return float(total)


def loaded_weights_bytes(model, device: str) -> float:
    """The weights' memory as loaded: on CUDA what the allocator holds (at least
    :func:`model_bytes`), elsewhere :func:`model_bytes`."""
    import torch

    counted = model_bytes(model)
    if str(device).startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        return max(counted, float(torch.cuda.memory_allocated(index)))
    return counted


def replay_lengths(trajectories: str | os.PathLike, tokenizer, config: ExtractConfig) -> list[int]:
    """The replayed length (ids cut after the last position ``config`` reads) of every step of the
    finished episodes of ``trajectories``."""
    special = chat_format_for(tokenizer)
    locator = GridCellLocator(tokenizer) if config.grid_cells else None
    lengths: list[int] = []
    first = 0
    for episode in read_trajectories(trajectories):
        rows = episode_rows(episode, first, special, config, str(trajectories), locator)
        lengths.extend(len(r.token_ids) for r in rows)
        first += len(episode.steps)
    return lengths


@dataclass(frozen=True)
class ExtractionPlan:
    """Batches for one extraction (``max_batch_tokens`` 0: only the batch size limits) and the
    memory expected: weights, the largest batch's activation peak, one longest sequence's
    (``one_gb``) and the ``budget_gb`` left to activations, which that sequence ``fits`` or not."""

    batch_size: int
    max_batch_tokens: int
    longest: int
    steps: int
    tokens: int
    weights_gb: float
    activations_gb: float
    budget_gb: float
    fits: bool
    attention: str = "eager"
    one_gb: float = 0.0

    @property
    def peak_gb(self) -> float:
        """Weights plus the activation peak."""
        return self.weights_gb + self.activations_gb

    def to_dict(self) -> dict:
        """JSON-ready, with the peak."""
        return {**asdict(self), "peak_gb": self.peak_gb}


def plan_extraction(
    lengths: Sequence[int],
    shape: ModelShape,
    *,
    memory_bytes: float,
    weights_bytes: float,
    dtype_bytes: int = 2,
    max_batch: int = 64,
    fraction: float = 0.85,
    reserve_bytes: float = 1.5 * GB,
    attention: str = "eager",
) -> ExtractionPlan:
    """Batches that fit: the most sequences ``B`` (at most ``max_batch``) whose peak at the longest
    length fits ``fraction x memory - weights - reserve``, and the token budget ``B x longest``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    longest = max(lengths, default=1)
    budget = fraction * memory_bytes - weights_bytes - reserve_bytes
    one = activation_bytes(shape, 1, longest, dtype_bytes, attention)
    batch = max(1, min(max_batch, int(budget // one))) if budget > 0 else 1
    return ExtractionPlan(
        batch_size=max_batch,
        max_batch_tokens=batch * longest if batch < max_batch else 0,
        longest=longest,
        steps=len(lengths),
        tokens=int(sum(lengths)),
        weights_gb=weights_bytes / GB,
        activations_gb=activation_bytes(shape, batch, longest, dtype_bytes, attention) / GB,
        budget_gb=budget / GB,
        fits=budget >= one,
        attention=attention,
        one_gb=one / GB,
    )


class ExtractionDoesNotFitError(ValueError):
    """The longest replayed step does not fit the device even one sequence at a time."""


def require_fits(plan: ExtractionPlan, shape: ModelShape, dtype_bytes: int = 2) -> None:
    """Raise :class:`ExtractionDoesNotFitError` when one longest sequence does not fit beside the
    weights."""
    if plan.fits:
        return
    message = (
        f"extraction does not fit: the longest replayed step ({plan.longest:,} tokens) needs "
        f"{plan.one_gb:.1f} GB of activations one sequence at a time with {plan.attention} "
        f"attention, and {max(plan.budget_gb, 0.0):.1f} GB are left on the device after the "
        f"weights ({plan.weights_gb:.1f} GB) and the reserve"
    )
    if plan.attention == "eager":
        flex = activation_bytes(shape, 1, plan.longest, dtype_bytes, "flex_attention") / GB
        message += (
            f"; use a larger device, or drop the longest steps; flex attention would need "
            f"{flex:.1f} GB (--attn-implementation flex_attention, CUDA) but its rows are not "
            "eager's (docs/benchmarks.md): never mix the two in one study"
        )
    raise ExtractionDoesNotFitError(message)


def backward_bytes(
    shape: ModelShape,
    tokens: int,
    dtype_bytes: int = 2,
    attention: str = "eager",
) -> float:
    """Peak activation bytes of one gradient run (one sequence forward, then backward to every
    block output): every block keeps what its backward needs (eager's softmax with the sink
    column, q/k/v/output, norms' inputs and residuals, per (token, expert) pair ``d_model + 6 x
    expert width``), plus one block's transient peak and the block-output gradients. Not
    calibrated on a GPU (docs/gpu.md)."""
    _check_attention(attention)
    t = int(tokens)
    heads, d = shape.n_heads, shape.d_model
    per_block = t * (4 * heads * shape.head_dim + 6 * d)
    per_block += t * shape.experts_per_token * (d + 6 * shape.expert_width)
    kept = float(dtype_bytes) * shape.n_layers * per_block
    if attention == "eager":
        kept += float(dtype_bytes) * shape.n_layers * heads * t * (t + 1)
    else:
        kept += 4.0 * shape.n_layers * heads * t
    block_grads = float(dtype_bytes) * shape.n_layers * t * d
    return kept + block_grads + activation_bytes(shape, 1, t, dtype_bytes, attention)


@dataclass(frozen=True)
class AttributionPlan:
    """Memory of attribution's gradient runs on one device: the bf16 weights, the backward and
    forward-only peaks of the longest sequence, the budget left to activations, and whether the
    plan ``fits`` (else the ``reason``)."""

    longest: int
    sequences: int
    weights_gb: float
    backward_gb: float
    forward_gb: float
    budget_gb: float
    fits: bool
    reason: str
    attention: str = "eager"

    @property
    def peak_gb(self) -> float:
        """Weights plus the backward peak."""
        return self.weights_gb + self.backward_gb

    def to_dict(self) -> dict:
        """JSON-ready, with the peak."""
        return {**asdict(self), "peak_gb": self.peak_gb}


def plan_attribution(
    lengths: Sequence[int],
    shape: ModelShape,
    *,
    memory_bytes: float,
    mxfp4: bool = False,
    dtype_bytes: int = 2,
    fraction: float = 0.85,
    reserve_bytes: float = 1.5 * GB,
    attention: str = "eager",
) -> AttributionPlan:
    """The memory of gradient runs over sequences of ``lengths`` on a device of ``memory_bytes``
    (``mxfp4``: the weights would load as MXFP4, which refuses)."""
    longest = max(lengths, default=1)
    weights = shape.weight_bytes(mxfp4=False, dtype_bytes=dtype_bytes)
    budget = fraction * memory_bytes - weights - reserve_bytes
    backward = backward_bytes(shape, longest, dtype_bytes, attention)
    forward = activation_bytes(shape, 1, longest, dtype_bytes, attention)
    reasons = []
    if mxfp4:
        reasons.append(
            "the weights would load as MXFP4, whose kernels are forward-only (no backward "
            "pass): attribution needs bf16 weights (load with Mxfp4Config(dequantize=True) / "
            f"--dequantize), {weights / GB:.1f} GB"
        )
    if backward > budget:
        message = (
            f"the backward pass of the longest sequence ({longest:,} tokens) needs "
            f"{backward / GB:.1f} GB of activations with {attention} attention, and "
            f"{max(budget, 0.0) / GB:.1f} GB are left on the device after the bf16 weights "
            f"({weights / GB:.1f} GB) and the reserve"
        )
        if attention == "eager":
            flex = backward_bytes(shape, longest, dtype_bytes, "flex_attention")
            message += f"; flex attention would need {flex / GB:.1f} GB (CUDA only)"
        reasons.append(message)
    return AttributionPlan(
        longest=longest,
        sequences=len(lengths),
        weights_gb=weights / GB,
        backward_gb=backward / GB,
        forward_gb=forward / GB,
        budget_gb=budget / GB,
        fits=not reasons,
        reason="; ".join(reasons),
        attention=attention,
    )
