"""GPT-OSS attention with its sinks through PyTorch's ``scaled_dot_product_attention``.

Transformers runs GPT-OSS under eager attention only (the sink logit rules SDPA out). The same
maths fits one SDPA call: append a zero key and value to every sequence and give that key the
head's sink as its logit through the additive mask; SDPA handles grouped key/value heads
(``enable_gqa``). On the bundled agent on CPU it generates in 0.68 of eager's time with the
same greedy tokens (docs/benchmarks.md). Shapes: ``query`` ``(B, H, Q, D)``, ``key``/``value``
``(B, KV, K, D)``, additive mask ``(B, 1, Q, K)``, output ``(B, Q, H, D)``.
:func:`set_attention` is the one place a loaded model's kernel is chosen (``auto``: this one on
CPU, eager elsewhere); nothing registers at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SINK_ATTENTION = "sink_attention"
"""The implementation's name in transformers' attention registry (no ``sdpa`` in it:
transformers would check the model's own SDPA support, which GPT-OSS lacks)."""

FLEX_FP32_SINKS = "flex_fp32_sinks"
"""FlexAttention with the sinks applied in fp32 (:mod:`goalprobe.agents.flex_sinks`)."""

ATTENTION_CHOICES = ("auto", "eager", SINK_ATTENTION, FLEX_FP32_SINKS)
"""What a caller may ask for: ``auto`` resolves by device (:func:`resolve_attention`)."""


def sink_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Eager GPT-OSS attention's output in one SDPA call (module docstring); no weights."""
    import torch
    import torch.nn.functional as F

    if s_aux is None:
        raise ValueError("sink_attention needs the attention sinks (s_aux): a GPT-OSS layer")
    batch, heads, q_len, head_dim = query.shape
    k_len = key.shape[2]
    zeros = key.new_zeros(batch, key.shape[1], 1, head_dim)
    key = torch.cat([key, zeros], dim=2)
    value = torch.cat([value, zeros], dim=2)
    if attention_mask is None:
        mask = _causal_mask(q_len, k_len, kwargs.get("sliding_window"), query)
    else:
        mask = attention_mask[..., :k_len].to(query.dtype)
    mask = mask.expand(batch, heads, q_len, k_len)
    sink = s_aux.reshape(1, heads, 1, 1).to(query.dtype).expand(batch, heads, q_len, 1)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=torch.cat([mask, sink], dim=-1),
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def _causal_mask(q_len: int, k_len: int, window: int | None, like: torch.Tensor) -> torch.Tensor:
    """``(1, 1, Q, K)`` additive causal mask of the last ``Q`` of ``K`` positions (only within
    ``window`` when given); used when transformers hands no mask."""
    import torch

    q_pos = torch.arange(k_len - q_len, k_len, device=like.device)[:, None]
    k_pos = torch.arange(k_len, device=like.device)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    mask = torch.zeros(q_len, k_len, dtype=like.dtype, device=like.device)
    return mask.masked_fill(~allowed, torch.finfo(like.dtype).min)[None, None]


def register_sink_attention() -> None:
    """Register :data:`SINK_ATTENTION` with transformers (idempotent), with the eager additive
    mask as its mask (transformers would hand a custom kernel none: padding would leak)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(SINK_ATTENTION, sink_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SINK_ATTENTION, eager_mask)


def register(implementation: str) -> None:
    """Register ``implementation`` with transformers when it is one of ours (idempotent)."""
    if implementation == SINK_ATTENTION:
        register_sink_attention()
    elif implementation == FLEX_FP32_SINKS:
        from goalprobe.agents.flex_sinks import register_flex_fp32_sinks

        register_flex_fp32_sinks()


def has_sinks(model: Any) -> bool:
    """Whether ``model`` is a GPT-OSS model (attention sinks in every layer)."""
    return getattr(getattr(model, "config", None), "model_type", None) == "gpt_oss"


def resolve_attention(choice: str, device: str) -> str:
    """The kernel ``choice`` means on ``device``: ``auto`` is :data:`SINK_ATTENTION` on CPU and
    ``eager`` elsewhere; the others are themselves.

    Raises:
        ValueError: a choice outside :data:`ATTENTION_CHOICES`.
    """
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"attention {choice!r}: expected one of {ATTENTION_CHOICES}")
    if choice != "auto":
        return choice
    return SINK_ATTENTION if str(device).startswith("cpu") else "eager"


def set_attention(model: Any, choice: str, device: str) -> str:
    """Run ``model`` (a transformers model) under ``choice`` resolved for ``device``; models
    without sinks keep their own kernel. Returns the implementation the model now runs."""
    implementation = resolve_attention(choice, device)
    if not has_sinks(model):
        return str(model.config._attn_implementation)
    register(implementation)
    if model.config._attn_implementation != implementation:
        model.set_attn_implementation(implementation)
    return implementation
