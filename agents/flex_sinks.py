"""GPT-OSS attention through FlexAttention with the sinks applied in fp32 (issue 43).

FlexAttention's memory is linear in the sequence length (on CUDA, compiled). Its ``score_mod``
cannot add the per-head sink to the softmax's denominator, so the sink is applied afterwards
from the log-sum-exp ``L``: ``out x sigmoid(L - sink)``. transformers 5.24 casts ``L`` to bf16
first (4-10% off at a trained head's ``L`` of 10-20); :func:`sink_renormalise` keeps ``L``, the
sink and the factor in fp32. On CPU ``flex_attention`` runs uncompiled (same maths), which is
how it is tested against fp32 eager (``tests/agents/test_flex_sinks.py``). Shapes as
:mod:`goalprobe.agents.attention`; the mask is transformers' flex ``BlockMask``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from goalprobe.agents.attention import FLEX_FP32_SINKS


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


def register_flex_fp32_sinks() -> None:
    """Register :data:`FLEX_FP32_SINKS` with transformers (idempotent), with transformers' flex
    ``BlockMask`` as its mask (causal, sliding windows and padding as blocks: nothing of the
    scores' size is materialised on CUDA; on CPU it builds uncompiled, :func:`flex_sinks_mask`,
    and the kernel equals eager attention there)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(FLEX_FP32_SINKS, flex_fp32_sinks_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(FLEX_FP32_SINKS, flex_sinks_mask)
