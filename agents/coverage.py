"""Prompt coverage: how much of a prompt the agent's tokenizer can read.

A word-level tokenizer (the bundled agents') maps every piece outside its vocabulary to one
unknown token (``[UNK]``): a grid symbol it lacks (the harm grids' flower bed ``F``) is then the
same input as any other unknown symbol, and an instruction made of unknown words (the moral
conditioning) is noise. A study run on such prompts measures nothing, so every generation path
records the share of unknown tokens in the grid and in the instructions
(:func:`prompt_coverage`, in the trajectory header's ``prompt_coverage``), and the verdicts read
:func:`not_readable` to print ``"n/a: the agent cannot read ..."`` instead of a verdict. A
byte-level tokenizer (GPT-OSS's o200k) has no unknown token and reads everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from goalprobe.agents.backend import ChatFormatBackend
from goalprobe.agents.harmony import Message, ReasoningEffort, render_prompt

MAX_PIECES = 12
"""Distinct unknown pieces listed per part (the count is always complete)."""


def _count(tokenizer: Any, texts: Iterable[str], unk: int | None) -> dict:
    """Tokens, unknown tokens, their share and the distinct unknown pieces over ``texts``."""
    tokens = unknown = 0
    pieces: list[str] = []
    for text in texts:
        if not text:
            continue
        if unk is None:  # nothing can be unknown: count the tokens only
            tokens += len(tokenizer.encode(text, add_special_tokens=False))
            continue
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        tokens += len(ids)
        for token_id, (start, end) in zip(ids, encoded["offset_mapping"], strict=True):
            if token_id == unk:
                unknown += 1
                piece = text[start:end].strip() or text[start:end]
                if piece not in pieces:
                    pieces.append(piece)
    return _part(tokens, unknown, pieces)


def _part(tokens: int, unknown: int, pieces: Iterable[str]) -> dict:
    """One part's record: its counts, the unknown share and the first distinct pieces."""
    share = unknown / tokens if tokens else 0.0
    return {
        "tokens": tokens,
        "unknown": unknown,
        "share": share,
        "pieces": sorted(pieces)[:MAX_PIECES],
    }


def prompt_coverage(tokenizer: Any, prompts: Iterable[tuple[str, str]]) -> dict | None:
    """The share of unknown tokens in the grids and in the instructions of ``prompts``.

    ``tokenizer``: a Hugging Face tokenizer (a fast one when it has an unknown token: offsets
    name the unknown pieces), or None (nothing can be said: None is returned). ``prompts``:
    ``(grid_text, prompt_text)`` each, the instructions being the prompt without its grid text;
    each distinct grid and instruction text is counted once.

    Returns:
        ``{"unk_token_id", "grid": PART, "instructions": PART, "readable", "unreadable"}`` with
        PART ``{tokens, unknown, share, pieces}``; ``readable`` is False where any token of
        either part is unknown, and ``unreadable`` then says what (:func:`not_readable`).
    """
    if tokenizer is None:
        return None
    grids: dict[str, None] = {}
    instructions: dict[str, None] = {}
    for grid_text, prompt_text in prompts:
        grids[grid_text] = None
        instructions[prompt_text.replace(grid_text, "\n", 1) if grid_text else prompt_text] = None
    unk = getattr(tokenizer, "unk_token_id", None)  # None: byte-level BPE, nothing unknown
    unk = None if unk is None else int(unk)
    out: dict[str, Any] = {
        "unk_token_id": unk,
        "grid": _count(tokenizer, grids, unk),
        "instructions": _count(tokenizer, instructions, unk),
    }
    out["readable"] = out["grid"]["unknown"] == 0 and out["instructions"]["unknown"] == 0
    out["unreadable"] = not_readable(out)
    return out


def not_readable(coverage: dict | None) -> str | None:
    """``"n/a: the agent cannot read X"`` for a coverage record with unknown tokens, else None
    (also None for no record: a backend without a tokenizer to ask)."""
    if not coverage:
        return None
    parts = []
    grid, text = coverage["grid"], coverage["instructions"]
    if grid["unknown"]:
        parts.append(
            f"the grid symbol(s) {' '.join(grid['pieces'])} "
            f"({grid['unknown']} of {grid['tokens']} grid tokens unknown)"
        )
    if text["unknown"]:
        parts.append(
            f"{text['unknown']} of {text['tokens']} instruction tokens "
            f"({', '.join(repr(p) for p in text['pieces'])})"
        )
    if not parts:
        return None
    return "n/a: the agent cannot read " + " and ".join(parts)


def merge_coverage(records: Iterable[dict | None]) -> dict | None:
    """One coverage record over several (e.g. a study's conditions): counts summed, pieces
    united; None when every record is None."""
    present = [r for r in records if r]
    if not present:
        return None
    out: dict[str, Any] = {"unk_token_id": present[0]["unk_token_id"]}
    for part in ("grid", "instructions"):
        out[part] = _part(
            sum(r[part]["tokens"] for r in present),
            sum(r[part]["unknown"] for r in present),
            {p for r in present for p in r[part]["pieces"]},
        )
    out["readable"] = all(r["readable"] for r in present)
    out["unreadable"] = not_readable(out)
    return out


def backend_coverage(
    backend: object,
    conversations: Iterable[tuple[str, Sequence[Message]]],
    reasoning_effort: ReasoningEffort,
) -> dict | None:
    """:func:`prompt_coverage` of ``(grid_text, messages)`` conversations as ``backend`` renders
    them (in its own chat format where it renders one, else the harmony rendering) under its
    ``tokenizer``; None for a backend without a tokenizer."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return None
    render = (
        backend.chat_format.render_prompt
        if isinstance(backend, ChatFormatBackend)
        else render_prompt
    )
    prompts = [(grid, render(list(messages), reasoning_effort)) for grid, messages in conversations]
    return prompt_coverage(tokenizer, prompts)
