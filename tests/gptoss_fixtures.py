"""GPT-OSS's own tokenizer (o200k_harmony) and a tiny random GPT-OSS, built once per session.

``scripts/gptoss_tokenizer.py`` writes OpenAI's ``o200k_base.tiktoken`` (decoded from the
``quicktok-v1`` package, sha256 checked), converts it to a fast tokenizer with GPT-OSS's special
tokens and saves a tiny random ``GptOssForCausalLM`` beside it: a model directory every
goalprobe command accepts. openai-harmony loads the same vocabulary offline from that directory
(``TIKTOKEN_ENCODINGS_BASE``), so its rendering and encoding are the reference the toolkit's
are compared with. Nothing here touches the network.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gptoss_tokenizer.py"


def gptoss_script():
    """``scripts/gptoss_tokenizer.py`` as a module (it is not part of the toolkit's packages)."""
    spec = importlib.util.spec_from_file_location("gptoss_tokenizer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def gptoss_dir(tmp_path_factory) -> Path:
    """A model directory: o200k_harmony ``tokenizer.json`` + a tiny random GPT-OSS, and
    ``tiktoken/o200k_base.tiktoken`` for openai-harmony."""
    return gptoss_script().build(tmp_path_factory.mktemp("gptoss-o200k"))


@pytest.fixture(scope="session")
def gptoss_loaded(gptoss_dir):
    """The directory loaded the way every goalprobe command loads a model (CPU, fp32)."""
    from activations.agent.models import load_model

    return load_model(str(gptoss_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def o200k_tokenizer(gptoss_loaded):
    """GPT-OSS's tokenizer as transformers loads it from the model directory."""
    return gptoss_loaded.tokenizer


@pytest.fixture(scope="session")
def harmony_encoding(gptoss_dir):
    """openai-harmony's ``HARMONY_GPT_OSS`` encoding, loaded offline from the built vocabulary."""
    import openai_harmony

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(gptoss_dir / "tiktoken"))
        return openai_harmony.load_harmony_encoding(
            openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS
        )
