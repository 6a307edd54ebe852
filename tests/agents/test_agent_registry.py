"""The agent registry (goalprobe.agents.bundled): a name registered for a model directory is an
agent every verb accepts, identified by its weights, loaded offline."""

from __future__ import annotations

import shutil

import pytest
from goalprobe.agents.agent_config import Agent, AgentConfig
from goalprobe.agents.bundled import (
    BUNDLED_AGENTS,
    REASONING_MODEL_BUDGETS,
    bundled_agent_dir,
    bundled_weights_digest,
    named_agent,
    register_agent,
    token_budget,
    unregister_agent,
)
from goalprobe.agents.models import check_model_name, model_identity
from goalprobe.agents.trajectories import read_trajectories


@pytest.fixture()
def toy_agent(tmp_path):
    """A copy of the default agent's files registered as ``toy:copy``."""
    directory = tmp_path / "toy_agent"
    shutil.copytree(bundled_agent_dir("bundled"), directory)
    register_agent("toy:copy", directory, "the default agent's weights, under another name")
    yield directory
    unregister_agent("toy:copy")


def test_the_bundled_agents_are_registered():
    assert all(named_agent(n).directory == d for n, d in BUNDLED_AGENTS.items())
    assert named_agent("openai/gpt-oss-20b") is None  # a hub id is no registered name


def test_a_registered_name_is_an_agent(toy_agent):
    check_model_name("toy:copy")  # a name, not a path that holds no model
    assert bundled_agent_dir("toy:copy") == toy_agent
    identity = model_identity("toy:copy")  # identified by its weights, not its name only
    assert identity["weights_sha256"] == bundled_weights_digest(toy_agent)
    assert identity["weights_sha256"] == bundled_weights_digest("bundled")  # same bytes
    assert token_budget("toy:copy", "low", 96) == REASONING_MODEL_BUDGETS["low"]  # long by default
    loaded = Agent(AgentConfig(model="toy:copy")).loaded()
    assert loaded.model_id == "toy:copy" and loaded.revision == identity["weights_sha256"]


def test_a_verb_runs_a_registered_agent(toy_agent, tmp_path, goalprobe_cli):
    grids, out = tmp_path / "grids.jsonl", tmp_path / "trajectories.jsonl"
    made = goalprobe_cli(
        "grids", "--out", grids, "--sizes", "7", "--densities", "0", "--per-cell", "1"
    )
    assert made.exit_code == 0, made.output
    ran = goalprobe_cli(
        "rollout", grids, "--out", out, "--model", "toy:copy", "--episodes", "1", "--horizon", "2",
        "--max-new-tokens", "96", "--no-progress",
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    episodes = list(read_trajectories(out))
    assert len(episodes) == 1 and episodes[0].steps


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        register_agent("bundled", bundled_agent_dir("bundled:map"))
    with pytest.raises(ValueError, match="spelled as a path"):
        register_agent("./mine", bundled_agent_dir("bundled"))
    known = named_agent("bundled")
    again = register_agent(known.name, known.directory, known.summary, short_reasoning=True)
    assert again == known  # the same declaration again is accepted
