"""Teacher-forced patching sequences through a think-tag chat format (Qwen3's tokenizer and
template, a tiny random Qwen3): the sequence is the real completion's own ids up to the action
word, the sites lie on the format's anchors, reasoning and grid cells, and the read-out position
predicts the action with the model's own logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.prompts import build_messages
from goalprobe.agents.reasoning import final_text
from goalprobe.gridworld.core import Action, Variant
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.text import render
from goalprobe.probes.patching.sites import (
    ActionTokens,
    SequenceError,
    build_sequence,
    check_aligned,
    site_positions,
)

REASONING = "A is at (1, 1). G is at (5, 5). Plan: DOWN RIGHT."


def _step(fmt, grid_text: str, action: Action = Action.DOWN):
    messages = build_messages(grid_text, variant=Variant.PLAIN, has_key=False)
    prompt = fmt.encode_prompt(messages)
    completion = fmt.render_completion(REASONING, final_text(action))
    generated = fmt.tokenizer(completion, add_special_tokens=False)["input_ids"]
    return prompt, generated


@pytest.fixture(scope="module")
def setup(qwen3_tiny):
    tokenizer = qwen3_tiny.tokenizer
    fmt = chat_format_for(tokenizer)
    grid = generate_grid(7, 0.3, np.random.default_rng(3))
    return tokenizer, fmt, grid, ActionTokens.from_tokenizer(tokenizer)


def test_sequence_is_the_completion_up_to_the_action_word(setup, qwen3_tiny):
    tokenizer, fmt, grid, actions = setup
    grid_text = render(grid)
    prompt, generated = _step(fmt, grid_text)
    seq = build_sequence(
        prompt,
        generated,
        tokenizer=tokenizer,
        grid_text=grid_text,
        action_tokens=actions,
        chat_format=fmt,
    )
    ids = [*prompt, *generated]
    n = len(seq)
    assert seq.token_ids.tolist() == ids[:n] and ids[n] == actions.action_ids[int(Action.DOWN)]
    assert seq.prompt_length == len(prompt)
    pre, post = seq.anchors.pre_reasoning, seq.anchors.post_reasoning
    assert [tokenizer.decode([ids[p]]) for p in pre] == ["<|im_start|>", "assistant", "\n"]
    assert tokenizer.decode([ids[post[1]]]) == "</think>"
    start, stop = seq.reasoning_span
    assert tokenizer.decode(ids[start:stop]) in (REASONING, REASONING + "\n")
    cells = seq.grid.cell_positions
    assert cells.shape == (7, 7) and len(np.unique(cells)) == 49
    rows = grid_text.split("\n")[1:]
    for r, line in enumerate(rows):
        for c, symbol in enumerate(line.split()[1:]):
            assert tokenizer.decode([ids[cells[r, c]]]).strip() == symbol
    assert site_positions(seq, seq, "post_reasoning")[1].tolist() == list(post)
    assert site_positions(seq, seq, "answer")[1].tolist() == [seq.readout_position]
    # the read-out's logits are the model's prediction of the action word
    with torch.inference_mode():
        logits = qwen3_tiny.model(torch.tensor([seq.token_ids.tolist()])).logits[0, -1]
        full = qwen3_tiny.model(torch.tensor([ids])).logits[0, n - 1]
    torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4)


def test_counterfactual_aligns_and_cut_off_reasoning_is_refused(setup):
    tokenizer, fmt, grid, actions = setup
    grid_text = render(grid)
    lines = grid_text.split("\n")
    row = lines[2].split(" ")
    changed = next(c for c in range(1, 6) if row[c + 1] == "_")
    row[changed + 1] = "#"
    cf_text = "\n".join([*lines[:2], " ".join(row), *lines[3:]])
    kwargs = dict(tokenizer=tokenizer, action_tokens=actions, chat_format=fmt)
    base = build_sequence(*_step(fmt, grid_text), grid_text=grid_text, **kwargs)
    cf = build_sequence(*_step(fmt, cf_text), grid_text=cf_text, **kwargs)
    check_aligned(base, cf, [(1, changed)])
    prompt, generated = _step(fmt, grid_text)
    close = generated.index(tokenizer.convert_tokens_to_ids("</think>"))
    with pytest.raises(SequenceError, match="cut off"):
        build_sequence(prompt, generated[:close], grid_text=grid_text, **kwargs)
