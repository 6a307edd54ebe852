"""The registry of named agents: a name every verb accepts as ``--model``, bound to a model
directory of local files.

A model is named one of three ways (:mod:`goalprobe.agents.models`): a registered name (the
bundled agents, ``bundled`` and ``bundled:map``, register in :mod:`goalprobe.agents.bundled`; a
new agent registers with :func:`register_agent`), a local model directory, or a Hugging Face hub
id (a remote model, downloaded or served). A named agent loads offline from its directory, and its
weights digest is its identity in trajectory files, activation stores and the demo's cache keys
(:func:`goalprobe.agents.models.model_identity`). Imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NamedAgent:
    """One registered agent.

    Attributes:
        name: what ``--model`` (``AgentConfig.model``) calls it.
        directory: its files: ``config.json``, ``*.safetensors`` and the tokenizer files of a
            GPT-OSS model (:func:`goalprobe.agents.bundled.load_bundled_agent` loads it).
        summary: one line on what it is.
        short_reasoning: it reasons in a few dozen tokens, so the demo's small token budgets fit
            it (:func:`goalprobe.agents.budgets.token_budget` keeps them); other agents get at
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
