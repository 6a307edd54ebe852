"""GPT-OSS's own tokenizer (o200k_harmony) against openai-harmony, and the pipeline on it.

The model directory of ``tests/gptoss_fixtures.py`` holds the real o200k_harmony tokenizer
(built offline, hash checked) and a tiny random ``GptOssForCausalLM``; openai-harmony loads the
same vocabulary offline. Checked: the toolkit's harmony rendering is openai-harmony's token for
token; the fast tokenizer is openai-harmony's encoder on every grid size and on reasoning
texts; both anchors; every grid cell's token under o200k (rows end in ``" #\\n"``, one token);
rollout, extraction and patching with the real tokenizer; the demo and the GPU extraction
script's plan on the model directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from goalprobe.agents.harmony import (
    REASONING_EFFORTS,
    SPECIAL_TOKENS,
    HarmonyTokenIds,
    Message,
    find_anchors,
    reasoning_offsets,
    reasoning_span,
    render_completion,
    render_prompt,
    split_completion,
)
from goalprobe.agents.prompts import KEY_VARIANTS, build_messages
from goalprobe.agents.reasoning import final_text, reasoning_text
from goalprobe.gridworld.core import SYMBOLS, Action, CellType, Variant
from goalprobe.gridworld.generator import STUDY_SIZES, generate_grid
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types, render
from goalprobe.gridworld.variants import generate_variant
from goalprobe.probes.patching.counterfactuals import (
    CounterfactualConfig,
    base_from_grid,
    build_counterfactuals,
)
from goalprobe.probes.patching.sites import (
    ActionTokens,
    build_sequence,
    check_aligned,
    locate_grid_tokens,
    reasoning_ids,
    site_positions,
)

ROOT = Path(__file__).resolve().parents[2]
SIZES = STUDY_SIZES
"""The study's grid sizes, 7 to 15."""
VARIANTS = (Variant.PLAIN, *sorted(KEY_VARIANTS))


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _harmony_messages(oh, messages: list[Message], effort: str) -> list:
    """The same conversation as openai-harmony messages (system content: its defaults)."""
    system = oh.SystemContent.new().with_reasoning_effort(oh.ReasoningEffort(effort.capitalize()))
    out = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
    for m in messages:
        if m.role == "developer":
            content = oh.DeveloperContent.new().with_instructions(m.content)
            out.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, content))
        else:
            message = oh.Message.from_role_and_content(oh.Role(m.role), m.content)
            out.append(message if m.channel is None else message.with_channel(m.channel))
    return out


def _grid_and_state(variant: str, n: int, seed: int):
    grid = generate_variant(variant, n, 0.4, np.random.default_rng(seed))
    return grid, grid.initial_state


def _reasoning(grid, state, variant: str) -> str:
    plan = solve(grid).optimal_actions(state)
    return reasoning_text(
        grid, state, sorted(plan)[:1] or [Action.UP], key_variant=variant != "plain"
    )


# ----------------------------------------------------------------------------- the vocabulary


def test_tokenizer_is_o200k_harmony(gptoss_dir, o200k_tokenizer, harmony_encoding):
    tiktoken_file = gptoss_dir / "tiktoken" / "o200k_base.tiktoken"
    digest = hashlib.sha256(tiktoken_file.read_bytes()).hexdigest()
    assert digest == "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    assert len(o200k_tokenizer) == 201_088
    real_ids = {
        "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
        "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
        "<|message|>": 200008, "<|call|>": 200012, "<|endofprompt|>": 200018,
    }  # fmt: skip
    for name, token_id in real_ids.items():
        assert o200k_tokenizer.convert_tokens_to_ids(name) == token_id
        assert _ids(o200k_tokenizer, name) == [token_id]
    reserved = [i for i in range(199_998, 201_088) if i not in real_ids.values()]
    assert o200k_tokenizer.convert_ids_to_tokens(reserved) == [
        f"<|reserved_{i}|>" for i in reserved
    ]
    # openai-harmony holds the same special ids under the same names, except that it calls
    # 200018 (GPT-OSS's tokenizer.json: <|endofprompt|>, never rendered) <|reserved_200018|>
    for token_id in range(199_998, 201_088):
        assert harmony_encoding.is_special_token(token_id)
        name = o200k_tokenizer.convert_ids_to_tokens(token_id)
        if token_id != 200018:
            assert harmony_encoding.decode_utf8([token_id]) == name
            assert harmony_encoding.encode(name, allowed_special="all") == [token_id]
    assert set(SPECIAL_TOKENS) <= set(real_ids)
    special = HarmonyTokenIds.from_tokenizer(o200k_tokenizer)
    assert set(special.stop_ids) == set(harmony_encoding.stop_tokens_for_assistant_actions())
    assert (special.assistant, special.final, special.analysis) == (
        *harmony_encoding.encode("assistant"),
        tuple(harmony_encoding.encode("final")),
        tuple(harmony_encoding.encode("analysis")),
    )


