"""Build Qwen3's and Llama 3's real tokenizers and tiny random models offline.

The PyPI package ``quicktok-v1`` (0.4.0, a test dependency) ships the Qwen3 vocabulary
(``quicktok/data/qwen3.vocab``: 151,643 byte-level BPE ranks; ``qwen3.special``: the 26 added
tokens from id 151,643 on, ``<think>`` = 151,667 and ``</think>`` = 151,668 among them) and the
Llama 3 vocabulary (``llama3.vocab``: 128,000 ranks; ``llama3.special``: 256 special tokens from
128,000). Both files use the layout of ``o200k.vocab`` (:mod:`scripts.gptoss_tokenizer`): a
little-endian ``u32`` count, then per token a ``u16`` byte length, the bytes and a ``u32``
rank; the ``.special`` files hold a ``u32`` count, then per token a ``u32`` id, a ``u16``
length and the name. This script converts them, as the o200k tokenizer is converted, with
transformers' tiktoken converter and each model's pre-tokenisation regex into
``PreTrainedTokenizerFast`` objects (Qwen3 with its NFC normaliser; ``<think>``, ``</think>``
and the tool / FIM tokens are added tokens that are *not* special, as in Qwen3's
``tokenizer_config.json``, so decoding with ``skip_special_tokens`` keeps them), and saves a
tiny random ``Qwen3ForCausalLM`` (vocabulary 151,936, as Qwen3's ``config.json``) beside the
Qwen3 tokenizer: a model directory every goalprobe command accepts (``--model DIR``).

The chat template is not part of the vocabulary: :func:`build_qwen3` takes the template text
to store in the tokenizer (the tests pass a pinned one, ``tests/thinktag_fixtures.py``).

It is not part of the toolkit; the tests build the directories once per session. Needs the
``test`` extras (``quicktok-v1==0.4.0``, ``tiktoken``).

Usage::

    python scripts/thinktag_tokenizers.py qwen3 ~/.cache/goalprobe/qwen3-tiny --template T.jinja
    goalprobe states --model ~/.cache/goalprobe/qwen3-tiny ...
"""

from __future__ import annotations

import argparse
import base64
import struct
import tempfile
from importlib import resources
from pathlib import Path

QWEN3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2/Qwen3's pre-tokenisation regex (single digits)."""

LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Llama 3's pre-tokenisation regex (numbers of up to three digits)."""

QWEN3_RANKS = 151_643
QWEN3_VOCAB_SIZE = 151_936
"""``vocab_size`` of Qwen3's ``config.json`` (the embedding is padded past the tokenizer)."""

QWEN3_NOT_SPECIAL = frozenset(range(151_657, 151_669))
"""Added Qwen3 tokens that are not special (``<tool_call>`` ... ``</think>``)."""

THINK_IDS = {"<think>": 151_667, "</think>": 151_668}
"""Where Qwen3 puts its reasoning delimiters."""

LLAMA3_RANKS = 128_000

