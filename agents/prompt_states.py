"""Prompt-only states: the agent's prompt at arbitrary grid states, with no generation.

Pre-reasoning activations depend on the prompt alone, so a probing set needs prompts at many
states, not rollouts. :func:`write_prompt_states` samples states per grid (the start, then
distinct open cells from which the goal is reachable, seeded, with the start's key and door
status), renders each prompt as a rollout step would, and writes a trajectory file in which
every state is a one-step episode without generation (header ``config["prompt_only"]``, step
flag and ``finish_reason`` ``"prompt_only"``, ``end_reason = "prompt_only"``), for
``goalprobe extract --stages pre_reasoning``. Behavioural readers must not score such a file
(:func:`is_prompt_only`).

The agent side of the intention test (:mod:`goalprobe.gridworld.intention`) asks the agent at
given states too: :func:`sample_actions` gives each ``(grid, state)`` ``K`` one-step conversations
exactly as a rollout step would show it, so an intervened start (a held key, an open door) looks
the same as a later state of an ordinary episode. Each sample ``j`` of a state has its own seed
``H(seed, grid_id, agent cell, has_key, door_open, j)`` (passed per conversation when the backend
takes ``seeds=``), so the samples do not depend on batching. There are no retries: an answer that
names no action is the category :data:`~goalprobe.gridworld.intention.INVALID` (so is an answer
cut off by the token limit, however much of it parses:
:func:`goalprobe.agents.parser.parse_completion`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Final

import numpy as np
from goalprobe.agents.backend import Backend, SamplingConfig, generate_seeded
from goalprobe.agents.harmony import Message, ReasoningEffort
from goalprobe.agents.parser import parse_completion
from goalprobe.agents.prompts import PromptTemplate, state_messages
from goalprobe.agents.rollout import RolloutConfig, _Episode, _solved, derive_seed, state_fields
from goalprobe.agents.trajectories import (
    RunHeader,
    StepRecord,
    append_episode,
    open_for_resume,
)
from goalprobe.gridworld.core import Grid, State
from goalprobe.gridworld.dynamics import initial_state
from goalprobe.gridworld.intention import INVALID, Sampler
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render

from goalprobe.version import package_version

PROMPT_ONLY: Final = "prompt_only"
"""The ``finish_reason``, flag and ``end_reason`` of every prompt-only step."""

Encoder = Callable[[Sequence[Message], ReasoningEffort], list[int]]
"""``(messages, reasoning_effort) -> prompt token ids`` (e.g. ``LocalBackend.encode_prompt``)."""


@dataclass(frozen=True)
class PromptStatesConfig:
    """Which states of each grid get a prompt."""

    states_per_grid: int = 8
    """States per grid (the start state, then distinct random cells); fewer when the grid has
    fewer reachable cells."""
    reasoning_effort: ReasoningEffort = "low"
    """Reasoning effort named in the system message (as in the rollouts to compare with)."""
    template_dir: str | None = None
    """Directory of prompt templates; None uses the packaged templates."""
    seed: int = 0
    """Seed of the state draw (each grid derives its own from it and its ``grid_id``)."""

    def __post_init__(self) -> None:
        if self.states_per_grid < 1:
            raise ValueError(f"states_per_grid must be >= 1, got {self.states_per_grid}")
        SamplingConfig(reasoning_effort=self.reasoning_effort)  # validates the effort


@dataclass(frozen=True)
class PromptStatesReport:
    """What one call wrote."""

    out_path: Path
    run_id: str
    grids: int
    states_total: int
    states_skipped: int
    states_written: int


def sample_states(grid: Grid, count: int, seed: int) -> list[State]:
    """The start state, then up to ``count - 1`` distinct other agent cells (drawn uniformly,
    seeded) from which the goal is reachable, with the start's key and door status."""
    start = initial_state(grid)
    policy = solve(grid)
    cells = [
        (r, c)
        for r in range(grid.size)
        for c in range(grid.size)
        if (r, c) not in (start.agent, grid.goal)
        and policy.distance(State((r, c), start.has_key, start.door_open)) < float("inf")
        and not grid.walls[r, c]
    ]
    rng = np.random.default_rng(derive_seed(seed, grid.grid_id, "prompt_states"))
    picks = rng.permutation(len(cells))[: max(count - 1, 0)]
    return [start, *(State(cells[i], start.has_key, start.door_open) for i in sorted(picks))]


def is_prompt_only(header: RunHeader) -> bool:
    """Whether a trajectory file's header marks prompt-only states (no behaviour in it)."""
    return bool(header.config.get(PROMPT_ONLY, False))


