"""Chat formats (harmony, think-tag) on real tokenizers: round trips, anchors and the reasoning
span against character offsets, the grid's tokenisation, and the error for templates without
reasoning delimiters."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.activations.extract import GridCellLocator
from goalprobe.agents.chat_format import (
    ChatFormatError,
    HarmonyFormat,
    ThinkTagFormat,
    chat_format_for,
    format_name,
)
from goalprobe.agents.prompts import build_messages
from goalprobe.agents.tokenizer import build_tokenizer
from goalprobe.gridworld.core import LABEL_CANVAS, Variant
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.text import render

PAIRS = [
    ("A is at (2, 1). G is at (1, 3). Plan: UP RIGHT RIGHT.", '{"action": "UP"}'),
    ("A is at (2, 1).\nG is at (1, 3).", '{"action": "LEFT"}'),
    ("Plan: UP RIGHT RIGHT", '{"action": "RIGHT"}'),
]
"""(reasoning, answer) pairs in the bundled vocabulary: ending in a full stop (the newline after
it merges into one Qwen3 token ``".\\n"``), with an inner newline, ending in a word."""


SIZES = range(7, 16, 2)


@pytest.fixture(scope="module")
def bundled_tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def think(qwen3_tokenizer) -> ThinkTagFormat:
    return chat_format_for(qwen3_tokenizer)


@pytest.fixture(scope="module")
def prefill(qwen3_prefill_dir) -> ThinkTagFormat:
    from transformers import AutoTokenizer

    return chat_format_for(AutoTokenizer.from_pretrained(str(qwen3_prefill_dir)))


def _messages(grid_text: str = "  0 1 2\n0 # # #\n1 # A #\n2 # G #"):
    return build_messages(grid_text, variant=Variant.PLAIN, has_key=False)


def test_registry_detects_each_format(bundled_tokenizer, qwen3_tokenizer, think):
    harmony = chat_format_for(bundled_tokenizer)
    assert isinstance(harmony, HarmonyFormat) and harmony.describe()["name"] == "harmony"
    assert isinstance(think, ThinkTagFormat)
    desc = think.describe()
    assert (desc["open_id"], desc["close_id"]) == (151667, 151668)
    assert desc["generation_prompt"] == "<|im_start|>assistant\n" and not desc["prefilled"]
    assert desc["stop"] == ["<|im_end|>"] and desc["anchor_tokens"] == 3
    assert format_name(None) == "harmony" and format_name(desc) == "think_tag"
    with pytest.raises(ValueError, match="harmony special token"):
        chat_format_for(qwen3_tokenizer, "harmony")
    with pytest.raises(ValueError, match="unknown chat format"):
        chat_format_for(qwen3_tokenizer, "chatml")


def test_think_tag_prompt_is_the_templates_own(qwen3_tokenizer, think):
    messages = _messages()
    text = think.render_prompt(messages)
    developer = messages[0].content
    expected = qwen3_tokenizer.apply_chat_template(
        [
            {"role": "system", "content": developer},
            {"role": "user", "content": messages[1].content},
        ],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=True,
    )
    assert text == expected and text.endswith("<|im_start|>assistant\n")
    assert (
        think.encode_prompt(messages)
        == qwen3_tokenizer(text, add_special_tokens=False)["input_ids"]
    )
    # the completion goalprobe renders is what the template renders for an answered turn
    reasoning, answer = PAIRS[0]
    answered = qwen3_tokenizer.apply_chat_template(
        [
            {"role": "system", "content": developer},
            {"role": "user", "content": messages[1].content},
            {"role": "assistant", "content": answer, "reasoning_content": reasoning},
        ],
        tokenize=False,
    )
    assert answered == text + think.render_completion(reasoning, answer) + "\n"


@pytest.mark.parametrize("which", ["harmony", "think", "prefill"])
@pytest.mark.parametrize("pair", PAIRS)
def test_split_inverts_render(which, pair, bundled_tokenizer, think, prefill):
    fmt = {"harmony": chat_format_for(bundled_tokenizer), "think": think, "prefill": prefill}[which]
    reasoning, answer = pair
    completion = fmt.render_completion(reasoning, answer)
    assert tuple(fmt.split_completion(completion)) == (reasoning, answer, True)
    ids = fmt.tokenizer(completion, add_special_tokens=False)["input_ids"]
    assert tuple(fmt.split_completion(ids)) == (reasoning, answer, True)
    # cut off inside the reasoning: not well formed, no answer
    cut = fmt.split_completion(completion[: completion.index(reasoning) + 5])
    assert cut.final == "" and not cut.well_formed


def _char_spans(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


@pytest.mark.parametrize("which", ["harmony", "think", "prefill"])
@pytest.mark.parametrize("pair", PAIRS)
def test_anchors_and_span_agree_with_character_offsets(
    which, pair, bundled_tokenizer, think, prefill
):
    fmt = {"harmony": chat_format_for(bundled_tokenizer), "think": think, "prefill": prefill}[which]
    reasoning, answer = pair
    prompt = fmt.render_prompt(_messages())
    completion = fmt.render_completion(reasoning, answer)
    text = prompt + completion
    ids, offsets = _char_spans(fmt.tokenizer, text)
    assert ids[: len(fmt.encode_prompt(_messages()))] == fmt.encode_prompt(_messages())
    anchors = fmt.find_anchors(ids)
    pre, post = anchors.pre_reasoning, anchors.post_reasoning
    # pre: the prompt's last three tokens, ending exactly where the prompt text ends
    assert offsets[pre[-1]][1] == len(prompt) and list(pre) == [pre[0], pre[0] + 1, pre[0] + 2]
    assert fmt.find_anchors(ids[: pre[-1] + 1]).pre_reasoning == pre
    assert fmt.find_anchors(ids[: pre[-1] + 1]).post_reasoning is None
    r_start = text.index(reasoning, len(prompt))
    r_stop = r_start + len(reasoning)
    span = fmt.reasoning_span(ids)
    assert span is not None
    first, last = offsets[span.start], offsets[span.stop - 1]
    assert first[0] == r_start
    # the last reasoning token ends with the reasoning or holds the delimiter newline after it
    assert last[1] == r_stop or (last[1] == r_stop + 1 and text[r_stop] == "\n")
    assert offsets[span.stop][0] >= r_stop
    if which == "harmony":
        assert text[offsets[post[0]][0] : offsets[post[2]][1]] == "<|end|><|start|>assistant"
    else:
        assert text[slice(*offsets[post[1]])] == "</think>"
        assert text[offsets[post[2]][1] :].startswith(answer)
        assert post[0] == span.stop - 1 or text[slice(*offsets[post[0]])] == "\n"
    # the answer tail follows the reasoning ids exactly as the model's tokenisation has them
    forced = fmt.encode_reasoning(reasoning)
    tail = [*fmt.tokenizer(answer, add_special_tokens=False)["input_ids"], fmt.stop_ids[0]]
    assert ids[len(ids) - len(tail) :] == tail and ids[-1] in fmt.stop_ids
    assert ids[len(ids) - len(tail) - len(forced) : len(ids) - len(tail)] == forced


def test_think_tag_anchor_by_ids_not_by_position(think, qwen3_tokenizer):
    """A prompt followed by other text (a longer prompt) still finds the generation prompt by
    its ids; ids that never held it are refused."""
    ids = think.encode_prompt(_messages())
    anchors = think.find_anchors(
        [*ids, *qwen3_tokenizer("<think>\nA", add_special_tokens=False)["input_ids"]]
    )
    assert anchors.pre_reasoning == (len(ids) - 3, len(ids) - 2, len(ids) - 1)
    assert anchors.post_reasoning is None
    with pytest.raises(ValueError, match="no pre-reasoning anchor"):
        think.find_anchors(qwen3_tokenizer("just text", add_special_tokens=False)["input_ids"])


def test_prefilled_template(prefill):
    desc = prefill.describe()
    assert desc["prefilled"] and desc["generation_prompt"].endswith("<think>\n")
    assert desc["reasoning_open"] == ""
    ids = prefill.encode_prompt(_messages())
    pre = prefill.find_anchors(ids).pre_reasoning
    pieces = [prefill.tokenizer.decode([ids[i]]) for i in pre]
    assert pieces == ["\n", "<think>", "\n"]


def test_templates_without_reasoning_delimiters_are_refused(llama3_tokenizer, qwen3_plain_dir):
    from transformers import AutoTokenizer

    with pytest.raises(ChatFormatError, match="no reasoning delimiters.*<think> / </think>"):
        chat_format_for(llama3_tokenizer)
    plain = AutoTokenizer.from_pretrained(str(qwen3_plain_dir))
    with pytest.raises(ChatFormatError, match="never writes </think>"):
        chat_format_for(plain)


def test_qwen3_tokenizer_matches_quicktok(qwen3_tokenizer, llama3_tokenizer):
    """The converted tokenizers encode ordinary text exactly as quicktok's own encoder."""
    import quicktok

    rng = np.random.default_rng(0)
    texts = [render(generate_grid(n, 0.3, rng)) for n in (7, 11, 15)]
    texts.append(_messages()[0].content)
    for tokenizer, name in ((qwen3_tokenizer, "qwen3"), (llama3_tokenizer, "llama3")):
        encoding = quicktok.get_encoding(name)
        for text in texts:
            assert tokenizer(text, add_special_tokens=False)["input_ids"] == list(
                encoding.encode(text)
            )