# ----------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("effort", REASONING_EFFORTS)
def test_prompt_rendering_equals_openai_harmony(o200k_tokenizer, harmony_encoding, effort):
    """Every prompt template (plain, key variants with and without the key), token for token."""
    import openai_harmony as oh

    for variant in VARIANTS:
        grid, state = _grid_and_state(variant, 9, seed=1)
        for has_key in (False, True) if variant in KEY_VARIANTS else (False,):
            messages = build_messages(render(grid, state), variant=variant, has_key=has_key)
            conversation = oh.Conversation.from_messages(_harmony_messages(oh, messages, effort))
            reference = harmony_encoding.render_conversation_for_completion(
                conversation, oh.Role.ASSISTANT
            )
            ours = _ids(o200k_tokenizer, render_prompt(messages, effort))
            assert ours == reference, (variant, has_key, effort)
            assert find_anchors(ours, HarmonyTokenIds.from_tokenizer(o200k_tokenizer)).pre_reasoning


@pytest.mark.parametrize("effort", REASONING_EFFORTS)
def test_assistant_messages_equal_openai_harmony(o200k_tokenizer, harmony_encoding, effort):
    """An answered step (analysis then final) and a conversation that continues after it."""
    import openai_harmony as oh

    variant = Variant.KEY_DOOR
    grid, state = _grid_and_state(variant, 11, seed=2)
    messages = build_messages(render(grid, state), variant=variant, has_key=False)
    reasoning, final = _reasoning(grid, state, variant), final_text(Action.LEFT)
    answered = [
        *messages,
        Message("assistant", reasoning, channel="analysis"),
        Message("assistant", final, channel="final"),
    ]
    keep = oh.RenderConversationConfig(auto_drop_analysis=False)
    conversation = oh.Conversation.from_messages(_harmony_messages(oh, answered, effort))
    training = harmony_encoding.render_conversation_for_training(conversation, keep)
    text = render_prompt(messages, effort) + render_completion(reasoning, final)
    assert _ids(o200k_tokenizer, text) == training
    # history: both assistant messages, then the next user turn, rendered for completion
    follow_up = [*answered, Message("user", "Current grid:\n" + render(grid, state))]
    conversation = oh.Conversation.from_messages(_harmony_messages(oh, follow_up, effort))
    reference = harmony_encoding.render_conversation_for_completion(
        conversation, oh.Role.ASSISTANT, keep
    )
    assert _ids(o200k_tokenizer, render_prompt(follow_up, effort)) == reference


# ----------------------------------------------------------------------------- encoding


