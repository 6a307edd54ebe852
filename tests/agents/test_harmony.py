"""Harmony rendering, completion splitting, anchors, prompts and the word-level tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from goalprobe.agents.harmony import (
    SPECIAL_TOKENS,
    HarmonyTokenIds,
    Message,
    SystemContent,
    find_anchors,
    render_completion,
    render_prompt,
    split_completion,
)
from goalprobe.agents.prompts import (
    KEY_VARIANTS,
    PromptTemplate,
    build_instructions,
    build_messages,
)
from goalprobe.agents.tokenizer import build_tokenizer, split_pieces, unknown_pieces
from goalprobe.gridworld.core import Grid, Variant
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.text import render
from goalprobe.gridworld.variants import VARIANTS, generate_variant
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GptOssConfig, GptOssForCausalLM, PreTrainedTokenizerFast

REASONING = "A is at (2, 1). G is at (1, 3). Plan: UP RIGHT RIGHT."
FINAL = '{"action": "UP"}'


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _messages(variant: str = Variant.PLAIN, n: int = 7, seed: int = 0) -> list[Message]:
    grid = generate_variant(variant, n, 0.3, np.random.default_rng(seed))
    return build_messages(render(grid), variant=variant, has_key=False)


# ----------------------------------------------------------------------------- rendering


def test_render_prompt_layout():
    text = render_prompt(_messages(), "medium")
    assert text.startswith("<|start|>system<|message|>You are ChatGPT")
    assert "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final." in text
    assert "<|start|>developer<|message|># Instructions\n\nYou control an agent" in text
    assert "<|end|><|start|>user<|message|>Current grid:\n  0 1 2" in text
    assert text.endswith("<|end|><|start|>assistant")
    assert text.count("<|start|>") == 4


def test_render_prompt_rejects_bad_input():
    with pytest.raises(ValueError, match="reasoning effort"):
        render_prompt(_messages(), "extreme")
    with pytest.raises(ValueError, match="empty"):
        render_prompt([], "low")
    with pytest.raises(ValueError, match="special token"):
        Message("user", "hi <|end|> there")
    with pytest.raises(ValueError, match="role"):
        Message("robot", "hi")
    with pytest.raises(ValueError, match="system message may only come first"):
        render_prompt([Message("user", "a"), Message("system", "b")], "low")


def test_custom_system_content():
    system = SystemContent(
        model_identity=None, knowledge_cutoff=None, conversation_start_date="2025-01-02"
    )
    text = render_prompt([Message("user", "x")], "high", system=system)
    assert text.startswith("<|start|>system<|message|>Current date: 2025-01-02\n\nReasoning: high")


def test_completion_roundtrip_and_malformed():
    completion = render_completion(REASONING, FINAL)
    assert completion == (
        f"<|channel|>analysis<|message|>{REASONING}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{FINAL}<|return|>"
    )
    for text in (completion, "<|start|>assistant" + completion):
        assert tuple(split_completion(text)) == (REASONING, FINAL, True)
    # cut off inside the final message: text kept, not well formed
    assert tuple(split_completion(completion[: -len("<|return|>") - 2])) == (
        REASONING,
        FINAL[:-2],
        False,
    )
    assert tuple(split_completion(f"<|channel|>analysis<|message|>{REASONING}")) == (
        REASONING,
        "",
        False,
    )
    assert not split_completion(completion + "trailing").well_formed
    assert not split_completion(f"<|channel|>final<|message|>{FINAL}<|return|>").well_formed
    assert tuple(split_completion("no harmony at all")) == ("", "", False)
    with pytest.raises(ValueError, match="special token"):
        render_completion("a <|end|>", FINAL)


# ----------------------------------------------------------------------------- anchors


def _anchor_tokens(tokenizer, ids, positions):
    return [tokenizer.convert_ids_to_tokens(ids[p]) for p in positions]


def test_anchors_bundled_tokenizer(tokenizer):
    special = HarmonyTokenIds.from_tokenizer(tokenizer)
    prompt = render_prompt(_messages(Variant.KEY_DOOR), "low")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(prompt + render_completion(REASONING, FINAL), add_special_tokens=False)[
        "input_ids"
    ]
    assert full_ids[: len(prompt_ids)] == prompt_ids

    only_prompt = find_anchors(prompt_ids, special)
    n = len(prompt_ids)
    assert only_prompt.pre_reasoning == (n - 3, n - 2, n - 1)
    assert only_prompt.post_reasoning is None

    anchors = find_anchors(full_ids, special)
    assert anchors.pre_reasoning == (n - 3, n - 2, n - 1)
    post = anchors.post_reasoning
    assert post is not None
    expected = ["<|end|>", "<|start|>", "assistant"]
    assert _anchor_tokens(tokenizer, full_ids, anchors.pre_reasoning) == expected
    assert _anchor_tokens(tokenizer, full_ids, post) == expected
    assert _anchor_tokens(tokenizer, full_ids, range(post[2] + 1, post[2] + 4)) == [
        "<|channel|>",
        "final",
        "<|message|>",
    ]
    # the reasoning lies strictly between the anchors
    between = tokenizer.decode(full_ids[n + 3 : post[0]], skip_special_tokens=False)
    assert between == REASONING


def test_anchors_missing_pattern(tokenizer):
    special = HarmonyTokenIds.from_tokenizer(tokenizer)
    ids = tokenizer("<|start|>user<|message|>hi", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="no pre-reasoning anchor"):
        find_anchors(ids, special)


def test_anchors_with_multi_token_channel_names():
    """A BPE tokenizer like GPT-OSS's, where 'analysis' and 'final' are ordinary, split words."""
    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]", *SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(["grid world agent goal wall user system developer"] * 5, trainer)
    backend.add_tokens(["assistant"])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    special = HarmonyTokenIds.from_tokenizer(tok)
    assert len(special.final) > 1 and len(special.analysis) > 1
    prompt = render_prompt([Message("developer", "go"), Message("user", "# _ A G")], "low")
    ids = tok(prompt + render_completion("think", "answer"), add_special_tokens=False)["input_ids"]
    anchors = find_anchors(ids, special)
    n = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert anchors.pre_reasoning == (n - 3, n - 2, n - 1)
    p = anchors.post_reasoning
    assert [ids[i] for i in p] == [special.end, special.start, special.assistant]
    assert tok.decode(ids[p[2] + 1 :], skip_special_tokens=False).startswith(
        "<|channel|>final<|message|>answer"
    )


