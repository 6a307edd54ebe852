"""The bundled agents: small GPT-OSS models (``GptOssForCausalLM``) trained on the grid world.

They ship with the package (one directory each under ``agents/``: safetensors
weights, ``config.json``, tokenizer files, ``MODEL_CARD.md``, ``evaluation.json``), load offline
on a CPU in about a second, and let the whole pipeline run without GPT-OSS-20B.
``scripts/train_default_agent.py`` reproduces them.

Every verb that takes a model accepts a bundled agent's name (:data:`BUNDLED_AGENTS`): the plain
``bundled`` is the default agent. They register in the agent registry
(:mod:`goalprobe.agents.registry`), which resolves every name, theirs and any other registered.

Their architecture is a small GPT-OSS sized by :class:`BundledModelConfig`; their training (data,
auxiliary losses, the loop, the evaluation behind their cards) is not part of the library: it
lives with the script that runs it, ``scripts/agent_training/``. Benchmarks and tests build
random models of the same shape from :func:`gpt_oss_config`.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

from goalprobe.agents.registry import named_agent, register_agent

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