def test_fast_tokenizer_equals_harmony_encoding(o200k_tokenizer, harmony_encoding):
    """Grids of every size and variant (with prompts around them), reasoning and answers."""
    texts = []
    for n in SIZES:
        for i, variant in enumerate(VARIANTS):
            grid, state = _grid_and_state(variant, n, seed=n * 10 + i)
            texts += [render(grid, state), _reasoning(grid, state, variant)]
    texts += [final_text(a) for a in Action]
    texts += ["Plan: UP UP LEFT.\n\n", "  0 1 2\n0 # # #", "Ünïcödé ✓ 迷路 — 12345 'll"]
    for text in texts:
        ids = harmony_encoding.encode(text, allowed_special=set())
        assert _ids(o200k_tokenizer, text) == ids, text
        assert o200k_tokenizer.decode(ids, skip_special_tokens=False) == text
    # the rows split as the site code assumes: a number, then one token per cell, the last
    # cell's wall merged with the line break
    row = harmony_encoding.encode("3 # _ G _ A #\n", allowed_special=set())
    pieces = [harmony_encoding.decode_utf8([t]) for t in row]
    assert pieces == ["3", " #", " _", " G", " _", " A", " #\n"]


# ----------------------------------------------------------------------------- anchors


def _teacher_forced(harmony_encoding, prompt: list[int], reasoning: str, final: str) -> list[int]:
    """GPT-OSS-20B's completion as it emits it: an analysis message, then
    ``<|start|>assistant<|channel|>final<|message|>{...}<|return|>``."""
    analysis = harmony_encoding.encode(
        f"<|channel|>analysis<|message|>{reasoning}<|end|>", allowed_special="all"
    )
    answer = harmony_encoding.encode(
        f"<|start|>assistant<|channel|>final<|message|>{final}<|return|>", allowed_special="all"
    )
    return [*prompt, *analysis, *answer]


def test_anchors_under_o200k(o200k_tokenizer, harmony_encoding):
    import openai_harmony as oh

    special = HarmonyTokenIds.from_tokenizer(o200k_tokenizer)
    triple = [200007, 200006, harmony_encoding.encode("assistant")[0]]
    for variant in (Variant.PLAIN, Variant.TWO_PATH_KEY):
        grid, state = _grid_and_state(variant, 13, seed=5)
        messages = build_messages(render(grid, state), variant=variant, has_key=False)
        conversation = oh.Conversation.from_messages(_harmony_messages(oh, messages, "low"))
        prompt = harmony_encoding.render_conversation_for_completion(
            conversation, oh.Role.ASSISTANT
        )
        n = len(prompt)
        assert find_anchors(prompt, special).pre_reasoning == (n - 3, n - 2, n - 1)
        assert prompt[-3:] == triple
        reasoning, final = _reasoning(grid, state, variant), final_text(Action.DOWN)
        full = _teacher_forced(harmony_encoding, prompt, reasoning, final)
        parsed = harmony_encoding.parse_messages_from_completion_tokens(full[n:], oh.Role.ASSISTANT)
        assert [(m.channel, m.content[0].text) for m in parsed] == [
            ("analysis", reasoning),
            ("final", final),
        ]
        anchors = find_anchors(full, special)
        assert anchors.pre_reasoning == (n - 3, n - 2, n - 1)
        post = anchors.post_reasoning
        assert [full[p] for p in post] == triple
        assert full[post[2] + 1 : post[2] + 4] == harmony_encoding.encode(
            "<|channel|>final<|message|>", allowed_special="all"
        )
        assert harmony_encoding.decode_utf8(full[n + 3 : post[0]]) == reasoning
        assert tuple(split_completion(full[n:], o200k_tokenizer)) == (reasoning, final, True)


