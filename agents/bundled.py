"""The bundled agents: small GPT-OSS models (``GptOssForCausalLM``) trained on the grid world.

They ship with the package (one directory each under ``agents/``: safetensors
weights, ``config.json``, tokenizer files, ``MODEL_CARD.md``, ``evaluation.json``), load offline
on a CPU in about a second, and let the whole pipeline run without GPT-OSS-20B.
``scripts/train_default_agent.py`` reproduces them.

Every verb that takes a model accepts a bundled agent's name (:data:`BUNDLED_AGENTS`): the plain
``bundled`` is the default agent. They register in the registry of named agents here: a name
every verb accepts as ``--model``, bound to a model directory of local files.

A model is named one of three ways (:mod:`goalprobe.agents.models`): a registered name (the
bundled agents; a new agent registers with :func:`register_agent`), a local model directory, or
a Hugging Face hub id (a remote model, downloaded or served). A named agent loads offline from its directory, and its
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

Their architecture is a small GPT-OSS sized by :class:`BundledModelConfig`; their training (data,
auxiliary losses, the loop, the evaluation behind their cards) is not part of the library: it
lives with the script that runs it, ``scripts/agent_training/``. Benchmarks and tests build
random models of the same shape from :func:`gpt_oss_config`.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

from goalprobe.agents.backend import SamplingConfig


@dataclass(frozen=True)
class NamedAgent:
    """One registered agent.

    Attributes:
        name: what ``--model`` (``AgentConfig.model``) calls it.
        directory: its files: ``config.json``, ``*.safetensors`` and the tokenizer files of a
            GPT-OSS model (:func:`load_bundled_agent` loads it).
        summary: one line on what it is.
        short_reasoning: it reasons in a few dozen tokens, so the demo's small token budgets fit
            it (:func:`token_budget` keeps them); other agents get at least a reasoning model's
            budget.
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
    briefly (the bundled ones; :attr:`NamedAgent.short_reasoning`), else at least
    :data:`REASONING_MODEL_BUDGETS` of ``reasoning_effort``, or :data:`UNSTEERED_BUDGET` when
    ``chat_format`` (None: harmony) renders no effort; ``ValueError`` for an unknown effort or a
    budget below 1.
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


_HERE = Path(__file__).resolve().parent

BUNDLED_AGENTS: dict[str, Path] = {
    "bundled": _HERE / "bundled",
    "bundled:map": _HERE / "bundled_map",
}
"""Bundled agent name -> its directory. ``bundled`` is the default agent (its anchors hold the
agent's position, little else); ``bundled:map`` is the positive control, whose full map is at
the pre-reasoning anchors by construction (its ``MODEL_CARD.md``, docs/map_agent.md)."""

MAP_AGENT = "bundled:map"
"""The name of the positive-control agent."""

DEFAULT_BUNDLED = "bundled"
"""The name of the default bundled agent."""

BUNDLED_AGENT_DIR = BUNDLED_AGENTS[DEFAULT_BUNDLED]
"""Directory of the default bundled agent's files."""


for _name, _summary in (
    (DEFAULT_BUNDLED, "the default agent (its anchors hold its position, little else)"),
    (MAP_AGENT, "the positive control (its full map at the pre-reasoning anchors)"),
):
    register_agent(_name, BUNDLED_AGENTS[_name], _summary, short_reasoning=True)


def is_bundled(name: str) -> bool:
    """Whether ``name`` names a bundled agent (one shipped with the package)."""
    return name in BUNDLED_AGENTS


def bundled_agent_dir(name: str = DEFAULT_BUNDLED) -> Path:
    """The directory of the bundled (or any registered) agent ``name``.

    Raises:
        ValueError: ``name`` is no registered agent.
    """
    agent = named_agent(name)
    if agent is None:
        known = ", ".join(sorted(BUNDLED_AGENTS))
        raise ValueError(f"unknown bundled agent {name!r}; bundled agents are {known}") from None
    return agent.directory


