"""The logit lens on the answer (goalprobe.probes.decision_time) with the bundled agent on a real
rollout step: the positions are where the answer's action is predicted and where reasoning
chunks end; at the last block the lens is the model's own distribution."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.activations.capture import make_backend
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.core import Action
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.probes.decision_time import (
    first_stable_top,
    lens_probs,
    step_positions,
)
from readout_fixtures import model_probs


@pytest.fixture(scope="module")
def step(tmp_path_factory, bundled_agent):
    model, tokenizer = bundled_agent
    grids = generate_grid_set(GridSetConfig(sizes=(7,), densities=(0.4,), n_per_cell=2, seed=9))
    out = tmp_path_factory.mktemp("lens") / "trajectories.jsonl"
    config = RolloutConfig(episodes_per_grid=1, horizon_steps=1, max_new_tokens=256, seed=1)
    run_rollouts(grids, LocalBackend(model, tokenizer), config, out, progress=False)
    steps = [s for e in read_trajectories(out) for s in e.steps if s.action is not None]
    assert steps, "the bundled agent answered no step"
    return steps[0]


def test_positions_find_the_answers_action_and_the_reasoning_chunks(step, bundled_agent):
    _, tokenizer = bundled_agent
    pos = step_positions(
        tokenizer, step.prompt_token_ids, step.generated_token_ids, Action[step.action], chunk=8
    )
    assert pos is not None
    ids = [*step.prompt_token_ids, *step.generated_token_ids]
    action = Action[step.action]
    assert ids[pos.action_token] == pos.candidates[int(action)]
    assert tokenizer.decode([ids[pos.action_token]]).strip() == action.name
    assert pos.chunk_fractions[-1] == 1.0 and list(pos.chunk_ends) == sorted(pos.chunk_ends)
    assert max(pos.chunk_ends) < pos.answer
    with pytest.raises(ValueError, match="chunk"):
        step_positions(tokenizer, step.prompt_token_ids, step.generated_token_ids, action, 0)


def test_the_lens_at_the_last_block_is_the_model(step, bundled_agent):
    model, tokenizer = bundled_agent
    pos = step_positions(
        tokenizer, step.prompt_token_ids, step.generated_token_ids, Action[step.action], chunk=8
    )
    ids = [*step.prompt_token_ids, *step.generated_token_ids]
    positions = [*pos.chunk_ends, pos.answer]
    backend = make_backend("hooks", model, tokenizer)
    probs = lens_probs(backend, ids, positions, pos.candidates)
    assert probs.shape == (backend.n_layers, len(positions), 4)
    own = model_probs(model, ids, positions, pos.candidates)
    assert np.abs(probs[-1] - own).max() < 1e-3
    # an earlier block is not the model (the identity is not true by construction)
    assert np.abs(probs[0] - own).max() > 1e-3
    # the agent's answer was sampled, so its action is likely but not certainly the top one
    assert probs[-1, -1, int(Action[step.action])] > 0.25


def test_first_stable_top():
    probs = np.array([[0.9, 0.1, 0, 0], [0.1, 0.9, 0, 0], [0.2, 0.8, 0, 0], [0.1, 0.9, 0, 0]])
    assert first_stable_top(probs, 1) == 1
    assert first_stable_top(probs, 0) is None
    assert first_stable_top(probs[[1, 0, 2, 3]], 1) == 2


def test_lens_on_a_think_tag_step(qwen3_tiny):
    """A Qwen3-format step (tiny random Qwen3, Qwen3's tokenizer and template): the answer's
    action token is found after ``</think>``, chunks end inside the reasoning, and at the last
    block the lens is the model."""
    from goalprobe.agents.chat_format import chat_format_for
    from goalprobe.agents.prompts import build_messages
    from goalprobe.gridworld.core import Variant

    tokenizer, model = qwen3_tiny.tokenizer, qwen3_tiny.model
    fmt = chat_format_for(tokenizer)
    prompt = fmt.encode_prompt(
        build_messages("  0 1 2\n0 # # #\n1 # A #\n2 # G #", variant=Variant.PLAIN, has_key=False)
    )
    reasoning = "A is at (1, 1). G is at (2, 1). Plan: DOWN."
    completion = fmt.render_completion(reasoning, '{"action": "DOWN"}')
    generated = tokenizer(completion, add_special_tokens=False)["input_ids"]
    pos = step_positions(tokenizer, prompt, generated, Action.DOWN, chunk=4, chat_format=fmt)
    assert pos is not None
    ids = [*prompt, *generated]
    assert ids[pos.action_token] == pos.candidates[int(Action.DOWN)]
    assert tokenizer.decode([ids[pos.action_token]]).strip() == "DOWN"
    close = ids.index(tokenizer.convert_tokens_to_ids("</think>"))
    span = fmt.reasoning_span(ids)
    assert pos.chunk_ends[-1] == span.stop - 1 < close < pos.answer
    assert pos.chunk_ends[0] == span.start + 3 and pos.chunk_fractions[-1] == 1.0
    assert step_positions(tokenizer, prompt, generated[:5], Action.DOWN, 4, fmt) is None
    positions = [*pos.chunk_ends, pos.answer]
    backend = make_backend("hooks", model, tokenizer)
    probs = lens_probs(backend, ids, positions, pos.candidates)
    own = model_probs(model, ids, positions, pos.candidates)
    assert np.abs(probs[-1] - own).max() < 1e-3