def test_reasoning_span_under_o200k(o200k_tokenizer, harmony_encoding):
    """The reasoning finder (extraction's reasoning rows, the logit lens's chunks) against
    openai-harmony's own parse of GPT-OSS-20B's completion: the span is the analysis message's
    content token for token; a cut-off reasoning, a completion without an analysis message and
    a prompt alone have none."""
    import openai_harmony as oh

    special = HarmonyTokenIds.from_tokenizer(o200k_tokenizer)
    grid, state = _grid_and_state(Variant.PLAIN, 9, seed=2)
    messages = build_messages(render(grid, state), variant=Variant.PLAIN, has_key=False)
    conversation = oh.Conversation.from_messages(_harmony_messages(oh, messages, "low"))
    prompt = harmony_encoding.render_conversation_for_completion(conversation, oh.Role.ASSISTANT)
    reasoning, final = _reasoning(grid, state, Variant.PLAIN), final_text(Action.DOWN)
    full = _teacher_forced(harmony_encoding, prompt, reasoning, final)
    span = reasoning_span(full, special)
    assert span is not None
    content = harmony_encoding.encode(reasoning, allowed_special=set())
    assert full[span.start : span.stop] == content and span.length == len(content) > 10
    assert full[span.stop] == special.end and full[span.start - 1] == special.message
    offsets = reasoning_offsets(span.length, 4)
    assert offsets[0] == 3 and offsets[-1] == span.length - 1
    assert all(b - a == 4 for a, b in zip(offsets[:-2], offsets[1:-1], strict=True))
    assert reasoning_span(full[: span.stop], special) is None  # cut off by the token limit
    assert reasoning_span(prompt, special) is None
    direct = [*prompt, *harmony_encoding.encode(
        f"<|channel|>final<|message|>{final}<|return|>", allowed_special="all"
    )]  # fmt: skip
    assert reasoning_span(direct, special) is None
    empty = _teacher_forced(harmony_encoding, prompt, "", final)
    assert reasoning_span(empty, special).length == 0
    assert reasoning_offsets(0, 4) == ()


# ----------------------------------------------------------------------------- patching sites


def test_every_grid_cell_maps_to_its_token(o200k_tokenizer, harmony_encoding):
    """``locate_grid_tokens`` against an independent walk over harmony's token bytes."""
    special = HarmonyTokenIds.from_tokenizer(o200k_tokenizer)
    for n in SIZES:
        for i, variant in enumerate(VARIANTS):
            grid, state = _grid_and_state(variant, n, seed=100 + n * 10 + i)
            text = render(grid, state)
            messages = build_messages(text, variant=variant, has_key=i % 2 == 0)
            ids = _ids(o200k_tokenizer, render_prompt(messages, "low"))
            located = locate_grid_tokens(ids, o200k_tokenizer, text, special)
            # independent: character offsets of each token of the user message from harmony
            user_start = (
                len(ids)
                - 3
                - len(harmony_encoding.encode(messages[1].content, allowed_special=set()))
            )
            pieces = [harmony_encoding.decode_utf8([t]) for t in ids[user_start : len(ids) - 3]]
            starts = np.cumsum([0] + [len(p) for p in pieces])
            grid_offset = messages[1].content.index(text)
            types = cell_types(grid, state)
            lines = text.split("\n")
            for r in range(n):
                line_offset = grid_offset + sum(len(x) + 1 for x in lines[: r + 1])
                for c in range(n):
                    char = line_offset + len(f"{r} ") + 2 * c
                    token = int(np.searchsorted(starts, char, side="right")) - 1 + user_start
                    assert located.cell_positions[r, c] == token, (variant, n, r, c)
                    piece = o200k_tokenizer.decode([ids[token]])
                    assert piece.strip() == SYMBOLS[CellType(types[r, c])]
            assert len(np.unique(located.cell_positions)) == n * n
            span_text = o200k_tokenizer.decode(ids[located.span[0] : located.span[1]])
            assert text in span_text and len(span_text) <= len(text) + 1


