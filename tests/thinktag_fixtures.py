"""Qwen3's and Llama 3's real tokenizers and a tiny random Qwen3, built once per session offline.

``scripts/thinktag_tokenizers.py`` converts the vocabularies the ``quicktok-v1`` package ships
(Qwen3: ``<think>`` = 151,667 and ``</think>`` = 151,668; Llama 3) into fast tokenizers and saves a
tiny random ``Qwen3ForCausalLM`` beside Qwen3's: a model directory every goalprobe command
accepts (``--model DIR``). Nothing here touches the network.

Chat templates (``tests/data/*.jinja``, pinned by sha256 in :data:`TEMPLATES`) are goalprobe's
own short templates in each model family's layout, not the published ones:

* ``chatml_think``: Qwen3's thinking-mode layout (``<|im_start|>assistant\\n`` then the model
  writes ``<think>\\n...\\n</think>\\n\\n`` and the answer). For goalprobe's message shapes
  (system, user, assistant with ``reasoning_content``; ``enable_thinking``) it renders byte for
  byte what Qwen3's published template renders (:data:`QWEN3_PUBLISHED_SHA256`; checked when the
  session was written, and by the test that takes a published template from
  ``GOALPROBE_QWEN3_TEMPLATE`` where one is provided);
* ``chatml_prefill``: the generation prompt prefills ``<think>\\n`` (as the DeepSeek-R1 distills);
* ``chatml_plain`` and ``llama3_plain``: no reasoning delimiters (an error case).
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from shared_build import built_once

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "thinktag_tokenizers.py"
TEMPLATE_DIR = Path(__file__).resolve().parent / "data"

TEMPLATES: dict[str, str] = {
    "chatml_think": "22aa5bc5a48de79104335a4ef9f09036c721b55e79c2e66229f45ceec849df47",
    "chatml_prefill": "4cebe84e65043f448046b954d07d72e3b41283b167490d6f305afcf11f4d602d",
    "chatml_plain": "bff4279aae49f7c62b73f918b61006540f39eb080fb25ae3525d1eaeae01d423",
    "llama3_plain": "f327306e66e3cd48f55e421d82a51b228ad54a000ae29cae43b0de39a48e433f",
}
"""sha256 of each test template's text."""

QWEN3_PUBLISHED_SHA256 = "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8"
"""sha256 of Qwen3's published chat template (``Qwen/Qwen3-*`` ``tokenizer_config.json``, as
``trl/chat_templates/qwen3.jinja`` holds it at commit a22ae88)."""


def template(name: str) -> str:
    """The test template ``name`` (its sha256 checked)."""
    text = (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != TEMPLATES[name]:
        raise ValueError(f"template {name} has sha256 {digest}, expected {TEMPLATES[name]}")
    return text


def thinktag_script():
    """``scripts/thinktag_tokenizers.py`` as a module."""
    spec = importlib.util.spec_from_file_location("thinktag_tokenizers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Qwen3Tiny:
    """The built model directory and the tokenizer and model saved in it."""

    directory: Path
    tokenizer: Any
    model: Any


@pytest.fixture(scope="session")
def qwen3_tiny(tmp_path_factory) -> Qwen3Tiny:
    """Qwen3's tokenizer (template ``chatml_think``) + a tiny random Qwen3 in a directory."""
    script = thinktag_script()

    def build(directory: Path) -> Qwen3Tiny:
        return Qwen3Tiny(directory, *script.build_qwen3(directory, template("chatml_think")))

    def load(directory: Path) -> Qwen3Tiny:  # another worker built it: the saved directory
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        return Qwen3Tiny(directory, tokenizer, script.tiny_qwen3(tokenizer))

    return built_once(tmp_path_factory, "qwen3-tiny", build, load)


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_tiny):
    """Qwen3's tokenizer with the ``chatml_think`` template."""
    return qwen3_tiny.tokenizer


def _with_template(qwen3_tiny, tmp_path_factory, name: str) -> Path:
    directory = tmp_path_factory.mktemp(f"qwen3-{name}")
    for path in qwen3_tiny.directory.iterdir():
        if path.is_file():
            shutil.copy(path, directory / path.name)
    tokenizer = qwen3_tiny.tokenizer  # saved with the other template (no second parse)
    kept = tokenizer.chat_template
    tokenizer.chat_template = template(name)
    try:
        tokenizer.save_pretrained(directory)
    finally:
        tokenizer.chat_template = kept
    return directory


@pytest.fixture(scope="session")
def qwen3_prefill_dir(qwen3_tiny, tmp_path_factory) -> Path:
    """The tiny Qwen3 with a template that prefills ``<think>\\n``."""
    return _with_template(qwen3_tiny, tmp_path_factory, "chatml_prefill")


@pytest.fixture(scope="session")
def qwen3_plain_dir(qwen3_tiny, tmp_path_factory) -> Path:
    """The tiny Qwen3 with a template that has no reasoning delimiters."""
    return _with_template(qwen3_tiny, tmp_path_factory, "chatml_plain")


@pytest.fixture(scope="session")
def llama3_tokenizer():
    """Llama 3's tokenizer with the ``llama3_plain`` template (no reasoning delimiters)."""
    return thinktag_script().llama3_tokenizer(template("llama3_plain"))