def test_anchor_activations_of_tiny_gpt_oss(tokenizer):
    torch.manual_seed(0)
    config = GptOssConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=2,
        num_experts_per_tok=1, sliding_window=16, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = GptOssForCausalLM(config).eval()
    special = HarmonyTokenIds.from_tokenizer(tokenizer)
    text = render_prompt(_messages(), "low") + render_completion(REASONING, FINAL)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    anchors = find_anchors(ids[0].tolist(), special)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    positions = torch.tensor(anchors.pre_reasoning + anchors.post_reasoning)
    acts = torch.stack([h[0, positions] for h in hidden])  # (layers + 1, 6, d_model)
    assert acts.shape == (3, 6, 32)
    assert torch.isfinite(acts).all()
    # causal: the pre-reasoning activations do not depend on the completion
    prompt_ids = ids[:, : anchors.pre_reasoning[2] + 1]
    with torch.no_grad():
        prompt_hidden = model(input_ids=prompt_ids, output_hidden_states=True).hidden_states
    pre = torch.tensor(anchors.pre_reasoning)
    torch.testing.assert_close(prompt_hidden[-1][0, pre], hidden[-1][0, pre], atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- openai-harmony


@pytest.mark.parametrize("effort", ["low", "high"])
def test_rendering_matches_openai_harmony(effort, harmony_encoding):
    """Text-level check; tests/agents/test_gptoss_o200k.py compares token for token under o200k."""
    import openai_harmony as oh

    encoding = harmony_encoding
    messages = _messages(Variant.KEY_DOOR)
    system = oh.SystemContent.new().with_reasoning_effort(oh.ReasoningEffort(effort.capitalize()))
    base = [
        oh.Message.from_role_and_content(oh.Role.SYSTEM, system),
        oh.Message.from_role_and_content(
            oh.Role.DEVELOPER, oh.DeveloperContent.new().with_instructions(messages[0].content)
        ),
        oh.Message.from_role_and_content(oh.Role.USER, messages[1].content),
    ]
    conversation = oh.Conversation.from_messages(base)
    tokens = encoding.render_conversation_for_completion(conversation, oh.Role.ASSISTANT)
    assert encoding.decode_utf8(tokens) == render_prompt(messages, effort)

    answered = oh.Conversation.from_messages(
        [
            *base,
            oh.Message.from_role_and_content(oh.Role.ASSISTANT, REASONING).with_channel("analysis"),
            oh.Message.from_role_and_content(oh.Role.ASSISTANT, FINAL).with_channel("final"),
        ]
    )
    keep_analysis = oh.RenderConversationConfig(auto_drop_analysis=False)
    training = encoding.decode_utf8(
        encoding.render_conversation_for_training(answered, keep_analysis)
    )
    assert training == render_prompt(messages, effort) + render_completion(REASONING, FINAL)


# ----------------------------------------------------------------------------- prompts


def test_build_messages_plain_and_key():
    grid_text = "  0 1\n0 A G"
    plain = build_messages(grid_text, variant=Variant.PLAIN, has_key=True)
    assert [m.role for m in plain] == ["developer", "user"]
    assert plain[1].content == f"Current grid:\n{grid_text}"
    assert "Key" not in plain[0].content.split("Legend")[0] and "K key" not in plain[0].content
    for has_key, status in ((True, "the agent carries the key."), (False, "does not carry")):
        key = build_messages(grid_text, variant=Variant.KEY_DOOR, has_key=has_key)
        assert "Key and door rules" in key[0].content
        assert key[1].content.startswith(f"Current grid:\n{grid_text}\nKey: ")
        assert status in key[1].content
    assert set(KEY_VARIANTS) == set(VARIANTS) - {Variant.PLAIN}


def test_template_examples_match_grid_format():
    """The worked examples in the default instructions are what goalprobe.gridworld.text renders."""
    plain_walls = np.ones((5, 5), dtype=bool)
    plain_walls[1:4, 1:4] = False
    plain = Grid(walls=plain_walls, goal=(1, 3), start=(2, 1))
    assert render(plain) in build_instructions(variant=Variant.PLAIN)
    walls = np.ones((7, 7), dtype=bool)
    walls[1:3, 1:6] = False
    walls[3:6, 1] = walls[3:5, 3] = walls[3:6, 5] = False
    key = Grid(
        walls=walls, goal=(4, 3), start=(2, 1), key=(2, 5), door=(3, 3), variant=Variant.KEY_DOOR
    )
    assert render(key) in build_instructions(variant=Variant.KEY_DOOR)


def test_template_from_dir(tmp_path):
    default = PromptTemplate.default()
    for name, text in (
        ("instructions_plain.txt", "Reach G."),
        ("instructions_key.txt", "Reach G, maybe with K."),
        ("user_plain.txt", "Grid:\n{{grid}}\n"),
        ("user_key.txt", "Grid:\n{{grid}}\n{{key_status}}"),
        ("key_status_carrying.txt", "key: yes"),
        ("key_status_not_carrying.txt", "key: no"),
    ):
        (tmp_path / name).write_text(text, encoding="utf-8")
    template = PromptTemplate.from_dir(tmp_path)
    assert template != default
    messages = build_messages(
        "# A G", variant=Variant.TWO_PATH_KEY, has_key=False, template=template
    )
    assert messages[0].content == "Reach G, maybe with K."
    assert messages[1].content == "Grid:\n# A G\nkey: no"
    (tmp_path / "user_plain.txt").write_text("no placeholder", encoding="utf-8")
    with pytest.raises(ValueError, match=r"user_plain.txt must contain \{\{grid\}\}"):
        PromptTemplate.from_dir(tmp_path)
    (tmp_path / "user_key.txt").unlink()
    with pytest.raises(FileNotFoundError, match="user_key.txt"):
        PromptTemplate.from_dir(tmp_path)


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_covers_every_prompt(tokenizer):
    rng = np.random.default_rng(1)
    for variant in VARIANTS:
        for n in (5, 9, 15):
            grid = generate_variant(variant, n, float(rng.uniform()), rng)
            for has_key in (False, True):
                text = render_prompt(build_messages(render(grid), variant=variant, has_key=has_key))
                text += render_completion(REASONING, FINAL)
                assert unknown_pieces(tokenizer, text) == [], (variant, n)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                assert tokenizer.decode(ids, skip_special_tokens=False) == text
    for effort in ("low", "medium", "high"):
        assert unknown_pieces(tokenizer, render_prompt(_messages(), effort)) == []
    assert unknown_pieces(tokenizer, "zebra") == ["zebra"]


def test_grid_cells_and_coordinates_are_single_tokens(tokenizer):
    grid = generate_grid(15, 0.4, np.random.default_rng(3))
    text = render(grid)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # header: one indent token + 15 column numbers; rows: number + 15 cells; 15 newlines
    assert len(ids) == (1 + 15) + 15 * (1 + 15) + 15
    assert split_pieces("10 # _") == ["10", " #", " _"]
    for special in SPECIAL_TOKENS:
        assert len(tokenizer(special, add_special_tokens=False)["input_ids"]) == 1