def test_changed_cells_site_finds_exactly_the_moved_cells(o200k_tokenizer):
    special = HarmonyTokenIds.from_tokenizer(o200k_tokenizer)
    actions = ActionTokens.from_tokenizer(o200k_tokenizer)
    assert o200k_tokenizer.decode(actions.prefix_ids) == '{"action": "'
    grids = [
        generate_grid(n, 0.5, np.random.default_rng(n), grid_id=f"o{n}", min_distance=2)
        for n in (7, 11, 15)
    ]
    config = CounterfactualConfig(moves=("agent", "goal"), disjoint_per_move=2, control_per_move=2)
    pairs = build_counterfactuals([base_from_grid(g) for g in grids], config)
    assert len(pairs) >= 6

    def sequence(grid, state):
        messages = build_messages(render(grid, state), variant=grid.variant, has_key=False)
        prompt = _ids(o200k_tokenizer, render_prompt(messages, "low"))
        reasoning = _reasoning(grid, state, grid.variant)
        completion = reasoning_ids(o200k_tokenizer, reasoning, special)
        return build_sequence(
            prompt, completion, tokenizer=o200k_tokenizer, grid_text=render(grid, state),
            special_ids=special, action_tokens=actions,
        )  # fmt: skip

    for pair in pairs:
        base = sequence(pair.base.grid, pair.base.state)
        cf = sequence(pair.cf_grid, pair.cf_state)
        check_aligned(base, cf, pair.changed_cells)
        source, target = site_positions(base, cf, "changed_cells", pair.changed_cells)
        n = base.prompt_length
        differing = np.flatnonzero(base.token_ids[:n] != cf.token_ids[:n])
        assert sorted(source.tolist()) == sorted(target.tolist()) == differing.tolist()
        for side, grid, state in (
            (base, pair.base.grid, pair.base.state),
            (cf, pair.cf_grid, pair.cf_state),
        ):
            types = cell_types(grid, state)
            for r, c in pair.changed_cells:
                piece = o200k_tokenizer.decode(
                    [int(side.token_ids[side.grid.cell_positions[r, c]])]
                )
                assert piece.strip() == SYMBOLS[CellType(types[r, c])]


# ----------------------------------------------------------------------------- the pipeline


def _grids(n_grids: int = 2, size: int = 7):
    return [
        generate_grid(size, 0.5, np.random.default_rng(s), grid_id=f"o200k-{s}", min_distance=2)
        for s in range(n_grids)
    ]


def test_rollout_with_the_random_model_records_truncated_steps(
    gptoss_model, o200k_tokenizer, tmp_path
):
    from goalprobe.agents.local_backend import LocalBackend
    from goalprobe.agents.rollout import RolloutConfig, run_rollouts
    from goalprobe.agents.trajectories import read_trajectories

    backend = LocalBackend(gptoss_model, o200k_tokenizer)
    grids = _grids()
    config = RolloutConfig(
        episodes_per_grid=1, horizon_steps=2, retries=1, batch_size=2, max_new_tokens=3,
        temperature=1.0, top_p=1.0, seed=3,
    )  # fmt: skip
    report = run_rollouts(grids, backend, config, tmp_path / "traj.jsonl", progress=False)
    assert report.episodes_run == len(grids)
    episodes = list(read_trajectories(tmp_path / "traj.jsonl"))
    assert sorted(e.summary.grid_id for e in episodes) == sorted(g.grid_id for g in grids)
    special = HarmonyTokenIds.from_tokenizer(o200k_tokenizer)
    for episode in episodes:
        # every answer is cut at 3 tokens: truncated, not retried, the episode ends there
        assert episode.summary.length == 1 == len(episode.steps)
        assert episode.summary.invalid_steps == 0 and episode.summary.end_reason == "truncated"
        for step in episode.steps:
            assert not step.valid and step.action is None and step.truncated
            assert step.attempts == 1 and len(step.generated_token_ids) == 3
            prompt = step.prompt_token_ids
            messages = build_messages(step.grid_text, variant="plain", has_key=False)
            assert prompt == _ids(o200k_tokenizer, render_prompt(messages, "low"))
            assert find_anchors(prompt, special).pre_reasoning[2] == len(prompt) - 1


@pytest.fixture(scope="module")
def oracle_trajectories(o200k_tokenizer, tmp_path_factory) -> Path:
    """Trajectories of a scripted agent that reasons and answers as GPT-OSS-20B would, in
    o200k token ids (some steps without reasoning or without a valid answer)."""
    from agent_fixtures import OracleBackend
    from goalprobe.agents.rollout import RolloutConfig, run_rollouts

    traj = tmp_path_factory.mktemp("o200k-traj") / "traj.jsonl"
    config = RolloutConfig(episodes_per_grid=1, horizon_steps=2, retries=0, batch_size=4)
    run_rollouts(_grids(), OracleBackend(o200k_tokenizer), config, traj, progress=False)
    return traj