def bundled_weights_digest(directory: str | Path = BUNDLED_AGENT_DIR) -> str:
    """16 hex digits of sha256 over the agent's ``*.safetensors`` (names and bytes, sorted).

    The one identity of bundled weights: recorded as the model revision of trajectory files and
    activation stores, and part of the demo's stage cache keys. ``directory`` may also be a
    bundled agent's name.
    """
    if isinstance(directory, str) and named_agent(directory) is not None:
        directory = bundled_agent_dir(directory)
    digest = hashlib.sha256()
    for path in sorted(Path(directory).glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def load_bundled_agent(device: str = "cpu", directory: str | Path = BUNDLED_AGENT_DIR):
    """Load a bundled agent (``directory``: its directory or name, default ``bundled``) from
    local files, never the network: a ``GptOssForCausalLM`` in eval mode and its tokenizer."""
    from goalprobe.agents.tokenizer import load_tokenizer
    from transformers import GptOssForCausalLM

    if isinstance(directory, str) and named_agent(directory) is not None:
        directory = bundled_agent_dir(directory)
    directory = Path(directory)
    if not (directory / "config.json").is_file() or not any(directory.glob("*.safetensors")):
        raise FileNotFoundError(
            f"{directory} holds no bundled agent (config.json + *.safetensors); "
            "train one with `python scripts/train_default_agent.py`"
        )
    tokenizer = load_tokenizer(directory)
    model = GptOssForCausalLM.from_pretrained(str(directory), local_files_only=True)
    return model.to(device).eval(), tokenizer


SHIPPED_ANCHOR_READING = """This agent reads the grid by attention while it writes its reasoning.
Its pre-reasoning anchors hold the agent's position (decodable) and little else: the goal
rarely, walls no better than the per-cell prior given the grid's size and density; patching them
changes no action, because the reasoning re-reads A and G from the grid. A null result of the
toolkit on this agent is therefore expected, not a failure of the measurement: the positive
control, `bundled:map`, measured by the same commands, shows what the toolkit finds when the
agent, the goal and the local map are at the anchors."""

MAP_ANCHOR_READING = """By construction every completion token of this agent attends to the grid
text with a mass below about 1e-3, so what its reasoning and answer use about the grid passes
through the pre-reasoning anchors (the prompt's other tokens do not depend on the grid). Measured
there: the agent's and the goal's cells (position probes, tables below), which cells one and two steps
from A are walls (its walls phase, docs/map_agent.md; tests/e2e/test_map_agent.py; its reasoning
copies them in a line "The walls by A:"), and an all-block patch of the anchors that moves the action
to the counterfactual's. What it does not show: the walls three or more steps from A. Neither agent's cell probe beats the
per-cell prior given the grid's size and density (the table's class-balanced probe stays below it;
trained without class balancing, both reach it and no more, tests/e2e/test_map_agent.py), so a cell
accuracy above the plain per-cell majority is the size and density, not a map. Nor does it show that
a model trained without such a constraint (GPT-OSS-20B, the default agent) routes its map this way.
It shows what the toolkit's position probes and patches find when the agent, the goal and the local
map are at the anchors, so their null results on other agents can be read."""

ANCHOR_READINGS = {"bundled": SHIPPED_ANCHOR_READING, "bundled:map": MAP_ANCHOR_READING}
"""Bundled agent -> what its anchors do and do not hold (its card; the demo's report)."""


@dataclass(frozen=True)
class BundledModelConfig:
    """Size of the bundled GPT-OSS (turned into a ``GptOssConfig`` by :func:`gpt_oss_config`)."""

    hidden_size: int = 128
    """Residual stream width d_model."""

    num_hidden_layers: int = 4
    """Transformer blocks; sliding-window and full attention alternate as in GPT-OSS."""

    num_attention_heads: int = 4
    """Query heads."""

    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention)."""

    head_dim: int = 32
    """Width of each head."""

    intermediate_size: int = 256
    """Width of each expert's SwiGLU."""

    num_local_experts: int = 4
    """Experts per MoE block."""

    num_experts_per_tok: int = 2
    """Experts each token is routed to."""

    sliding_window: int = 128
    """Window of the sliding-attention layers (GPT-OSS: 128)."""

    max_position_embeddings: int = 2048
    """Longest sequence (a 15 x 15 key prompt + reasoning is about 900 tokens)."""

    rope_theta: float = 10_000.0
    """RoPE base."""


def gpt_oss_config(model_config: BundledModelConfig, tokenizer):
    """A ``transformers.GptOssConfig`` for ``model_config`` and the tokenizer's vocabulary."""
    from transformers import GptOssConfig

    c = model_config
    layer_types = [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(c.num_hidden_layers)
    ]
    sizes = {k: v for k, v in asdict(c).items() if k != "rope_theta"}  # GptOssConfig's names
    return GptOssConfig(
        vocab_size=len(tokenizer),
        **sizes,
        layer_types=layer_types,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")],
        bos_token_id=None,
        tie_word_embeddings=False,
    )