@pytest.mark.parametrize("which", ["qwen3", "llama3", "bundled"])
def test_grid_cell_locator_unique_for_every_size(which, qwen3_tokenizer, llama3_tokenizer):
    """Sizes 7-15 (generated grids are odd): each cell maps to its own token, the token holding the cell's symbol. Under
    Qwen3's and Llama 3's byte-level BPE a row's last cell merges with the newline that ends the
    row (``" #\\n"`` is one token): that token is still the cell's own, so its label is the
    cell's; the merge shows in the token's text, checked here."""
    tokenizer = {
        "qwen3": qwen3_tokenizer,
        "llama3": llama3_tokenizer,
        "bundled": build_tokenizer(),
    }[which]
    locator = GridCellLocator(tokenizer)
    rng = np.random.default_rng(1)
    merged = 0
    for size in SIZES:
        grid_text = render(generate_grid(size, 0.3, rng))
        messages = _messages(grid_text)
        if which == "llama3":
            text = f"{messages[0].content}\n\n{messages[1].content}"
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = chat_format_for(tokenizer).encode_prompt(messages)
        positions = locator.positions(ids, grid_text, f"size {size}")
        canvas = positions.reshape(LABEL_CANVAS, LABEL_CANVAS)
        inside = canvas[:size, :size]
        assert (inside > 0).all() and len(np.unique(inside)) == size * size
        assert (canvas[size:, :] == 0).all() and (canvas[:, size:] == 0).all()
        rows = grid_text.split("\n")[1:]
        for r, line in enumerate(rows):
            symbols = line.split()[1:]
            for c, symbol in enumerate(symbols):
                piece = tokenizer.decode([ids[inside[r, c]]])
                assert piece.strip() == symbol, (size, r, c, piece)
                merged += piece.endswith("\n")
    if which == "bundled":
        assert merged == 0
    else:
        # every row but the last ends in a wall, and " #\n" is one token
        assert merged == sum(size - 1 for size in SIZES)


def test_effort_reaches_a_template_that_reads_it(qwen3_tokenizer, think):
    """A template with a ``reasoning_effort`` variable gets the effort; Qwen3's has none and
    renders the same prompt for every effort."""
    import copy

    from goalprobe.agents.chat_format import ThinkTagFormat

    assert think.effort_keyword is None
    assert think.render_prompt(_messages(), "low") == think.render_prompt(_messages(), "high")
    tokenizer = copy.deepcopy(qwen3_tokenizer)
    tokenizer.chat_template = qwen3_tokenizer.chat_template.replace(
        "{{- '<|im_start|>system\\n' + messages[0].content",
        "{{- '<|im_start|>system\\nReasoning: ' + (reasoning_effort or 'none') + '\\n' "
        "+ messages[0].content",
    )
    fmt = ThinkTagFormat.from_tokenizer(tokenizer)
    assert fmt.effort_keyword == "reasoning_effort"
    assert "Reasoning: high\n" in fmt.render_prompt(_messages(), "high")
    assert "Reasoning: low\n" in fmt.render_prompt(_messages(), "low")