def test_extract_rows_equal_a_plain_forward_hook(
    gptoss_model, o200k_tokenizer, oracle_trajectories, tmp_path
):
    from goalprobe.activations.capture import make_backend
    from goalprobe.activations.extract import ExtractConfig, extract
    from goalprobe.activations.store import ActivationStore
    from goalprobe.agents.trajectories import read_steps

    traj = oracle_trajectories
    steps = list(read_steps(traj))
    layers = (0, 1)
    capture = make_backend("nnsight", gptoss_model, o200k_tokenizer)
    extract_config = ExtractConfig(
        layers=layers, grid_cells=True, batch_size=3, rows_per_part=4, reasoning_every=5
    )
    report = extract(
        traj, tmp_path / "acts.h5", capture, o200k_tokenizer, extract_config, model_id="o200k"
    )
    assert report.rows == len(steps) == 4
    special = HarmonyTokenIds.from_tokenizer(o200k_tokenizer)
    with ActivationStore(tmp_path / "acts.h5") as store:
        pre, post = store.positions("pre_reasoning"), store.positions("post_reasoning")
        has_reasoning = np.asarray([bool(s.reasoning) for s in steps])
        assert np.array_equal(store.present("post_reasoning"), has_reasoning)
        assert has_reasoning.any()
        cells = store.positions("grid_cells")
        labels = store.labels()
        along = store.reasoning_rows()
        assert len(along) > 0 and set(along.row.tolist()) == set(np.flatnonzero(has_reasoning))
        for i, step in enumerate(steps):
            ids = [*step.prompt_token_ids, *step.generated_token_ids]
            anchor = [special.end, special.start, special.assistant]
            assert [ids[p] for p in pre[i]] == anchor
            mine = along.row == i
            if mine.any():  # the reasoning rows read the recorded reasoning's tokens
                first = int(along.positions[mine][0] - along.tokens[mine][0])
                length = int(along.length[mine][0])
                assert o200k_tokenizer.decode(ids[first : first + length]) == step.reasoning
                assert along.tokens[mine].tolist() == list(reasoning_offsets(length, 5))
            hidden = {}
            handles = [
                gptoss_model.model.layers[x].register_forward_hook(
                    lambda m, a, o, x=x, h=hidden: h.__setitem__(
                        x, o[0] if isinstance(o, tuple) else o
                    )
                )
                for x in layers
            ]
            try:
                with torch.inference_mode():
                    gptoss_model.model(torch.tensor([ids]))  # the blocks, no 201,088-way head
            finally:
                for h in handles:
                    h.remove()
            for layer in layers:
                for stage, pos, here in (
                    ("pre_reasoning", pre, True),
                    ("post_reasoning", post, has_reasoning[i]),
                ):
                    if here:
                        want = hidden[layer][0, pos[i]].numpy().astype(np.float16)
                        got = store.read(stage, layer, [i])[0]
                        np.testing.assert_allclose(
                            got.astype(np.float32), want.astype(np.float32), atol=2e-3, rtol=2e-3
                        )
                if mine.any():
                    got = store.read_reasoning(layer, along.index[mine]).astype(np.float32)
                    want = hidden[layer][0, along.positions[mine]].float().numpy()
                    np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
            kinds = labels["cell_types"][i].reshape(-1)
            for flat, kind in enumerate(kinds):
                if kind != CellType.PADDING:
                    piece = o200k_tokenizer.decode([step.prompt_token_ids[cells[i, flat]]])
                    assert piece.strip() == SYMBOLS[CellType(kind)]


