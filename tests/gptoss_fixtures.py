"""GPT-OSS's own tokenizer (o200k_harmony) and a tiny random GPT-OSS, built once per session.

``scripts/gptoss_tokenizer.py`` writes OpenAI's ``o200k_base.tiktoken`` (decoded from the
``quicktok-v1`` package, sha256 checked), converts it to a fast tokenizer with GPT-OSS's special
tokens and saves a tiny random ``GptOssForCausalLM`` beside it: a model directory every
goalprobe command accepts (``--model DIR``). openai-harmony loads the same vocabulary offline
from that directory (``TIKTOKEN_ENCODINGS_BASE``), so its rendering and encoding are the
reference the toolkit's are compared with. Nothing here touches the network.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from shared_build import built_once

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gptoss_tokenizer.py"


def gptoss_script():
    """``scripts/gptoss_tokenizer.py`` as a module (it is not part of the toolkit's packages)."""
    spec = importlib.util.spec_from_file_location("gptoss_tokenizer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class GptOssTiny:
    """The built model directory and the tokenizer and model saved in it."""

    directory: Path
    tokenizer: Any
    model: Any


@pytest.fixture(scope="session")
def gptoss_tiny(tmp_path_factory) -> GptOssTiny:
    """Build once: o200k_harmony ``tokenizer.json`` + a tiny random GPT-OSS in a model
    directory, and ``tiktoken/o200k_base.tiktoken`` for openai-harmony (one build per session,
    ``shared_build.built_once``; the same seeded model in every worker)."""
    script = gptoss_script()

    def build(directory: Path) -> GptOssTiny:
        return GptOssTiny(directory, *script.build(directory))

    def load(directory: Path) -> GptOssTiny:  # another worker built it: the saved directory
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        return GptOssTiny(directory, tokenizer, script.tiny_model(tokenizer))

    return built_once(tmp_path_factory, "gptoss-o200k", build, load)


@pytest.fixture(scope="session")
def gptoss_dir(gptoss_tiny) -> Path:
    """The model directory (what ``--model`` is given)."""
    return gptoss_tiny.directory


@pytest.fixture(scope="session")
def o200k_tokenizer(gptoss_tiny):
    """GPT-OSS's tokenizer (a ``PreTrainedTokenizerFast``)."""
    return gptoss_tiny.tokenizer


@pytest.fixture(scope="session")
def gptoss_model(gptoss_tiny):
    """The tiny random ``GptOssForCausalLM`` (fp32, CPU, eval mode)."""
    return gptoss_tiny.model


@pytest.fixture(scope="session")
def harmony_encoding(gptoss_dir):
    """openai-harmony's ``HARMONY_GPT_OSS`` encoding, loaded offline from the built vocabulary."""
    import openai_harmony

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(gptoss_dir / "tiktoken"))
        return openai_harmony.load_harmony_encoding(
            openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS
        )
