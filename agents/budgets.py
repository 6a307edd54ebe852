"""Token budgets that fit the model: small for the bundled agents, long for reasoning models.

The bundled agents (:mod:`goalprobe.agents.bundled`) reason in a few dozen tokens, so the demo's
presets give them small budgets (96 to 512 new tokens). GPT-OSS reasons for hundreds to
thousands of tokens per step, more at higher effort; a budget that cuts the reasoning turns
steps into truncated ones (:mod:`goalprobe.agents.rollout`), which carry no behaviour. Every
other model therefore gets at least :data:`REASONING_MODEL_BUDGETS` for its reasoning effort
(:func:`token_budget`); the pre-flight (:mod:`goalprobe.agents.preflight`) then measures
whether that is enough before a long run starts.

The effort reaches the model only through its chat format (:func:`renders_effort`): harmony's
``Reasoning:`` line, or a think-tag template that reads ``reasoning_effort``. A think-tag template
without it (Qwen3's, the R1 distills') reasons as long as it wants whatever the effort, so such a
model gets :data:`UNSTEERED_BUDGET`.
"""

from __future__ import annotations

from goalprobe.agents.backend import SamplingConfig
from goalprobe.agents.registry import named_agent

REASONING_MODEL_BUDGETS: dict[str, int] = {"low": 4_096, "medium": 12_288, "high": 32_768}
"""Least new tokens per generation (reasoning + answer) of a model other than the bundled ones,
by harmony reasoning effort: GPT-OSS-20B at low effort reasons for a few hundred to ~2,000
tokens on the study's grids, medium several thousand (8-16k covers it), high far more."""


UNSTEERED_BUDGET = 32_768
"""Least new tokens per generation of a model whose chat format renders no effort (Qwen3's model
card recommends 32,768 output tokens in thinking mode)."""


def renders_effort(chat_format) -> bool:
    """Whether ``chat_format`` (a :class:`~goalprobe.agents.chat_format.ChatFormat`) shows the
    model the reasoning effort: harmony always, a think-tag template when it reads
    ``reasoning_effort``."""
    if chat_format.name == "harmony":
        return True
    return getattr(chat_format, "effort_keyword", None) is not None


def token_budget(model: str, reasoning_effort: str, small: int, chat_format=None) -> int:
    """The new-token budget of one generation: ``small`` for a registered agent that reasons
    briefly (the bundled ones; :attr:`~goalprobe.agents.registry.NamedAgent.short_reasoning`),
    else at least :data:`REASONING_MODEL_BUDGETS` of ``reasoning_effort``, or
    :data:`UNSTEERED_BUDGET` when ``chat_format`` (None: harmony) renders no effort;
    ``ValueError`` for an unknown effort or a budget below 1.
    """
    SamplingConfig(reasoning_effort=reasoning_effort)  # type: ignore[arg-type]  # checks the effort
    if small < 1:
        raise ValueError(f"a token budget must be >= 1, got {small}")
    agent = named_agent(model)
    if agent is not None and agent.short_reasoning:
        return small
    if chat_format is not None and not renders_effort(chat_format):
        return max(small, UNSTEERED_BUDGET)
    return max(small, REASONING_MODEL_BUDGETS[reasoning_effort])