def test_patching_end_to_end(gptoss_model, o200k_tokenizer):
    from goalprobe.activations.capture import make_backend
    from goalprobe.probes.patching.experiment import (
        PatchConfig,
        PatchingContext,
        prepare_pairs,
    )
    from goalprobe.probes.patching.patched_runs import run_patching

    config = CounterfactualConfig(moves=("agent", "goal"), disjoint_per_move=1, control_per_move=0)
    pairs = build_counterfactuals([base_from_grid(g) for g in _grids()], config)[:2]
    sites = ("grid", "changed_cells", "pre_reasoning", "post_reasoning", "answer")
    patch_config = PatchConfig(
        sites=sites, layers=("1",), directions=("base_to_cf",), reasoning="oracle",
        require_optimal=False, max_new_tokens=4, batch_size=8, random_control=False,
    )  # fmt: skip
    backend = make_backend("nnsight", gptoss_model, o200k_tokenizer)
    context = PatchingContext(backend, patch_config)
    items, report = prepare_pairs(pairs, context)
    assert report.n_kept == len(pairs) == 2 and not report.dropped
    records, _ = run_patching(items, context)
    assert len(records) == len(pairs) * len(sites)
    for item in items:
        seq = item.base.sequence
        assert o200k_tokenizer.decode(seq.token_ids[seq.anchors.post_reasoning[2] + 1 :]) == (
            '<|channel|>final<|message|>{"action": "'
        )
    for record in records:
        expected = {"changed_cells": 2, "pre_reasoning": 3, "post_reasoning": 3, "answer": 1}
        if record.site in expected:
            assert record.n_positions == expected[record.site]
        else:
            assert record.n_positions > 7 * 7
        assert (
            np.isclose(sum(record.patched_probs), 1.0)
            and record.patched_action in Action.__members__
        )


def _extraction_script():
    spec = importlib.util.spec_from_file_location(
        "extract_gptoss20b", ROOT / "scripts" / "extract_gptoss20b.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_extraction_script_plans_for_a_local_model_dir(
    gptoss_dir, gptoss_model, oracle_trajectories, tmp_path, capsys
):
    from goalprobe.activations.extract import ExtractConfig
    from goalprobe.activations.plan import replay_lengths

    script = _extraction_script()
    args = [str(oracle_trajectories), "--out", str(tmp_path / "a.h5"), "--dry-run"]
    script.main([*args, "--model", str(gptoss_dir), "--gpu-memory-gb", "80"])
    plan = json.loads(capsys.readouterr().out)
    lengths = replay_lengths(oracle_trajectories, o200k_tok(gptoss_dir), ExtractConfig((0, 1)))
    n_params = sum(p.numel() for p in gptoss_model.parameters())
    assert plan["model"] == str(gptoss_dir) and plan["n_params"] == n_params
    assert plan["layers"] == [0, 1] and plan["d_model"] == 16  # the tiny model's 2 blocks
    assert plan["steps"] == len(lengths) and plan["replayed_tokens_max"] == max(lengths)
    assert plan["weights"].startswith("bf16 (dequantised: ")  # not an MXFP4 checkpoint
    assert plan["weights_gb"] == round(n_params * 2 / 1e9, 1)
    assert plan["batch_size"] == 64 and plan["estimated_peak_gb"] < 1
    assert not (tmp_path / "a.h5").exists()  # a dry run loads and writes nothing
    # GPT-OSS-20B's own plan (no directory: the built-in shape) on the same steps
    script.main([*args, "--tokenizer", str(gptoss_dir), "--gpu-memory-gb", "80"])
    plan = json.loads(capsys.readouterr().out)
    assert plan["layers"] == [7, 15, 23] and plan["n_params"] > 20.8e9
    assert plan["weights_gb"] in (13.8, 41.8)  # MXFP4 where transformers keeps it, else bf16
    with pytest.raises(SystemExit, match="outside the model's 2 blocks"):
        script.main([*args, "--model", str(gptoss_dir), "--gpu-memory-gb", "80", "--layers", "2"])
    with pytest.raises(SystemExit, match="no config.json"):
        script.main([*args, "--model", str(tmp_path), "--gpu-memory-gb", "80"])


