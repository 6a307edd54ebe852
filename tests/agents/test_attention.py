"""The SDPA sinks kernel against transformers' eager GPT-OSS attention: same outputs (padding,
sliding windows, KV-cache decoding), same greedy tokens, the choice by device."""

from __future__ import annotations

import pytest
import torch
from agent_fixtures import tiny_gpt_oss
from goalprobe.agents.attention import (
    SINK_ATTENTION,
    resolve_attention,
    set_attention,
)
from goalprobe.agents.models import load_model
from goalprobe.agents.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _model(tokenizer, window: int = 8):
    model = tiny_gpt_oss(
        tokenizer, hidden=32, heads=4, kv_heads=2, head_dim=8, sliding_window=window
    )
    with torch.no_grad():  # sinks far from zero: a kernel that ignored them would differ
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(4) * 3)
    return model.eval()


def _padded_batch(tokenizer, lengths=(30, 19, 7), seed=0):
    generator = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.full((len(lengths), longest), tokenizer.pad_token_id)
    mask = torch.zeros((len(lengths), longest), dtype=torch.long)
    for row, n in enumerate(lengths):  # left padding, as generate pads
        ids[row, longest - n :] = torch.randint(10, len(tokenizer), (n,), generator=generator)
        mask[row, longest - n :] = 1
    return ids, mask


def _hidden(model, implementation, ids, mask):
    set_attention(model, implementation, "cpu")
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    return out.logits, out.hidden_states


def test_padded_batch_matches_eager_past_the_sliding_window(tokenizer):
    model = _model(tokenizer, window=8)  # 30 tokens: the sliding layers mask most keys
    ids, mask = _padded_batch(tokenizer)
    eager_logits, eager_hidden = _hidden(model, "eager", ids, mask)
    sink_logits, sink_hidden = _hidden(model, SINK_ATTENTION, ids, mask)
    assert model.config._attn_implementation == SINK_ATTENTION
    real = mask.bool()
    for e, s in zip(eager_hidden, sink_hidden, strict=True):
        torch.testing.assert_close(s[real], e[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sink_logits[real], eager_logits[real], rtol=1e-5, atol=1e-5)
    # and the sinks matter: zeroing them moves eager's outputs well beyond that tolerance
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.zero_()
    moved, _ = _hidden(model, "eager", ids, mask)
    assert (moved[real] - eager_logits[real]).abs().max() > 1e-2


def test_cached_decoding_matches_eager_tokens_and_scores(tokenizer):
    model = _model(tokenizer, window=8)
    ids, mask = _padded_batch(tokenizer, lengths=(12, 9, 5, 12), seed=1)
    runs = {}
    for implementation in ("eager", SINK_ATTENTION):
        set_attention(model, implementation, "cpu")
        with torch.inference_mode():
            runs[implementation] = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=20,
                min_new_tokens=20,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.pad_token_id,
            )
    eager, sink = runs["eager"], runs[SINK_ATTENTION]
    assert torch.equal(eager.sequences, sink.sequences)
    torch.testing.assert_close(
        torch.stack(sink.scores), torch.stack(eager.scores), rtol=1e-4, atol=1e-4
    )


def test_bundled_agent_loads_with_the_kernel_the_device_asks_for():
    assert resolve_attention("auto", "cpu") == SINK_ATTENTION
    assert resolve_attention("auto", "cuda") == "eager"
    assert resolve_attention("eager", "cpu") == "eager"
    with pytest.raises(ValueError, match="attention 'sdpa'"):
        resolve_attention("sdpa", "cpu")
    with pytest.raises(ValueError, match="attention 'fast'"):
        load_model("bundled", device="cpu", attention="fast")
    fast = load_model("bundled", device="cpu")
    assert fast.model.config._attn_implementation == SINK_ATTENTION
    eager = load_model("bundled", device="cpu", attention="eager")
    assert eager.model.config._attn_implementation == "eager"
    prompt = fast.tokenizer("the agent at row 3", return_tensors="pt").input_ids
    with torch.inference_mode():
        a, b = fast.model(prompt).logits, eager.model(prompt).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
