"""Build GPT-OSS's own tokenizer (o200k_harmony) and a tiny random GPT-OSS offline.

GPT-OSS-20B reads text through the o200k_harmony tokenizer: OpenAI's o200k BPE vocabulary
(199,998 ranks) plus the harmony special tokens at fixed ids, 201,088 ids in all. Downloading
the real checkpoint (40 GB) just to test tokenisation is not an option in CI, and tiktoken /
openai-harmony fetch the vocabulary from the network on first use. The vocabulary is, however,
shipped as data by the PyPI package ``quicktok-v1`` (0.4.0): ``quicktok/data/o200k.vocab``, a
binary file (little-endian ``u32`` token count, then per token a ``u16`` byte length, the
token's bytes and a ``u32`` rank). This script

1. writes it out in tiktoken's text format (``base64(bytes) rank\\n``, ranks 0..199,997 in
   order) as ``o200k_base.tiktoken`` and checks that the file is byte-identical to OpenAI's
   (sha256 :data:`O200K_BASE_SHA256`); openai-harmony loads it with no network when the
   environment variable ``TIKTOKEN_ENCODINGS_BASE`` names its directory;
2. converts it with transformers' tiktoken converter (needs ``tiktoken``) into a fast
   tokenizer with o200k's pre-tokenisation pattern, GPT-OSS's special tokens at their real ids
   (:data:`SPECIAL_TOKENS`) and ``<|reserved_N|>`` for every other id from 199,998 to 201,087
   (what GPT-OSS's ``tokenizer.json`` holds), and saves it with ``save_pretrained``;
3. saves a tiny random ``GptOssForCausalLM`` (vocabulary 201,088, a few thousand parameters
   per layer) beside it, so the directory is a model directory every goalprobe command accepts
   (``--model DIR``): the pipeline runs end to end on GPT-OSS's real tokenisation.

It is not part of the toolkit (nothing under ``activations/``, ``probes/`` or ``goalprobe/``
imports it); the tests build the directory once per session (``tests/gptoss_fixtures.py``).
Needs the ``test`` extras: ``quicktok-v1==0.4.0``, ``tiktoken``, ``openai-harmony>=0.0.8``.

Usage::

    python scripts/gptoss_tokenizer.py ~/.cache/goalprobe/gptoss-tiny
    TIKTOKEN_ENCODINGS_BASE=~/.cache/goalprobe/gptoss-tiny/tiktoken python -c \\
        "import openai_harmony as h; h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)"
    goalprobe demo --scale tiny --model ~/.cache/goalprobe/gptoss-tiny
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import struct
from importlib import resources
from pathlib import Path

O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""sha256 of OpenAI's ``o200k_base.tiktoken`` (the hash tiktoken itself checks)."""

O200K_RANKS = 199_998
VOCAB_SIZE = 201_088
"""GPT-OSS's vocabulary size (``config.json``: ``vocab_size``)."""

TIKTOKEN_FILE = "o200k_base.tiktoken"
"""The file name openai-harmony looks for under ``TIKTOKEN_ENCODINGS_BASE``."""

O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
"""o200k's pre-tokenisation regex (``tiktoken_ext.openai_public.o200k_base``)."""

SPECIAL_TOKENS: dict[int, str] = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
"""GPT-OSS's named special tokens by id; every other id from 199,998 up is ``<|reserved_N|>``."""

TINY_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=16,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    num_local_experts=2,
    num_experts_per_tok=1,
    sliding_window=16,
    layer_types=["sliding_attention", "full_attention"],
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    tie_word_embeddings=False,
)
"""The tiny random model's ``GptOssConfig`` (GPT-OSS's layout: alternating sliding and full
attention, mixture-of-experts MLP, untied embeddings), small enough for a CPU test."""


def special_token_names() -> list[str]:
    """Names of ids 199,998..201,087, in id order."""
    return [SPECIAL_TOKENS.get(i, f"<|reserved_{i}|>") for i in range(O200K_RANKS, VOCAB_SIZE)]


def o200k_tiktoken_bytes() -> bytes:
    """``o200k_base.tiktoken`` as bytes, decoded from quicktok's packaged vocabulary.

    Raises:
        ValueError: the packaged file is malformed, or the result is not OpenAI's file.
    """
    data = resources.files("quicktok").joinpath("data/o200k.vocab").read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    if count != O200K_RANKS:
        raise ValueError(f"quicktok's o200k.vocab holds {count} tokens, expected {O200K_RANKS}")
    offset, lines = 4, []
    for expected_rank in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        if rank != expected_rank:
            raise ValueError(f"quicktok's o200k.vocab: token {expected_rank} has rank {rank}")
        lines.append(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
        offset += 2 + length + 4
    if offset != len(data):
        raise ValueError(f"quicktok's o200k.vocab has {len(data) - offset} trailing bytes")
    text = b"".join(lines)
    digest = hashlib.sha256(text).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise ValueError(f"o200k_base.tiktoken has sha256 {digest}, expected {O200K_BASE_SHA256}")
    return text


def write_tiktoken_file(directory: Path) -> Path:
    """Write ``directory/o200k_base.tiktoken`` (hash checked); returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / TIKTOKEN_FILE
    path.write_bytes(o200k_tiktoken_bytes())
    return path


def build_fast_tokenizer(tiktoken_file: Path):
    """GPT-OSS's tokenizer as a ``PreTrainedTokenizerFast`` built from ``tiktoken_file``."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(tiktoken_file), pattern=O200K_PATTERN).converted()
    if backend.get_vocab_size() != O200K_RANKS:
        raise ValueError(f"converted vocabulary has {backend.get_vocab_size()} tokens")
    names = special_token_names()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
    for token_id, name in SPECIAL_TOKENS.items():
        if backend.token_to_id(name) != token_id:
            raise ValueError(f"{name} got id {backend.token_to_id(name)}, expected {token_id}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=131_072,
    )
    if len(tokenizer) != VOCAB_SIZE:
        raise ValueError(f"tokenizer has {len(tokenizer)} ids, expected {VOCAB_SIZE}")
    return tokenizer


def tiny_model(tokenizer, seed: int = 0):
    """A seeded random ``GptOssForCausalLM`` with :data:`TINY_CONFIG` for ``tokenizer``."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        **TINY_CONFIG,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")],
    )
    torch.manual_seed(seed)
    return GptOssForCausalLM(config).eval()


def build(directory: str | Path, *, seed: int = 0):
    """Build the model directory: tokenizer + tiny random model in ``directory``, and
    ``directory/tiktoken/o200k_base.tiktoken`` (point ``TIKTOKEN_ENCODINGS_BASE`` there).

    Returns:
        ``(tokenizer, model)``, the objects just saved (loading them back from ``directory``
        with ``AutoTokenizer`` / ``AutoModelForCausalLM`` gives equal ones).
    """
    directory = Path(directory)
    tiktoken_file = write_tiktoken_file(directory / "tiktoken")
    tokenizer = build_fast_tokenizer(tiktoken_file)
    tokenizer.save_pretrained(directory)
    model = tiny_model(tokenizer, seed)
    model.save_pretrained(directory)
    return tokenizer, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where to write the model directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args()
    build(args.directory, seed=args.seed)
    print(f"{args.directory}: o200k_harmony tokenizer + tiny random GptOssForCausalLM")
    print(f"TIKTOKEN_ENCODINGS_BASE={args.directory / 'tiktoken'}")


if __name__ == "__main__":
    main()
