"""The bundled agent: a small GPT-OSS (``GptOssForCausalLM``) trained on the grid world.

It ships with the package (``activations/agent/bundled/``: safetensors weights, ``config.json``,
tokenizer files and ``MODEL_CARD.md``), loads offline on a CPU in about a second, and lets the
whole pipeline run without GPT-OSS-20B. ``scripts/train_default_agent.py`` reproduces it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

BUNDLED_AGENT_DIR = Path(__file__).resolve().parent / "bundled"
"""Directory of the bundled agent's files."""


def bundled_weights_digest(directory: str | Path = BUNDLED_AGENT_DIR) -> str:
    """16 hex digits of sha256 over the agent's ``*.safetensors`` (names and bytes, sorted).

    The one identity of the bundled weights: recorded as the model revision of trajectory files
    and activation stores, and part of the demo's stage cache keys.
    """
    digest = hashlib.sha256()
    for path in sorted(Path(directory).glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def load_bundled_agent(device: str = "cpu", directory: str | Path = BUNDLED_AGENT_DIR):
    """Load the bundled agent from local files (never the network).

    Args:
        device: where to put the model.
        directory: the agent directory (default: the packaged one).

    Returns:
        ``(model, tokenizer)``: a ``GptOssForCausalLM`` in eval mode and its
        ``PreTrainedTokenizerFast``.
    """
    from transformers import GptOssForCausalLM

    from activations.agent.tokenizer import load_tokenizer

    directory = Path(directory)
    if not (directory / "config.json").is_file() or not any(directory.glob("*.safetensors")):
        raise FileNotFoundError(
            f"{directory} holds no bundled agent (config.json + *.safetensors); "
            "train one with `python scripts/train_default_agent.py`"
        )
    tokenizer = load_tokenizer(directory)
    model = GptOssForCausalLM.from_pretrained(str(directory), local_files_only=True)
    return model.to(device).eval(), tokenizer
