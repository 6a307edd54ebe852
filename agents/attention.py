"""GPT-OSS attention with its sinks through PyTorch's ``scaled_dot_product_attention``.

Transformers runs GPT-OSS under eager attention only (the sink logit rules SDPA out). The same
maths fits one SDPA call: append a zero key and value to every sequence and give that key the
head's sink as its logit through the additive mask; SDPA handles grouped key/value heads
(``enable_gqa``). On the bundled agent on CPU it generates in 0.68 of eager's time with the
same greedy tokens (docs/benchmarks.md). Shapes: ``query`` ``(B, H, Q, D)``, ``key``/``value``
``(B, KV, K, D)``, additive mask ``(B, 1, Q, K)``, output ``(B, Q, H, D)``.

:data:`FLEX_FP32_SINKS` (issue 43) runs FlexAttention, whose memory is linear in the sequence
length (on CUDA, compiled). Its ``score_mod`` cannot add the per-head sink to the softmax's
denominator, so the sink is applied afterwards from the log-sum-exp ``L``:
``out x sigmoid(L - sink)``. transformers 5.24 casts ``L`` to bf16 first (4-10% off at a trained
head's ``L`` of 10-20); :func:`sink_renormalise` keeps ``L``, the sink and the factor in fp32.
On CPU ``flex_attention`` runs uncompiled (same maths), which is how it is tested against fp32
eager (``tests/agents/test_flex_sinks.py``); its mask is transformers' flex ``BlockMask``.

:func:`set_attention` is the one place a loaded model's kernel is chosen (``auto``: this one on
CPU, eager elsewhere); nothing registers at import.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SINK_ATTENTION = "sink_attention"
"""The implementation's name in transformers' attention registry (no ``sdpa`` in it:
transformers would check the model's own SDPA support, which GPT-OSS lacks)."""

FLEX_FP32_SINKS = "flex_fp32_sinks"
"""FlexAttention with the sinks applied in fp32 (module docstring)."""

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


def register(implementation: str) -> None:
    """Register ``implementation`` with transformers when it is one of ours (idempotent), with
    its mask: :data:`SINK_ATTENTION` the eager additive mask (transformers would hand a custom
    kernel none: padding would leak), :data:`FLEX_FP32_SINKS` transformers' flex ``BlockMask``
    (causal, sliding windows and padding as blocks: nothing of the scores' size is materialised
    on CUDA; on CPU it builds uncompiled, :func:`flex_sinks_mask`, and the kernel equals eager
    attention there)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    kernels = {
        SINK_ATTENTION: (sink_attention_forward, eager_mask),
        FLEX_FP32_SINKS: (flex_fp32_sinks_forward, flex_sinks_mask),
    }
    if implementation in kernels:
        forward, mask = kernels[implementation]
        AttentionInterface.register(implementation, forward)
        ALL_MASK_ATTENTION_FUNCTIONS.register(implementation, mask)


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


def sink_renormalise(output: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """``output`` ``(B, H, Q, D)`` (softmax-weighted over the real keys, log-sum-exp ``lse``
    ``(B, H, Q)`` in natural log) with each head's sink logit ``sinks`` ``(H,)`` added to the
    denominator: ``output x sigmoid(lse - sink)``, computed in fp32, returned in ``output``'s
    dtype. A query with no visible key (``lse = -inf``) gets zeros."""
    import torch

    factor = torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))
    return (output.float() * factor.unsqueeze(-1)).to(output.dtype)


@lru_cache(maxsize=1)
def _compiled_flex():
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_fp32_sinks_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """GPT-OSS attention: FlexAttention over the real keys, then :func:`sink_renormalise`."""
    from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention

    if s_aux is None:
        raise ValueError(f"{FLEX_FP32_SINKS} needs the attention sinks (s_aux): a GPT-OSS layer")
    if dropout and module.training:
        raise ValueError(f"{FLEX_FP32_SINKS} runs inference only (no attention dropout)")
    block_mask = attention_mask if isinstance(attention_mask, BlockMask) else None
    additive = None
    if block_mask is None and attention_mask is not None:
        additive = attention_mask[:, :, :, : key.shape[-2]].to(query.dtype)

    def score_mod(score, batch, head, q_idx, kv_idx):
        if additive is None:
            return score
        return score + additive[batch, 0, q_idx, kv_idx]

    run = _compiled_flex() if query.device.type == "cuda" else flex_attention
    output, aux = run(
        query,
        key,
        value,
        score_mod=score_mod,
        block_mask=block_mask,
        scale=scaling,
        enable_gqa=True,
        return_aux=AuxRequest(lse=True),
    )
    output = sink_renormalise(output, aux.lse, s_aux)
    return output.transpose(1, 2).contiguous(), None


def flex_sinks_mask(*args: Any, **kwargs: Any) -> Any:
    """transformers' flex ``BlockMask`` (``flex_attention_mask``, same arguments), built
    uncompiled off CUDA: transformers compiles the mask builder, and on CPU inductor compiles it
    again for each new shape and mask function (seconds of C++ a sequence length) to build the
    same mask; the kernel runs uncompiled there anyway (:func:`flex_fp32_sinks_forward`) and is
    planned as eager (the scores materialised), so the eager builder's full mask is within the
    plan. On CUDA the builder stays compiled (nothing of the scores' size materialised)."""
    import torch
    from transformers.masking_utils import flex_attention_mask

    if torch.device(kwargs.get("device", "cpu")).type == "cuda":
        return flex_attention_mask(*args, **kwargs)
    with torch.compiler.set_stance("force_eager"):
        return flex_attention_mask(*args, **kwargs)
