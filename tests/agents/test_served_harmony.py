"""One rendering: the probing set of a server-run harmony agent is rendered as the server
renders it (``agents/served_harmony.py``), against the fake vLLM of ``tests/vllm_fixtures.py``
(its own ``Current date:`` line and channel list, developer messages without the ``# Instructions``
header, older versions' empty developer message), with the real o200k_harmony tokenizer.

Covers: a prompt-only state's ids for a served agent equal, token for token, what the server
renders for that state (prefix and all) and the prompt a rollout step on that server replayed;
the date is the server's, recorded, never the local clock's; the local path has no date line.
"""

from __future__ import annotations

import pytest
from agent_fixtures import SHORT_TEMPLATES
from goalprobe.agents.agent_config import Agent, AgentConfig
from goalprobe.agents.prompt_states import PromptStatesConfig, sample_states, write_prompt_states
from goalprobe.agents.prompts import PromptTemplate, build_messages
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.gridworld.text import render
from vllm_fixtures import CURRENT, OLDER, VllmShape, fake_vllm, render_like_vllm


@pytest.fixture(scope="module")
def grids():
    plain = generate_grid_set(GridSetConfig(sizes=(5,), densities=(0.0, 1.0), n_per_cell=1))
    keys = generate_grid_set(GridSetConfig(sizes=(7,), n_per_cell=1, variant="key_door"))[:1]
    return plain + keys


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("templates")
    for name, text in SHORT_TEMPLATES.items():
        (directory / name).write_text(text + "\n", encoding="utf-8")
    return directory


def _served_agent(gptoss_dir, url) -> Agent:
    return Agent(AgentConfig(model=str(gptoss_dir), backend="server", base_url=url))


def _request(messages) -> list[dict]:
    return [{"role": m.role, "content": m.content} for m in messages]


@pytest.mark.parametrize("shape", [CURRENT, OLDER], ids=["current", "older"])
def test_a_probing_prompt_of_a_served_agent_is_the_servers_prompt(
    gptoss_dir, gptoss_tiny, harmony_encoding, grids, template_dir, tmp_path, shape
):
    template = PromptTemplate.from_dir(template_dir)
    config = PromptStatesConfig(states_per_grid=3, template_dir=str(template_dir))
    with fake_vllm(gptoss_tiny, harmony_encoding, shape) as (url, _):
        encode, rendering = _served_agent(gptoss_dir, url).prompt_encoder()
    assert rendering is not None and rendering["date"] == shape.date
    assert rendering["developer_header"] is False
    write_prompt_states(
        grids, encode, config, tmp_path / "s.jsonl", backend_description={"rendering": rendering}
    )
    steps = [s for e in read_trajectories(tmp_path / "s.jsonl") for s in e.steps]
    assert len(steps) == len(grids) * 3
    by_grid = {g.grid_id: g for g in grids}
    for step in steps:
        grid = by_grid[step.grid_id]
        state = sample_states(grid, 3, 0)[step.episode]
        messages = build_messages(
            render(grid.prompt_grid, state),
            variant=grid.variant,
            has_key=state.has_key,
            template=template,
        )
        served = render_like_vllm(harmony_encoding, _request(messages), "low", shape)
        assert step.prompt_token_ids == served  # token for token, the prefix included
    for effort in ("medium", "high"):  # the effort line follows the request's
        served = render_like_vllm(harmony_encoding, _request(messages), effort, shape)
        assert encode(messages, effort) == served


def test_a_probing_prompt_equals_the_prompt_a_rollout_replayed(
    gptoss_dir, gptoss_tiny, harmony_encoding, grids, template_dir, tmp_path, goalprobe_cli
):
    config = RolloutConfig(
        episodes_per_grid=1, horizon_steps=2, max_new_tokens=64, template_dir=str(template_dir)
    )
    with fake_vllm(gptoss_tiny, harmony_encoding) as (url, _):
        agent = _served_agent(gptoss_dir, url)
        backend, _ = agent.rollout_backend()
        run_rollouts(grids[:2], backend, config, tmp_path / "t.jsonl", progress=False)
        encode, _ = agent.prompt_encoder()  # read off one request to the server
    # the server is down now: the rendering is read off the rollouts' served prompts
    from_file, _ = _served_agent(gptoss_dir, url).prompt_encoder(tmp_path / "t.jsonl")
    template = PromptTemplate.from_dir(template_dir)
    steps = [s for e in read_trajectories(tmp_path / "t.jsonl") for s in e.steps]
    assert steps and all(s.token_ids_source == "model" for s in steps)
    for step in steps:
        messages = build_messages(
            step.grid_text, variant=step.variant, has_key=step.has_key, template=template
        )
        assert encode(messages, "low") == step.prompt_token_ids
        assert from_file(messages, "low") == step.prompt_token_ids
    # `goalprobe states --served-prompts`: the rendering read off the rollouts' file, offline
    write_grid_set(tmp_path / "grids.jsonl", grids[:2])
    args = ["states", tmp_path / "grids.jsonl", "--model", gptoss_dir, "--per-grid", 2]
    args += ["--template-dir", template_dir, "--out"]
    served = goalprobe_cli(*args, tmp_path / "s.jsonl", "--served-prompts", tmp_path / "t.jsonl")
    assert served.exit_code == 0, served.output
    local = goalprobe_cli(*args, tmp_path / "local.jsonl")
    assert local.exit_code == 0, local.output
    first = {(s.grid_id, s.step): s.prompt_token_ids for s in steps if s.step == 0}
    for name, same in (("s.jsonl", True), ("local.jsonl", False)):
        states = [e.steps[0] for e in read_trajectories(tmp_path / name) if e.steps[0].episode == 0]
        assert len(states) == 2  # the start state: the rollouts' first step
        for state in states:
            assert (state.prompt_token_ids == first[(state.grid_id, 0)]) is same
    wrong = goalprobe_cli(*args, tmp_path / "x.jsonl", "--served-prompts", tmp_path / "s.jsonl")
    assert wrong.exit_code == 2 and "holds no served prompt" in wrong.output


