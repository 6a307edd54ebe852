"""The server path with a think-tag model: a fake vLLM serving the tiny random Qwen3 with Qwen3's
real tokenizer and chat template, answering through vLLM's ``qwen3`` reasoning parser
(``reasoning_content``) and token ids; the ServerBackend records reasoning and answer from the
ids with the chat format, or re-renders the text fields when the server returns no ids."""

from __future__ import annotations

import pytest
from agent_fixtures import SHORT_TEMPLATES
from goalprobe.agents.backend import SamplingConfig
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.prompts import build_messages
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.server_backend import ServerBackend, ServerConfig
from goalprobe.agents.trajectories import read_run_header, read_trajectories
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.text import render
from vllm_fixtures import ThinkTagShape, fake_vllm_thinktag


@pytest.fixture(scope="module")
def grids():
    return generate_grid_set(GridSetConfig(sizes=(5,), densities=(0.0, 0.5), n_per_cell=1))


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("templates")
    for name, text in SHORT_TEMPLATES.items():
        (directory / name).write_text(text + "\n", encoding="utf-8")
    return directory


def _backend(url, tokenizer, **options) -> ServerBackend:
    return ServerBackend(ServerConfig(base_url=url, model="qwen3-tiny", **options), tokenizer)


def test_reasoning_answer_and_ids_from_a_think_tag_server(qwen3_tiny, grids):
    tokenizer = qwen3_tiny.tokenizer
    fmt = chat_format_for(tokenizer)
    messages = build_messages(render(grids[0]), variant=Variant.PLAIN, has_key=False)
    with fake_vllm_thinktag(qwen3_tiny) as (url, log):
        server = _backend(url, tokenizer, request_token_ids=True, require_token_ids=True)
        assert server.chat_format.name == "think_tag"
        completions = server.generate([messages] * 3, SamplingConfig(seed=1), seeds=[1, 2, 3])
        cut = server.generate([messages], SamplingConfig(max_new_tokens=3, seed=4))[0]
    body = log.requests[0]
    # the instructions go as the system message (no developer role in the template), thinking on,
    # no effort (the template reads none)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert "reasoning_effort" not in body
    for completion, prompt in zip(completions, log.prompts, strict=False):
        assert completion.token_ids_source == "model" and completion.finish_reason == "stop"
        assert completion.prompt_token_ids == prompt == fmt.encode_prompt(messages)
        ids = completion.generated_token_ids
        assert ids[0] == fmt.open_id and ids[-1] == tokenizer.eos_token_id
        split = fmt.split_completion(ids)
        assert split.well_formed
        assert (completion.reasoning, completion.final) == (split.reasoning, split.final)
        assert completion.reasoning.split() and completion.final.startswith('{"action": "')
        full = completion.prompt_token_ids + ids
        assert full[fmt.find_anchors(full).post_reasoning[1]] == fmt.close_id
    assert len({c.reasoning for c in completions}) > 1  # seeds reach the server
    # cut off inside the reasoning: no answer, not well formed
    assert cut.finish_reason == "length" and len(cut.generated_token_ids) == 3
    assert cut.final == "" and not cut.well_formed


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_without_ids_the_text_fields_are_re_rendered_in_the_format(qwen3_tiny, grids, field):
    tokenizer = qwen3_tiny.tokenizer
    fmt = chat_format_for(tokenizer)
    messages = build_messages(render(grids[1]), variant=Variant.PLAIN, has_key=False)
    shape = ThinkTagShape(reasoning_field=field, token_ids=False)
    with fake_vllm_thinktag(qwen3_tiny, shape) as (url, log):
        server = _backend(url, tokenizer)
        completion = server.generate([messages], SamplingConfig(seed=5))[0]
    assert completion.token_ids_source == "retokenized" and server.stats.retokenized == 1
    assert completion.prompt_token_ids == log.prompts[0] == fmt.encode_prompt(messages)
    # the parser's delimiter newlines are not part of the reasoning or the answer
    assert completion.reasoning and completion.reasoning == completion.reasoning.strip("\n")
    assert completion.final.startswith('{"action": "') and completion.final.endswith('"}')
    text = tokenizer.decode(completion.generated_token_ids, skip_special_tokens=False)
    assert text == fmt.render_completion(completion.reasoning, completion.final)


def test_rollout_through_a_think_tag_server_records_the_format(
    qwen3_tiny, grids, template_dir, tmp_path
):
    tokenizer = qwen3_tiny.tokenizer
    fmt = chat_format_for(tokenizer)
    out = tmp_path / "t.jsonl"
    config = RolloutConfig(
        episodes_per_grid=2, horizon_steps=2, max_new_tokens=64, template_dir=str(template_dir)
    )
    with fake_vllm_thinktag(qwen3_tiny) as (url, log):
        server = _backend(url, tokenizer, request_token_ids=True, require_token_ids=True)
        report = run_rollouts(grids, server, config, out, progress=False)
    assert report.scheduling == "per_episode" and report.retokenized_steps == 0
    assert read_run_header(out).chat_format == fmt.describe()
    steps = [s for e in read_trajectories(out) for s in e.steps]
    assert len(steps) == report.steps >= 4
    for step in steps:
        assert step.prompt_token_ids in log.prompts and step.valid
        split = fmt.split_completion(step.generated_token_ids)
        assert (step.reasoning, step.final, split.well_formed) == (
            split.reasoning,
            split.final,
            True,
        )
