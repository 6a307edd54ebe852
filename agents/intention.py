"""Sample an agent's actions at given states: the agent side of the intention test
(:mod:`goalprobe.gridworld.intention`).

Each ``(grid, state)`` gets ``K`` one-step conversations exactly as a rollout step would show it
(:func:`goalprobe.gridworld.text.render` of the state and
:func:`goalprobe.agents.prompts.build_messages` with its key status), so an intervened start
(a held key, an open door) looks the same as a later state of an ordinary episode. Each sample
``j`` of a state has its own seed ``H(seed, grid_id, agent cell, has_key, door_open, j)`` (passed
per conversation when the backend takes ``seeds=``), so the samples do not depend on batching.
There are no retries: an answer that names no action is the category
:data:`~goalprobe.gridworld.intention.INVALID` (so is an answer cut off by the token limit,
however much of it parses: :func:`goalprobe.agents.parser.parse_completion`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from goalprobe.agents.backend import Backend, generate_seeded
from goalprobe.agents.parser import parse_completion
from goalprobe.agents.prompts import PromptTemplate, state_messages
from goalprobe.agents.rollout import RolloutConfig, derive_seed
from goalprobe.gridworld.core import Grid, State
from goalprobe.gridworld.intention import INVALID, Sampler


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
        for j in range(k):
            conversations.append(messages)
            seeds.append(
                derive_seed(
                    config.seed, grid.grid_id, state.agent, state.has_key, state.door_open, j
                )
            )
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

    def sample(requests: Sequence[tuple[Grid, State]]) -> np.ndarray:
        return sample_actions(backend, requests, k, config, template=template)

    return sample