def test_the_date_is_the_servers_and_the_local_rendering_reads_no_clock(
    gptoss_dir, gptoss_tiny, harmony_encoding, grids
):
    messages = build_messages(render(grids[0]), variant="plain", has_key=False)
    encoders = {}
    for date in ("2026-11-27", "2027-03-01"):  # a server whose clock moved on a day, or three
        with fake_vllm(gptoss_tiny, harmony_encoding, VllmShape(date=date)) as (url, _):
            encode, rendering = _served_agent(gptoss_dir, url).prompt_encoder()
        assert rendering["date"] == date  # recorded with the prompts (part of the run id)
        text = gptoss_tiny.tokenizer.decode(encode(messages, "low"))
        assert f"Current date: {date}" in text
        encoders[date] = encode(messages, "low")
    assert encoders["2026-11-27"] != encoders["2027-03-01"]
    local, rendering = Agent(AgentConfig(model=str(gptoss_dir))).prompt_encoder()
    assert rendering is None
    assert "Current date" not in gptoss_tiny.tokenizer.decode(local(messages, "low"))


def test_a_pinned_date_is_in_goalprobes_rendering_and_must_be_the_servers(
    gptoss_dir, gptoss_tiny, harmony_encoding, grids
):
    from openai_harmony import (
        Conversation,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
    )

    pinned = "2026-01-15"
    messages = build_messages(render(grids[0]), variant="plain", has_key=False)
    agent = Agent(AgentConfig(model=str(gptoss_dir), conversation_date=pinned))
    local, rendering = agent.prompt_encoder()
    assert rendering == {"rendering": "goalprobe", "date": pinned}
    ids = local(messages, "low")
    assert f"Current date: {pinned}" in gptoss_tiny.tokenizer.decode(ids)
    # token for token openai-harmony's rendering with that date (the model's own system message)
    system = (
        SystemContent.new()
        .with_reasoning_effort(ReasoningEffort.LOW)
        .with_conversation_start_date(pinned)
    )
    developer = DeveloperContent.new().with_instructions(messages[0].content)
    conversation = Conversation.from_messages(
        [
            Message.from_role_and_content(Role.SYSTEM, system),
            Message.from_role_and_content(Role.DEVELOPER, developer),
            Message.from_role_and_content(Role.USER, messages[1].content),
        ]
    )
    assert ids == list(
        harmony_encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)
    )
    # the local rollout engine renders the same ids and its run header records the date
    backend, description = agent.rollout_backend()
    assert backend.encode_prompt(messages, "low") == ids
    assert description["conversation_date"] == pinned
    assert agent.config.identity()["conversation_date"] == pinned

    # a server started with the pinned date: its rendering is adopted, token for token
    with fake_vllm(gptoss_tiny, harmony_encoding, VllmShape(date=pinned)) as (url, _):
        served_agent = Agent(
            AgentConfig(
                model=str(gptoss_dir), backend="server", base_url=url, conversation_date=pinned
            )
        )
        served_agent.check_server()
        encode, served = served_agent.prompt_encoder()
    assert served["date"] == pinned
    served_ids = render_like_vllm(
        harmony_encoding, _request(messages), "low", VllmShape(date=pinned)
    )
    assert encode(messages, "low") == served_ids
    date_line = f"Current date: {pinned}"
    assert date_line in gptoss_tiny.tokenizer.decode(served_ids)

    # a server on another date is refused, before any rollout and for the probing set alike
    with fake_vllm(gptoss_tiny, harmony_encoding, VllmShape(date="2026-11-27")) as (url, _):
        config = AgentConfig(
            model=str(gptoss_dir), backend="server", base_url=url, conversation_date=pinned
        )
        with pytest.raises(ValueError, match=f"VLLM_SYSTEM_START_DATE={pinned}"):
            Agent(config).check_server()
        with pytest.raises(ValueError, match="2026-11-27.*pins conversation_date 2026-01-15"):
            Agent(config).prompt_encoder()
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        AgentConfig(conversation_date="15 Jan 2026")
