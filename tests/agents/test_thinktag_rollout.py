"""Rollouts in a think-tag chat format: the local backend on a tiny random Qwen3 (Qwen3's real
tokenizer and chat template), the optimal-policy oracle through Qwen3's format, and extraction of
the oracle's file at the think-tag anchors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from agent_fixtures import SHORT_TEMPLATES, OracleBackend
from goalprobe.activations.store import ActivationStore
from goalprobe.agents.backend import SamplingConfig
from goalprobe.agents.bundled import REASONING_MODEL_BUDGETS, UNSTEERED_BUDGET, token_budget
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.prompts import PromptTemplate, build_messages
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_run_header, read_steps, read_trajectories
from goalprobe.gridworld.core import Action, State, Variant
from goalprobe.gridworld.dynamics import initial_state
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    directory = tmp_path_factory.mktemp("templates")
    for name, text in SHORT_TEMPLATES.items():
        (directory / name).write_text(text)
    return directory


@pytest.fixture(scope="module")
def grids():
    return [
        generate_grid(size, 0.5, np.random.default_rng(i), grid_id=f"plain-n{size}-i{i}")
        for i, size in enumerate((5, 7))
    ]


@pytest.fixture(scope="module")
def qwen3_backend(qwen3_tiny):
    return LocalBackend(qwen3_tiny.model, qwen3_tiny.tokenizer)


def _initial_text(grid) -> str:
    return render(grid, initial_state(grid))


def test_local_backend_renders_stops_and_splits_in_the_think_tag_format(qwen3_backend, grids):
    backend, tokenizer = qwen3_backend, qwen3_backend.tokenizer
    fmt = backend.chat_format
    assert fmt.name == "think_tag" and backend.stop_ids == (tokenizer.eos_token_id,)
    batch = [build_messages(_initial_text(g), variant=Variant.PLAIN, has_key=False) for g in grids]
    completions = backend.generate(batch, SamplingConfig(max_new_tokens=9, seed=3))
    again = backend.generate(batch, SamplingConfig(max_new_tokens=9, seed=3))
    assert [c.generated_token_ids for c in completions] == [c.generated_token_ids for c in again]
    for messages, c in zip(batch, completions, strict=True):
        prompt = tokenizer.decode(c.prompt_token_ids)
        assert c.prompt_token_ids == fmt.encode_prompt(messages)
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(
            "<|im_end|>\n<|im_start|>assistant\n"
        )
        assert "Reasoning:" not in prompt  # the template reads no effort
        assert 1 <= len(c.generated_token_ids) <= 9
        stopped = c.generated_token_ids[-1] in backend.stop_ids
        assert c.finish_reason == ("stop" if stopped else "length")
        assert c.text == tokenizer.decode(c.generated_token_ids, skip_special_tokens=False)
        split = fmt.split_completion(c.generated_token_ids)
        assert (c.reasoning, c.final, c.well_formed) == (
            split.reasoning,
            split.final,
            split.well_formed,
        )
    # the cached shared prefix (the system message) changes nothing: greedy ids equal an
    # uncached greedy generate of the same prompt
    greedy = backend.generate(batch[:1], SamplingConfig(temperature=0, max_new_tokens=6))[0]
    prompt = torch.tensor([greedy.prompt_token_ids])
    assert 0 < backend.shared_prefix_length(greedy.prompt_token_ids) < prompt.shape[1]
    with torch.no_grad():
        ref = backend.model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=list(backend.stop_ids),
            pad_token_id=backend.pad_token_id,
        )
    n = len(greedy.generated_token_ids)
    assert greedy.generated_token_ids == ref[0, prompt.shape[1] :].tolist()[:n]


def test_run_rollouts_on_tiny_qwen3_records_the_format_and_every_token(
    tmp_path, qwen3_backend, grids, templates
):
    backend, tokenizer = qwen3_backend, qwen3_backend.tokenizer
    fmt = backend.chat_format
    out = tmp_path / "qwen3.jsonl"
    config = RolloutConfig(
        episodes_per_grid=2, max_new_tokens=8, batch_size=4, template_dir=str(templates)
    )
    report = run_rollouts(grids, backend, config, out, progress=False)
    assert report.episodes_run == 4
    header = read_run_header(out)
    assert header.chat_format == fmt.describe() and header.chat_format["name"] == "think_tag"
    steps = list(read_steps(out))
    assert steps
    template = PromptTemplate.from_dir(str(templates))
    for step in steps:
        ids = step.prompt_token_ids + step.generated_token_ids
        # the prompt re-renders from the step's own grid, in the format
        messages = build_messages(
            step.grid_text, variant=Variant(step.variant), has_key=step.has_key, template=template
        )
        assert step.prompt_token_ids == fmt.encode_prompt(messages, config.reasoning_effort)
        n = len(step.prompt_token_ids)
        assert fmt.find_anchors(ids).pre_reasoning == (n - 3, n - 2, n - 1)
        split = fmt.split_completion(step.generated_token_ids)
        assert (step.reasoning, step.final) == (split.reasoning, split.final)
        assert 1 <= len(step.generated_token_ids) <= config.max_new_tokens
        if step.finish_reason == "length":  # a random model: cut off at the budget
            assert len(step.generated_token_ids) == config.max_new_tokens
            assert step.action is None and "truncated" in step.flags
        else:
            assert step.generated_token_ids[-1] == tokenizer.eos_token_id
        if fmt.close_id not in step.generated_token_ids:
            assert fmt.find_anchors(ids).post_reasoning is None
            assert fmt.reasoning_span(ids) is None and step.final == ""
    episodes = list(read_trajectories(out))
    assert len(episodes) == 4
    assert sum(e.summary.end_reason == "truncated" for e in episodes) == report.truncated_episodes


def test_oracle_rollout_in_qwen3_format_is_the_optimal_policy_and_extracts(
    tmp_path, qwen3_tiny, grids, goalprobe_cli
):
    tokenizer = qwen3_tiny.tokenizer
    fmt = chat_format_for(tokenizer)
    out = tmp_path / "oracle.jsonl"
    config = RolloutConfig(episodes_per_grid=2, retries=0, batch_size=3)
    run_rollouts(grids, OracleBackend(tokenizer, fmt, variations=False), config, out, False)
    assert read_run_header(out).chat_format == fmt.describe()
    episodes = list(read_trajectories(out))
    assert len(episodes) == 4
    for episode in episodes:
        # the optimal policy reaches the goal along a shortest path
        assert episode.summary.success and episode.summary.end_reason == "goal"
        assert episode.summary.length == episode.summary.shortest_path_length
        grid = next(g for g in grids if g.grid_id == episode.summary.grid_id)
        policy = solve(grid)
        for step in episode.steps:
            state = State(tuple(step.agent_row_col), step.has_key, step.door_open)
            assert step.valid and Action[step.action] in policy.optimal_actions(state)
            split = fmt.split_completion(step.generated_token_ids)
            assert split.well_formed
            assert (split.reasoning, split.final) == (step.reasoning, step.final)
    steps = list(read_steps(out))

    store = tmp_path / "oracle.h5"
    result = goalprobe_cli(
        "extract", out, "--out", store, "--model", qwen3_tiny.directory, "--layers", "0,1",
        "--backend", "hooks", "--device", "cpu", "--max-batch-tokens", "0", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with ActivationStore(store) as s:
        assert s.chat_format == fmt.describe() and len(s) == len(steps)
        pre, post = s.positions("pre_reasoning"), s.positions("post_reasoning")
        for i, step in enumerate(steps):
            ids = step.prompt_token_ids + step.generated_token_ids
            n = len(step.prompt_token_ids)
            assert pre[i].tolist() == [n - 3, n - 2, n - 1]
            assert post[i].tolist() == list(fmt.find_anchors(ids).post_reasoning)
            assert ids[post[i][1]] == fmt.close_id  # </think>, between reasoning and answer
        for stage in ("pre_reasoning", "post_reasoning"):
            assert np.isfinite(s.read(stage, 1, np.arange(len(steps)))).all()


def test_budgets_follow_whether_the_format_renders_the_effort(qwen3_tiny):
    from goalprobe.agents.chat_format import ThinkTagFormat
    from goalprobe.agents.tokenizer import build_tokenizer

    harmony = chat_format_for(build_tokenizer())
    qwen3 = chat_format_for(qwen3_tiny.tokenizer)
    assert qwen3.effort_keyword is None
    model = str(qwen3_tiny.directory)
    for effort in ("low", "medium", "high"):
        # harmony renders the effort: its budgets; Qwen3's template does not: one budget
        assert token_budget(model, effort, 96, harmony) == REASONING_MODEL_BUDGETS[effort]
        assert token_budget(model, effort, 96, qwen3) == UNSTEERED_BUDGET
        assert token_budget("bundled", effort, 96, qwen3) == 96
    # a think-tag template that reads reasoning_effort is steered like harmony
    steered = ThinkTagFormat.from_tokenizer(qwen3_tiny.tokenizer, effort_keyword="reasoning_effort")
    assert token_budget(model, "low", 96, steered) == REASONING_MODEL_BUDGETS["low"]
    assert token_budget(model, "low", 40_000, qwen3) == 40_000  # never lowered


def test_a_template_that_prefills_think_generates_inside_the_reasoning(
    qwen3_tiny, qwen3_prefill_dir, grids
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_prefill_dir), local_files_only=True)
    backend = LocalBackend(qwen3_tiny.model, tokenizer)
    assert backend.chat_format.prefilled
    messages = build_messages(_initial_text(grids[0]), variant=Variant.PLAIN, has_key=False)
    c = backend.generate([messages], SamplingConfig(max_new_tokens=5, seed=2))[0]
    assert tokenizer.decode(c.prompt_token_ids).endswith("<|im_start|>assistant\n<think>\n")
    n = len(c.prompt_token_ids)
    pre = backend.chat_format.find_anchors(c.prompt_token_ids + c.generated_token_ids)
    assert pre.pre_reasoning == (n - 3, n - 2, n - 1)
    # the completion opens inside the reasoning: without </think> all of it is reasoning
    assert backend.chat_format.close_id not in c.generated_token_ids
    assert c.reasoning == c.text.strip("\n") and c.final == ""
