"""The oracle engine (goalprobe.agents.oracle_backend): the optimal policy writing each step in
the model's chat format (Qwen3's think-tag template with its real tokenizer; harmony with the
bundled tokenizer), a seeded epsilon of random moves, the budget cut as a model's would be."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.agents.agent_config import AgentConfig
from goalprobe.agents.backend import SamplingConfig
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.oracle_backend import UNREADABLE, OracleBackend, grid_text_of
from goalprobe.agents.parser import parse_completion
from goalprobe.agents.prompts import build_messages
from goalprobe.gridworld.core import Action, State, Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render
from goalprobe.gridworld.variants import generate_key_door_family
from scipy.stats import binomtest


@pytest.fixture(scope="module")
def grids():
    return generate_grid_set(GridSetConfig((7, 9), (0.0, 0.5), 10, seed=3))


def _prompts(grids):
    return [build_messages(render(g), variant=Variant(g.variant), has_key=False) for g in grids]


def test_think_tag_steps_are_the_optimal_policy_in_the_format(qwen3_tokenizer, grids):
    fmt = chat_format_for(qwen3_tokenizer)
    oracle = OracleBackend(qwen3_tokenizer, epsilon=0.0)
    assert oracle.chat_format.describe() == fmt.describe()
    batch = _prompts(grids)
    out = oracle.generate(batch, SamplingConfig(max_new_tokens=200, seed=1))
    for grid, messages, c in zip(grids, batch, out, strict=True):
        assert c.prompt_token_ids == fmt.encode_prompt(messages)
        assert (
            c.finish_reason == "stop"
            and c.well_formed
            and c.generated_token_ids[-1] in (fmt.stop_ids)
        )
        # the completion is the format's rendering, and splits back into what was written
        assert c.text == fmt.render_completion(c.reasoning, c.final)
        split = fmt.split_completion(c.generated_token_ids)
        assert (split.reasoning, split.final, split.well_formed) == (c.reasoning, c.final, True)
        action = parse_completion(c.final, c.finish_reason).action
        assert action in solve(grid).optimal_actions(grid.initial_state)
        assert c.reasoning.startswith(f"A is at ({grid.start[0]}, {grid.start[1]}).")
        # the anchors are where the template puts them
        ids = c.prompt_token_ids + c.generated_token_ids
        anchors = fmt.find_anchors(ids)
        assert anchors.post_reasoning is not None and ids[anchors.post_reasoning[1]] == fmt.close_id


def test_epsilon_moves_are_seeded_and_at_the_asked_rate(qwen3_tokenizer, grids):
    batch = _prompts(grids) * 5  # 200 steps
    sampling = SamplingConfig(max_new_tokens=200, seed=0)
    seeds = list(range(len(batch)))
    oracle = OracleBackend(qwen3_tokenizer, epsilon=0.5)
    first = oracle.generate(batch, sampling, seeds=seeds)
    again = OracleBackend(qwen3_tokenizer, epsilon=0.5).generate(batch, sampling, seeds=seeds)
    assert [c.generated_token_ids for c in first] == [c.generated_token_ids for c in again]
    other = oracle.generate(batch, sampling, seeds=[s + 1000 for s in seeds])
    assert [c.final for c in other] != [c.final for c in first]
    optimal = [
        parse_completion(c.final, "stop").action in solve(g).optimal_actions(g.initial_state)
        for g, c in zip(grids * 5, first, strict=True)
    ]
    # a random move is optimal with probability |optimal| / 4, so non-optimal steps happen at
    # a rate between epsilon / 2 and epsilon * 3 / 4 on these grids; epsilon 0 gives none
    misses = len(optimal) - sum(optimal)
    interval = binomtest(misses, len(optimal)).proportion_ci(0.99)
    assert interval.low < 0.375 and interval.high > 0.25 and misses > 0
    exact = OracleBackend(qwen3_tokenizer, epsilon=0.0).generate(batch, sampling, seeds=seeds)
    assert all(
        parse_completion(c.final, "stop").action in solve(g).optimal_actions(g.initial_state)
        for g, c in zip(grids * 5, exact, strict=True)
    )


def test_budget_cut_key_status_fog_and_unreadable_prompts(qwen3_tokenizer, grids):
    oracle = OracleBackend(qwen3_tokenizer, epsilon=0.0)
    (cut,) = oracle.generate(_prompts(grids[:1]), SamplingConfig(max_new_tokens=5, seed=0))
    assert cut.finish_reason == "length" and len(cut.generated_token_ids) == 5
    assert not cut.well_formed and cut.final == ""

    key_grid = generate_key_door_family(7, 0.3, np.random.default_rng(1)).key_door
    state = State(key_grid.start, has_key=True, door_open=False)
    carrying = build_messages(render(key_grid, state), variant=Variant.KEY_DOOR, has_key=True)
    not_carrying = build_messages(render(key_grid), variant=Variant.KEY_DOOR, has_key=False)
    with_key, without = oracle.generate([carrying, not_carrying], SamplingConfig(seed=0))
    assert "I carry the key." in with_key.reasoning
    assert "I do not carry the key." in without.reasoning
    assert parse_completion(with_key.final, "stop").action in solve(key_grid).optimal_actions(state)

    fogged = render(grids[0]).replace("#", "*")  # every wall hidden: read as open
    assert grid_text_of(f"Grid:\n{fogged}\nHistory: none") == fogged
    (step,) = oracle.generate(
        [build_messages(fogged, variant=Variant.PLAIN, has_key=False)], SamplingConfig(seed=0)
    )
    assert (
        step.reasoning.startswith("A is at")
        and parse_completion(step.final, "stop").action is not None
    )
    no_goal = render(grids[0]).replace("G", "_")
    (lost,) = oracle.generate(
        [build_messages(no_goal, variant=Variant.PLAIN, has_key=False)], SamplingConfig(seed=0)
    )
    move = parse_completion(lost.final, "stop").action
    assert lost.reasoning == UNREADABLE.format(move=Action(move).name)


def test_harmony_oracle_and_the_engine_in_an_agent_config(grids):
    from goalprobe.agents.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    oracle = OracleBackend(tokenizer, epsilon=0.0)
    assert oracle.chat_format.name == "harmony"
    (c,) = oracle.generate(_prompts(grids[:1]), SamplingConfig(seed=0))
    assert c.well_formed and c.text.startswith("<|channel|>analysis<|message|>A is at")
    assert oracle.describe()["class"] == "OracleBackend"

    config = AgentConfig(backend="oracle", chat_format="think_tag", oracle_epsilon=0.2)
    identity = config.identity()
    assert identity["backend"] == "oracle" and identity["chat_format"] == "think_tag"
    assert identity["oracle_epsilon"] == 0.2
    assert config.for_generation().local_weights is False  # its episodes load no weights
    with pytest.raises(ValueError, match="oracle_epsilon"):
        AgentConfig(backend="oracle", oracle_epsilon=1.5)
    with pytest.raises(ValueError, match="chat_format"):
        AgentConfig(chat_format="chatml")


def test_the_rate_check_could_fail():
    """The rate assertion above says no to an oracle that never or always explores."""
    for misses in (0, 200):
        interval = binomtest(misses, 200).proportion_ci(0.99)
        assert not (interval.low < 0.375 and interval.high > 0.25 and misses > 0)
    assert np.isclose(binomtest(60, 200).proportion_ci(0.99).low, 0.22, atol=0.02)