def o200k_tok(directory):
    from goalprobe.agents.models import load_tokenizer

    return load_tokenizer(str(directory))


def test_the_plan_sizes_batches_from_the_replayed_lengths(
    gptoss_dir, oracle_trajectories, tmp_path, capsys
):
    """A step cut off deep in its reasoning (10,000 generated tokens, no closed analysis
    message) is replayed only up to its prompt's anchor: it must not make GPT-OSS-20B's plan
    pick batch 1 and warn of 80 GB on an 80 GB card."""
    lines = oracle_trajectories.read_text(encoding="utf-8").splitlines()
    step_line = next(i for i, line in enumerate(lines) if '"kind":"step"' in line)
    step = json.loads(lines[step_line])
    channel = 200005  # <|channel|>, then analysis text that never closes
    step["generated_token_ids"] = [channel, 35644] + [1008] * 9_998
    step["finish_reason"] = "length"
    lines[step_line] = json.dumps(step)
    traj = tmp_path / "cut.jsonl"
    traj.write_text("\n".join(lines) + "\n", encoding="utf-8")
    script = _extraction_script()
    args = [str(traj), "--out", str(tmp_path / "a.h5"), "--dry-run", "--gpu-memory-gb", "80"]
    script.main([*args, "--tokenizer", str(gptoss_dir), "--dequantize"])
    out = capsys.readouterr().out
    plan = json.loads(out)
    assert plan["recorded_tokens_max"] > 10_000 > 1_000 > plan["replayed_tokens_max"]
    assert plan["batch_size"] == 64 and plan["max_batch_tokens"] == 0  # short replays fit
    assert plan["weights_gb"] == 41.8 and plan["estimated_peak_gb"] < 0.85 * 80
    assert "warning" not in out


@pytest.mark.slow
def test_demo_runs_on_the_random_o200k_model(gptoss_dir, o200k_tokenizer, tmp_path):
    """``goalprobe demo --scale tiny --model DIR``: numbers meaningless, pipeline exercised."""
    from goalprobe.agents.models import load_tokenizer
    from typer.testing import CliRunner

    from goalprobe.cli import app

    loaded = load_tokenizer(str(gptoss_dir))  # the saved tokenizer is the built one
    text = render_prompt(build_messages(render(_grids(1)[0]), variant="plain", has_key=False))
    assert _ids(loaded, text) == _ids(o200k_tokenizer, text) and len(loaded) == 201_088
    run_dir = tmp_path / "run"
    args = ["demo", "--scale", "tiny", "--model", str(gptoss_dir), "--run-dir", str(run_dir)]
    # greedy: a random model's flat distribution over 201,088 tokens makes nucleus sampling
    # sort the whole vocabulary per token (minutes); the pipeline is the same
    args += ["--set", "rollouts.temperature=0"]
    result = CliRunner().invoke(app, [*args, "--no-progress"], env={"COLUMNS": "200"})
    # a random model never stops within the budget: the pre-flight refuses the run (and stops
    # the demo: tests/e2e/test_demo_preflight.py)
    assert result.exit_code == 2 and "--allow-truncation" in result.output, result.output
    result = CliRunner().invoke(
        app, [*args, "--allow-truncation", "--no-progress"], env={"COLUMNS": "200"}
    )
    # every step is cut off, so the stages that report behaviour say so and the rest run
    failed = [line for line in result.output.splitlines() if "] failed:" in line]
    # every stage that reads behaviour fails with the truncation message; nothing else does
    assert result.exit_code == 1 and len(failed) == 4, result.output
    assert all("cut off by the token limit" in line for line in failed)
    assert {line.split("]")[0].strip("[ ") for line in failed} == {
        "behaviour",
        "harm",
        "fog",
        "decision",
    }
    assert "Verdicts at 95%" in result.output
    assert (run_dir / "report.html").is_file()
    assert (run_dir / "activations" / "activations.h5").is_file()
