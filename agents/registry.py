"""The registry of named agents: a name every verb accepts as ``--model``, bound to a model
directory of local files.

A model is named one of three ways (:mod:`goalprobe.agents.models`): a registered name (the
bundled agents, ``bundled`` and ``bundled:map``, register in :mod:`goalprobe.agents.bundled`; a
new agent registers with :func:`register_agent`), a local model directory, or a Hugging Face hub
id (a remote model, downloaded or served). A named agent loads offline from its directory, and its
weights digest is its identity in trajectory files, activation stores and the demo's cache keys
(:func:`goalprobe.agents.models.model_identity`). Imports nothing heavy.

Token budgets fit the model (:func:`token_budget`). The bundled agents reason in a few dozen
tokens, so the demo's presets give them small budgets (96 to 512 new tokens). GPT-OSS reasons for
hundreds to thousands of tokens per step, more at higher effort; a budget that cuts the reasoning
turns steps into truncated ones (:mod:`goalprobe.agents.rollout`), which carry no behaviour. Every
other model therefore gets at least :data:`REASONING_MODEL_BUDGETS` for its reasoning effort; the
pre-flight (:mod:`goalprobe.agents.preflight`) then measures whether that is enough before a long
run starts. The effort reaches the model only through its chat format (:func:`renders_effort`):
harmony's ``Reasoning:`` line, or a think-tag template that reads ``reasoning_effort``. A think-tag
template without it (Qwen3's, the R1 distills') reasons as long as it wants whatever the effort,
so such a model gets :data:`UNSTEERED_BUDGET`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from goalprobe.agents.backend import SamplingConfig


@dataclass(frozen=True)
class NamedAgent:
    """One registered agent.

    Attributes:
        name: what ``--model`` (``AgentConfig.model``) calls it.
        directory: its files: ``config.json``, ``*.safetensors`` and the tokenizer files of a
            GPT-OSS model (:func:`goalprobe.agents.bundled.load_bundled_agent` loads it).
        summary: one line on what it is.
        short_reasoning: it reasons in a few dozen tokens, so the demo's small token budgets fit
            it (:func:`token_budget` keeps them); other agents get at
            least a reasoning model's budget.
    """

    name: str
    directory: Path
    summary: str = ""
    short_reasoning: bool = False


_AGENTS: dict[str, NamedAgent] = {}


def register_agent(
    name: str, directory: str | Path, summary: str = "", *, short_reasoning: bool = False
) -> NamedAgent:
    """Register the agent in ``directory`` under ``name`` and return it; ``ValueError`` for an
    empty name, a name spelled as a path, or one already bound to another directory."""
    if not name.strip() or name != name.strip():
        raise ValueError(f"an agent name must be non-empty without surrounding spaces: {name!r}")
    if name.startswith(("/", ".", "~")) or "\\" in name:
        raise ValueError(f"agent name {name!r} is spelled as a path")
    agent = NamedAgent(name, Path(directory), summary, short_reasoning)
    known = _AGENTS.get(name)
    if known is not None and known.directory.resolve() != agent.directory.resolve():
        raise ValueError(f"agent {name!r} is already registered for {known.directory}")
    _AGENTS[name] = agent
    return agent


def unregister_agent(name: str) -> None:
    """Remove the agent ``name`` (a test's toy agent) from the registry."""
    _AGENTS.pop(name, None)


def named_agent(name: str) -> NamedAgent | None:
    """The registered agent ``name``, or None when ``name`` is a directory or a hub id."""
    import goalprobe.agents.bundled  # noqa: F401  (the bundled agents register on import)

    return _AGENTS.get(name)


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
    briefly (the bundled ones; :attr:`NamedAgent.short_reasoning`),
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
