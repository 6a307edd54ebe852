"""The oracle engine: an optimal-policy writer that answers in a model's chat format.

A random model never closes its reasoning, so its rollouts carry no behaviour and no
post-reasoning anchor. To run the whole study on a model architecture and tokenizer before a
trained agent of that kind exists (``goalprobe demo --model DIR --backend oracle``: a tiny
random Qwen3 with Qwen3's tokenizer and chat template in CI), the *episodes* are written by this
backend and only the *forward passes* are the model's: extraction, the logit lens and patching
run the model in ``DIR`` over the recorded token ids, exactly as they run a trained agent over
its own.

Each step the oracle reads the grid out of the prompt (:func:`goalprobe.gridworld.text.parse`;
the key status from the default templates' key line, fogged cells taken as open, the study's
free-space assumption), reasons like the bundled agent's training texts
(:func:`goalprobe.agents.reasoning.reasoning_text`: where A and G are, the neighbours, a plan of
up to :data:`~goalprobe.agents.reasoning.PLAN_STEPS` optimal moves) and answers with the plan's
first move. With probability ``epsilon`` it takes a uniformly random move instead (its plan is
then that move), so its behaviour is not trivially perfect and behaviour, patching and scoring
have something to measure. A prompt it cannot read (no grid, no goal in view, no path) gets a
random move and says so. Randomness is seeded per conversation (the backend's seed, the
conversation's seed, its prompt ids): the same run gives the same episodes.

The completion is written in the chat format (:meth:`~goalprobe.agents.chat_format.ChatFormat.render_completion`)
and tokenized with the model's tokenizer; a completion longer than the sampling budget is cut
there (``finish_reason="length"``), as a model's would be.

These episodes are the optimal policy's, not the model's: behaviour and scoring on them say
nothing about the model (the report records the engine: its command line and config name
``backend: oracle``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from goalprobe.agents.backend import ChatFormatBackend, Completion, SamplingConfig, check_seeds
from goalprobe.agents.chat_format import ChatFormat, chat_format_for
from goalprobe.agents.harmony import Message, encode_text
from goalprobe.agents.prompts import PromptTemplate
from goalprobe.agents.reasoning import PLAN_STEPS, final_text, reasoning_text
from goalprobe.gridworld.core import Action, Grid, State
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import GridParseError, parse

DEFAULT_EPSILON = 0.1
"""Probability of a uniformly random move at a step (the demo's oracle)."""

FOG_SYMBOL = "*"
"""A fogged cell in a prompt's grid (:data:`goalprobe.gridworld.fog.HIDDEN_SYMBOL`), read as
open (the free-space planner's assumption)."""

UNREADABLE = "I cannot find a path to G in this grid. Plan: {move}."
"""The reasoning of a step whose prompt the oracle cannot plan on."""


def grid_text_of(content: str) -> str | None:
    """The grid in a user message: the header line (``"  0 1 ..."``) and the ``n`` rows under it
    (None: no grid)."""
    lines = content.split("\n")
    for i, line in enumerate(lines):
        words = line.split()
        if line.startswith("  0 ") and words == [str(c) for c in range(len(words))]:
            return "\n".join(lines[i : i + len(words) + 1])
    return None


class OracleBackend(ChatFormatBackend):
    """Writes each step's reasoning and answer from the optimal policy (module docstring).

    ``chat_format`` None detects it from ``tokenizer``; ``epsilon`` in ``[0, 1]``; ``seed`` is
    combined with each conversation's; ``context_length``: most positions a prompt and its
    completion may take (the model's ``max_position_embeddings`` where known).
    """

    def __init__(
        self,
        tokenizer,
        chat_format: ChatFormat | None = None,
        *,
        epsilon: float = DEFAULT_EPSILON,
        seed: int = 0,
        context_length: int = 1 << 17,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.tokenizer = tokenizer
        self.chat_format = chat_format if chat_format is not None else chat_format_for(tokenizer)
        self.epsilon = float(epsilon)
        self.seed = int(seed)
        self.context_length = int(context_length)
        """Most positions (prompt + completion)."""
        template = PromptTemplate.default()
        self._carrying = template.key_status_carrying
        self._not_carrying = template.key_status_not_carrying

    def describe(self) -> dict[str, Any]:
        """What identifies this engine (the rollouts' run id; the model is added by the
        caller)."""
        return {
            "class": "OracleBackend",
            "epsilon": self.epsilon,
            "seed": self.seed,
            "chat_format": self.chat_format.describe(),
        }

    def generate(
        self,
        batch: Sequence[list[Message]],
        sampling: SamplingConfig,
        seeds: Sequence[int | None] | None = None,
    ) -> list[Completion]:
        """One completion per conversation; row ``i`` seeded by ``seeds[i]`` (None: by
        ``sampling.seed`` and ``i``; fresh randomness when that is None too)."""
        check_seeds(seeds, len(batch))
        out = []
        for i, messages in enumerate(batch):
            prompt = self.encode_prompt(messages, sampling.reasoning_effort)
            row_seed = seeds[i] if seeds is not None else sampling.seed
            if row_seed is None:
                rng = np.random.default_rng()
            else:
                digest = hashlib.sha256(np.asarray(prompt, dtype=np.int64).tobytes()).digest()
                extra = 0 if seeds is not None else i
                rng = np.random.default_rng(
                    [self.seed, int(row_seed) & (2**63 - 1), extra, int.from_bytes(digest[:8])]
                )
            reasoning, answer = self.write(messages, rng)
            out.append(self._written(prompt, reasoning, answer, sampling.max_new_tokens))
        return out

    def write(self, messages: Sequence[Message], rng: np.random.Generator) -> tuple[str, str]:
        """``(reasoning, answer)`` of one step: the optimal plan's first move, or with
        probability ``epsilon`` a uniformly random one."""
        content = next((m.content for m in reversed(messages) if m.role == "user"), "")
        explore = rng.random() < self.epsilon
        random_move = Action(int(rng.integers(len(Action))))
        read = self._read(content)
        if read is None:
            return UNREADABLE.format(move=random_move.name), final_text(random_move)
        grid, state, key_variant = read
        policy = solve(grid)
        if explore or not policy.optimal_actions(state):
            plan = [random_move]
        else:
            _, actions = policy.optimal_trajectory(rng, start=state)
            plan = list(actions[:PLAN_STEPS])
        return reasoning_text(grid, state, plan, key_variant=key_variant), final_text(plan[0])

    def _read(self, content: str) -> tuple[Grid, State, bool] | None:
        """The grid and state a user message shows, and whether it is a key variant (it says
        whether the agent carries the key); None when there is no readable grid or no path."""
        text = grid_text_of(content)
        if text is None:
            return None
        try:
            grid, state = parse(text.replace(FOG_SYMBOL, "_"))
        except GridParseError:
            return None
        carrying = self._carrying in content
        key_variant = carrying or self._not_carrying in content
        if carrying:
            state = dataclasses.replace(state, has_key=True)
        if not np.isfinite(solve(grid).distance(state)):
            return None
        return grid, state, key_variant

    def _written(
        self, prompt: list[int], reasoning: str, answer: str, max_new_tokens: int
    ) -> Completion:
        """The completion of ``prompt`` writing ``reasoning`` and ``answer``, cut at
        ``max_new_tokens`` (then not well formed)."""
        text = self.chat_format.render_completion(reasoning, answer)
        ids = encode_text(self.tokenizer, text)
        if len(ids) <= max_new_tokens:
            return self._completion(prompt, ids, text, "stop")
        ids = ids[:max_new_tokens]
        text = self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return dataclasses.replace(self._completion(prompt, ids, text, "length"), well_formed=False)
