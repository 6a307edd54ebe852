"""The bundled agent's word-level tokenizer (a ``transformers.PreTrainedTokenizerFast``).

Text is split by a regular expression into words, numbers, single punctuation marks and single
whitespace characters, each word, number or mark taking the one space before it along
(``" #"``, ``" 10"``, ``" UP"``); a ``tokenizers`` WordLevel model maps each piece to an id and
the ``Fuse`` decoder concatenates them back, so decoding restores the text exactly. Every piece
is in the vocabulary both with and without its leading space. The harmony
special tokens are special tokens of the tokenizer. Grid cells (``#``, ``_``, ``G``, ``A``,
``K``, ``D``, with or without the separating space) and coordinates 0-20 are one token each.

The vocabulary is every piece of: the harmony system message (all reasoning efforts), the
default prompt templates of every variant, the reasoning and answer texts, the grid symbols and
the numbers 0-20. Anything else encodes to ``[UNK]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from goalprobe.agents.harmony import (
    DEFAULT_SYSTEM,
    REASONING_EFFORTS,
    RETURN,
    SPECIAL_TOKENS,
    render_prompt,
)
from goalprobe.agents.prompts import KEY_VARIANTS, PromptTemplate, build_messages
from goalprobe.agents.reasoning import vocabulary_texts
from goalprobe.gridworld.core import STUDY_CELL_TYPES, SYMBOLS, Variant
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

UNK_TOKEN = "[UNK]"
PAD_TOKEN = "<|endoftext|>"
"""Padding token (GPT-OSS's own pad token)."""

PIECE_PATTERN = r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]|\s"
"""How text is split into pieces before the word-level lookup."""

MAX_COORDINATE = 20
"""Coordinates 0..MAX_COORDINATE are single tokens."""

ROLE_WORDS = ("system", "developer", "user", "assistant", "analysis", "commentary", "final")


def split_pieces(text: str) -> list[str]:
    """The pieces ``text`` splits into (special tokens not treated specially)."""
    return re.findall(PIECE_PATTERN, text)


def vocabulary_corpus(template: PromptTemplate | None = None) -> list[str]:
    """Every text whose pieces enter the vocabulary (see the module docstring)."""
    template = PromptTemplate.default() if template is None else template
    texts: list[str] = [DEFAULT_SYSTEM.render(effort) for effort in REASONING_EFFORTS]
    texts += list(ROLE_WORDS)
    for variant in (Variant.PLAIN, *sorted(KEY_VARIANTS)):
        for has_key in (False, True):
            messages = build_messages("", variant=variant, has_key=has_key, template=template)
            texts.append(render_prompt(messages, "low"))
    texts += vocabulary_texts()
    # the study's symbols only: the harm cell ``F`` came later and the bundled vocabulary is fixed
    symbols = [symbol for cell, symbol in SYMBOLS.items() if cell < STUDY_CELL_TYPES]
    numbers = [str(i) for i in range(MAX_COORDINATE + 1)]
    texts.append(" ".join(symbols + numbers))
    texts.append("".join(symbols + numbers))
    texts.append(" \n\t")
    return texts


def build_tokenizer(
    template: PromptTemplate | None = None, extra_texts: Iterable[str] = ()
) -> PreTrainedTokenizerFast:
    """Build the word-level tokenizer from :func:`vocabulary_corpus` (+ ``extra_texts``).

    Ids: ``[UNK]`` = 0, ``<|endoftext|>`` (pad) = 1, the harmony special tokens next (in
    :data:`goalprobe.agents.harmony.SPECIAL_TOKENS` order), then the pieces sorted.
    ``eos_token`` is ``<|return|>``.
    """
    pieces: set[str] = set()
    for text in [*vocabulary_corpus(template), *extra_texts]:
        for special in SPECIAL_TOKENS:
            text = text.replace(special, "\n")
        for piece in split_pieces(text):
            pieces.add(piece)
            if not piece.isspace():
                bare = piece.lstrip(" ")
                pieces.update((bare, " " + bare))
    specials = [UNK_TOKEN, PAD_TOKEN, *SPECIAL_TOKENS]
    vocab = {token: i for i, token in enumerate(specials)}
    for piece in sorted(pieces - set(specials)):
        vocab[piece] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        eos_token=RETURN,
        additional_special_tokens=list(SPECIAL_TOKENS),
        clean_up_tokenization_spaces=False,
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved with ``save_pretrained`` from a local directory (no network)."""
    directory = Path(path)
    if not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{directory} holds no tokenizer.json")
    return PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)


def unknown_pieces(tokenizer: PreTrainedTokenizerFast, text: str) -> list[str]:
    """Pieces of ``text`` the tokenizer maps to its unknown token (empty when it covers all)."""
    encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    return [
        text[start:end]
        for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True)
        if token_id == tokenizer.unk_token_id
    ]