QWEN3_TINY_CONFIG = dict(
    vocab_size=QWEN3_VOCAB_SIZE,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
"""The tiny random model's ``Qwen3Config`` (Qwen3's layout: grouped-query attention with q/k
norms, tied embeddings as in the small Qwen3 checkpoints), small enough for a CPU test."""


def _data(name: str) -> bytes:
    return resources.files("quicktok").joinpath(f"data/{name}").read_bytes()


def read_ranks(name: str, expected: int) -> list[bytes]:
    """The byte strings of ``quicktok/data/{name}.vocab`` in rank order (checked)."""
    data = _data(f"{name}.vocab")
    (count,) = struct.unpack_from("<I", data, 0)
    if count != expected:
        raise ValueError(f"quicktok's {name}.vocab holds {count} tokens, expected {expected}")
    offset, tokens = 4, []
    for expected_rank in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        if rank != expected_rank:
            raise ValueError(f"quicktok's {name}.vocab: token {expected_rank} has rank {rank}")
        tokens.append(token)
        offset += 2 + length + 4
    if offset != len(data):
        raise ValueError(f"quicktok's {name}.vocab has {len(data) - offset} trailing bytes")
    return tokens


def read_specials(name: str) -> dict[int, str]:
    """``id -> name`` of ``quicktok/data/{name}.special``."""
    data = _data(f"{name}.special")
    (count,) = struct.unpack_from("<I", data, 0)
    offset, out = 4, {}
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", data, offset)
        out[token_id] = data[offset + 6 : offset + 6 + length].decode("utf-8")
        offset += 6 + length
    if offset != len(data):
        raise ValueError(f"quicktok's {name}.special has {len(data) - offset} trailing bytes")
    return out


def _fast_tokenizer(name: str, ranks: int, pattern: str, *, nfc: bool, not_special=(), **kw):
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tokens = read_ranks(name, ranks)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.tiktoken"
        path.write_bytes(
            b"".join(
                base64.b64encode(t) + b" " + str(r).encode() + b"\n" for r, t in enumerate(tokens)
            )
        )
        backend = TikTokenConverter(vocab_file=str(path), pattern=pattern).converted()
    if backend.get_vocab_size() != ranks:
        raise ValueError(f"converted {name} vocabulary has {backend.get_vocab_size()} tokens")
    if nfc:
        backend.normalizer = normalizers.NFC()
    specials = read_specials(name)
    if sorted(specials) != list(range(ranks, ranks + len(specials))):
        raise ValueError(f"{name}.special ids are not contiguous from {ranks}")
    backend.add_tokens(
        [
            AddedToken(specials[i], special=i not in not_special, normalized=False)
            for i in sorted(specials)
        ]
    )
    for token_id, token in specials.items():
        if backend.token_to_id(token) != token_id:
            raise ValueError(f"{token} got id {backend.token_to_id(token)}, expected {token_id}")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
        **kw,
    )


def qwen3_tokenizer(chat_template: str | None = None):
    """Qwen3's tokenizer (151,669 ids) with ``chat_template`` stored in it."""
    tokenizer = _fast_tokenizer(
        "qwen3",
        QWEN3_RANKS,
        QWEN3_PATTERN,
        nfc=True,
        not_special=QWEN3_NOT_SPECIAL,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131_072,
    )
    for token, token_id in THINK_IDS.items():
        if tokenizer.convert_tokens_to_ids(token) != token_id:
            raise ValueError(f"{token} is not at id {token_id}")
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def llama3_tokenizer(chat_template: str | None = None):
    """Llama 3's tokenizer (128,256 ids) with ``chat_template`` stored in it."""
    tokenizer = _fast_tokenizer(
        "llama3",
        LLAMA3_RANKS,
        LLAMA3_PATTERN,
        nfc=False,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        model_max_length=131_072,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def tiny_qwen3(tokenizer, seed: int = 0):
    """A seeded random ``Qwen3ForCausalLM`` with :data:`QWEN3_TINY_CONFIG`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **QWEN3_TINY_CONFIG,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).eval()


def build_qwen3(directory: str | Path, chat_template: str, *, seed: int = 0):
    """Save Qwen3's tokenizer (with ``chat_template``) and a tiny random Qwen3 in ``directory``.

    Returns:
        ``(tokenizer, model)``, the objects just saved.
    """
    directory = Path(directory)
    tokenizer = qwen3_tokenizer(chat_template)
    tokenizer.save_pretrained(directory)
    model = tiny_qwen3(tokenizer, seed)
    model.save_pretrained(directory)
    return tokenizer, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=("qwen3",), help="which model directory to build")
    parser.add_argument("directory", type=Path, help="where to write the model directory")
    parser.add_argument("--template", type=Path, required=True, help="chat template (.jinja)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args()
    build_qwen3(args.directory, args.template.read_text(encoding="utf-8"), seed=args.seed)
    print(f"{args.directory}: Qwen3 tokenizer + tiny random Qwen3ForCausalLM")


if __name__ == "__main__":
    main()