def write_prompt_states(
    grids: Iterable[Grid],
    encode: Encoder,
    config: PromptStatesConfig,
    out_path: str | Path,
    *,
    backend_description: dict,
    states: Mapping[str, Sequence[State]] | None = None,
    chat_format: dict | None = None,
) -> PromptStatesReport:
    """Write the prompts of :func:`sample_states` for every grid (resumable: grids whose states
    are already in ``out_path`` from the same run are skipped).

    Args:
        encode: renders and tokenises one conversation as the replaying model will.
        backend_description: JSON facts identifying the tokenizer/model (part of the run id).
        states: explicit states per grid id (e.g. the states a rollout visited) instead of
            :func:`sample_states`; part of the run id. A grid missing from it gets none.
        chat_format: the description of the chat format ``encode`` renders in (recorded in the
            header; part of the run id unless it is harmony, whose files predate it).

    Raises:
        ValueError: an empty or repeated ``grid_id`` or an unsolvable grid.
        TrajectoryFormatError: ``out_path`` belongs to another run or is corrupt.
    """
    out_path = Path(out_path)
    grids = list(grids)
    policies = _solved(grids)
    template = PromptTemplate.from_dir(config.template_dir) if config.template_dir else None
    header_config = {PROMPT_ONLY: True, **asdict(config)}
    if states is not None:
        listed = {g: [[*s.agent, s.has_key, s.door_open] for s in v] for g, v in states.items()}
        digest = hashlib.sha256(json.dumps(listed, sort_keys=True).encode()).hexdigest()
        header_config["explicit_states_sha256"] = digest
    named = [chat_format] if chat_format and chat_format.get("name") != "harmony" else []
    identity = json.dumps([header_config, backend_description, *named], sort_keys=True)
    run_id = "states-" + hashlib.sha256(identity.encode()).hexdigest()[:12]
    header = RunHeader(
        run_id=run_id,
        config=header_config,
        backend=backend_description,
        package_version=package_version(),
        chat_format=chat_format,
    )
    finished = open_for_resume(out_path, header)
    total = written = 0
    one_step = RolloutConfig(horizon_steps=1, seed=config.seed)
    for grid, policy in zip(grids, policies, strict=True):
        chosen = (
            sample_states(grid, config.states_per_grid, config.seed)
            if states is None
            else list(states.get(grid.grid_id, ()))
        )
        for index, state in enumerate(chosen):
            total += 1
            if (grid.grid_id, index) in finished:
                continue
            text = render(grid.prompt_grid, state)
            messages = state_messages(grid, state, template=template)
            episode = _Episode(run_id, grid, policy, index, one_step, template)
            episode.start = episode.state = state
            step = StepRecord(
                run_id=run_id,
                episode=index,
                step=0,
                episode_seed=episode.seed,
                **state_fields(grid, policy, state, text),
                action=None,
                valid=False,
                next_agent_row_col=state.agent,
                prompt_token_ids=[int(i) for i in encode(messages, config.reasoning_effort)],
                generated_token_ids=[],
                token_ids_source="model",
                reasoning=None,
                final=None,
                finish_reason=PROMPT_ONLY,
                parse_error=None,
                parse_form=None,
                attempts=0,
                flags=[PROMPT_ONLY],
            )
            episode.steps.append(step)
            summary = replace(episode.summary(), success=False, end_reason=PROMPT_ONLY)
            append_episode(out_path, [step], summary)
            written += 1
    return PromptStatesReport(out_path, run_id, len(grids), total, total - written, written)


def sample_actions(
    backend: Backend,
    requests: Sequence[tuple[Grid, State]],
    k: int,
    config: RolloutConfig,
    *,
    template: PromptTemplate | None = None,
) -> np.ndarray:
    """``(len(requests), k)`` sampled action categories (0..3 the moves, 4 invalid).

    ``config``: its sampling settings and batch size (episodes, horizon and retries are not
    used); ``template`` None: ``config.template_dir``'s, else the packaged ones.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if template is None and config.template_dir:
        template = PromptTemplate.from_dir(config.template_dir)
    conversations, seeds = [], []
    for grid, state in requests:
        messages = state_messages(  # as a rollout step builds it
            grid, state, template=template, moral_conditioning=config.moral_conditioning
        )
        key = (config.seed, grid.grid_id, state.agent, state.has_key, state.door_open)
        conversations += [messages] * k
        seeds += [derive_seed(*key, j) for j in range(k)]
    out = np.full(len(conversations), INVALID, dtype=np.int64)
    for start in range(0, len(conversations), config.batch_size):
        chunk = slice(start, start + config.batch_size)
        batch_seeds = seeds[chunk]
        call_seed = derive_seed(*batch_seeds) if len(batch_seeds) > 1 else batch_seeds[0]
        completions = generate_seeded(
            backend, conversations[chunk], config.sampling(None), batch_seeds, call_seed
        )
        for offset, completion in enumerate(completions):
            parsed = parse_completion(completion.final, completion.finish_reason)
            if parsed.ok and parsed.action is not None:
                out[start + offset] = int(parsed.action)
    return out.reshape(len(requests), k)


def agent_sampler(
    backend: Backend, k: int, config: RolloutConfig, *, template: PromptTemplate | None = None
) -> Sampler:
    """A :data:`~goalprobe.gridworld.intention.Sampler` that asks ``backend``."""
    return partial(sample_actions, backend, k=k, config=config, template=template)
