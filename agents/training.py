"""The bundled agent's architecture: a small GPT-OSS, sized by :class:`BundledModelConfig`.

The training of the bundled agents (data, auxiliary losses, the loop, the evaluation behind their
cards) is not part of the library: it lives with the script that runs it,
``scripts/agent_training/`` (``scripts/train_default_agent.py``). Benchmarks and tests build
random models of the same shape from :func:`gpt_oss_config`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BundledModelConfig:
    """Size of the bundled GPT-OSS (turned into a ``GptOssConfig`` by :func:`gpt_oss_config`)."""

    hidden_size: int = 128
    """Residual stream width d_model."""

    num_hidden_layers: int = 4
    """Transformer blocks; sliding-window and full attention alternate as in GPT-OSS."""

    num_attention_heads: int = 4
    """Query heads."""

    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention)."""

    head_dim: int = 32
    """Width of each head."""

    intermediate_size: int = 256
    """Width of each expert's SwiGLU."""

    num_local_experts: int = 4
    """Experts per MoE block."""

    num_experts_per_tok: int = 2
    """Experts each token is routed to."""

    sliding_window: int = 128
    """Window of the sliding-attention layers (GPT-OSS: 128)."""

    max_position_embeddings: int = 2048
    """Longest sequence (a 15 x 15 key prompt + reasoning is about 900 tokens)."""

    rope_theta: float = 10_000.0
    """RoPE base."""


def gpt_oss_config(model_config: BundledModelConfig, tokenizer):
    """A ``transformers.GptOssConfig`` for ``model_config`` and the tokenizer's vocabulary."""
    from transformers import GptOssConfig

    c = model_config
    layer_types = [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(c.num_hidden_layers)
    ]
    sizes = {k: v for k, v in asdict(c).items() if k != "rope_theta"}  # GptOssConfig's names
    return GptOssConfig(
        vocab_size=len(tokenizer),
        **sizes,
        layer_types=layer_types,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")],
        bos_token_id=None,
        tie_word_embeddings=False,
    )
