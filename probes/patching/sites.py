"""Token positions of the patch sites in a teacher-forced sequence.

A *teacher-forced sequence* is what one patched or unpatched run reads (in harmony)::

    prompt  <|channel|>analysis<|message|>{reasoning}  <|end|><|start|>assistant
    <|channel|>final<|message|>  {"action": "

It ends right before the action word, so the logits at its last position (the *readout*) give the
action distribution with the reasoning held fixed (:class:`ActionTokens`). Sites (:data:`SITES`):
``"grid"``, ``"changed_cells"``, ``"pre_reasoning"`` / ``"post_reasoning"`` (the three anchor
tokens closing the prompt / the reasoning), ``"answer"`` (the readout), ``"all"`` (same-length
sequences) and ``"reasoning_chunk_<i>of<n>"`` (:func:`chunk_site`): the ``i``-th of ``n`` equal
fractions of the reasoning body, aligned by relative position (:func:`chunk_positions`).

Grid cells are located by token character offsets of the decoded user message
(:func:`locate_grid_tokens`); other chat formats (:mod:`goalprobe.agents.chat_format`) build
their sequences through the format, the grid being the last occurrence of its text in the prompt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import cast

import numpy as np
from goalprobe.agents.chat_format import ChatFormat, HarmonyFormat
from goalprobe.agents.harmony import (
    CHANNEL,
    MESSAGE,
    AnchorPositions,
    HarmonyTokenIds,
    find_anchors,
)
from goalprobe.agents.reasoning import final_text
from goalprobe.gridworld.core import Action, RowCol

SITES: tuple[str, ...] = (
    "grid",
    "changed_cells",
    "pre_reasoning",
    "post_reasoning",
    "answer",
    "all",
)
"""Every patch site; see the module docstring."""

DEFAULT_SITES: tuple[str, ...] = SITES[:-1]
"""The sites patched by default (all but ``"all"``)."""

PROMPT_SITES: frozenset[str] = frozenset({"grid", "changed_cells", "pre_reasoning"})
"""Sites inside the prompt: the only ones defined when the reasoning is regenerated."""


class SequenceError(ValueError):
    """A token sequence cannot be used for patching (cut-off reasoning, misaligned pair...)."""


@dataclass(frozen=True)
class ActionTokens:
    """How ``{"action": "<ACTION>"}`` tokenises: the four answers' common ``prefix_ids`` and the
    first differing id of each action (``action_ids``, in ``Action`` order)."""

    prefix_ids: tuple[int, ...]
    action_ids: tuple[int, int, int, int]

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ActionTokens:
        """Derive the prefix and the four action ids; raises when two actions share a token."""
        encoded = [
            [int(i) for i in tokenizer.encode(final_text(a), add_special_tokens=False)]
            for a in Action
        ]
        common = 0
        while all(len(e) > common for e in encoded) and len({e[common] for e in encoded}) == 1:
            common += 1
        if any(len(e) <= common for e in encoded):
            raise ValueError("one action's answer is a prefix of another's; cannot read actions")
        action_ids = cast("tuple[int, int, int, int]", tuple(e[common] for e in encoded))
        unk = getattr(tokenizer, "unk_token_id", None)
        if unk is not None and unk in action_ids:
            raise ValueError("the tokenizer maps an action word to its unknown token")
        if len(set(action_ids)) != len(action_ids):
            raise ValueError(f"action tokens are not distinct: {action_ids}")
        return cls(prefix_ids=tuple(encoded[0][:common]), action_ids=action_ids)


@dataclass(frozen=True)
class GridTokens:
    """Where the grid of the user message lies: ``span`` ``(start, stop)`` token positions of its
    text and ``cell_positions`` ``(n, n)`` int64, the token of every cell ``[row, col]``."""

    span: tuple[int, int]
    cell_positions: np.ndarray


def token_char_spans(token_ids: Sequence[int], tokenizer) -> tuple[str, np.ndarray]:
    """``(text, spans)``: ``token_ids`` decoded token by token and each token's ``[start, stop)``
    character offsets; :class:`SequenceError` when the pieces do not make the decoded text."""
    decode = partial(
        tokenizer.decode, skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    pieces = [decode([int(i)]) for i in token_ids]
    text = "".join(pieces)
    if text != decode([int(i) for i in token_ids]):
        raise SequenceError(
            "decoding token by token does not reproduce the decoded text; character offsets of "
            "the grid cannot be recovered with this tokenizer"
        )
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    stops = np.cumsum(lengths)
    return text, np.stack([stops - lengths, stops], axis=1)


def _last_user_content(ids: list[int], special: HarmonyTokenIds) -> tuple[int, int]:
    """``(start, stop)`` of the content tokens of the last user message."""
    header = (special.start, *special.user)
    for i in range(len(ids) - len(header), -1, -1):
        if tuple(ids[i : i + len(header)]) == header:
            try:
                start = ids.index(special.message, i + len(header)) + 1
                stop = ids.index(special.end, start)
            except ValueError as err:
                raise SequenceError("the last user message is not closed by <|end|>") from err
            return start, stop
    raise SequenceError("the token ids hold no user message")


def _cell_char_offsets(grid_text: str) -> np.ndarray:
    """``(n, n)`` character offset of each cell symbol within ``grid_text`` (render format)."""
    lines = grid_text.split("\n")
    n = len(lines) - 1
    offsets = np.zeros((n, n), dtype=np.int64)
    line_start = len(lines[0]) + 1
    for row in range(n):
        line = lines[row + 1]
        first = len(f"{row} ")
        if not line.startswith(f"{row} ") or len(line) != first + 2 * n - 1:
            raise SequenceError(f"grid text row {row} is not in the render format: {line!r}")
        offsets[row] = line_start + first + 2 * np.arange(n)
        line_start += len(line) + 1
    return offsets


def locate_grid_tokens(
    token_ids: Sequence[int], tokenizer, grid_text: str, special_ids: HarmonyTokenIds
) -> GridTokens:
    """Find the grid of the last user message of a harmony ``token_ids`` and the token of each cell.

    ``grid_text`` (as :func:`goalprobe.gridworld.text.render` wrote it) must occur exactly once
    in the user message; :class:`SequenceError` otherwise, without a user message, or when two
    cells share one token."""
    ids = [int(i) for i in token_ids]
    start, stop = _last_user_content(ids, special_ids)
    text, spans = token_char_spans(ids[start:stop], tokenizer)
    count = text.count(grid_text)
    if count != 1:
        raise SequenceError(
            f"the grid text occurs {count} times in the user message (expected exactly once)"
        )
    return _grid_tokens(text, spans, start, grid_text, text.index(grid_text))


def _grid_tokens(
    text: str, spans: np.ndarray, start: int, grid_text: str, grid_start: int
) -> GridTokens:
    """The grid at character ``grid_start`` of ``text``, its tokens starting at ``start``."""
    grid_stop = grid_start + len(grid_text)
    cell_chars = grid_start + _cell_char_offsets(grid_text)
    # token k covers [spans[k, 0], spans[k, 1]): the covering token is the first stop > char
    cells = np.searchsorted(spans[:, 1], cell_chars, side="right") + start
    if len(np.unique(cells)) != cells.size:
        raise SequenceError("the tokenizer merges several grid cells into one token")
    overlapping = np.flatnonzero((spans[:, 1] > grid_start) & (spans[:, 0] < grid_stop))
    span = (int(overlapping[0]) + start, int(overlapping[-1]) + 1 + start)
    return GridTokens(span=span, cell_positions=cells.astype(np.int64))


@dataclass(frozen=True)
class TeacherForcedSequence:
    """One run's teacher-forced token ids and the positions patching needs.

    Attributes:
        token_ids: ``(seq,)`` int64 ids; the last one precedes the action word.
        prompt_length: number of prompt tokens.
        grid: the grid's token positions.
        anchors: both anchors (``post_reasoning`` is always set).
        reasoning_span: ``(start, stop)`` token positions of the reasoning body."""

    token_ids: np.ndarray
    prompt_length: int
    grid: GridTokens
    anchors: AnchorPositions
    reasoning_span: tuple[int, int]

    @property
    def readout_position(self) -> int:
        """The last position, whose logits give the action distribution."""
        return int(self.token_ids.shape[0] - 1)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


def reasoning_ids(tokenizer, reasoning: str, special_ids: HarmonyTokenIds) -> list[int]:
    """Completion ids ``<|channel|>analysis<|message|>{reasoning}<|end|>`` for a given text."""
    body = tokenizer.encode(f"{CHANNEL}analysis{MESSAGE}{reasoning}", add_special_tokens=False)
    return [int(i) for i in body] + [special_ids.end]


def _reasoning_stop(prompt_length: int, ids: list[int], special: HarmonyTokenIds) -> int:
    """Index in ``ids`` of the ``<|end|>`` that closes the analysis message of the completion."""
    analysis_header = (special.channel, *special.analysis, special.message)
    i = prompt_length
    if tuple(ids[i : i + len(analysis_header)]) != analysis_header:
        raise SequenceError("the completion does not open with <|channel|>analysis<|message|>")
    try:
        return ids.index(special.end, i + len(analysis_header))
    except ValueError as err:
        raise SequenceError("the reasoning is cut off (no <|end|> closes it)") from err


def build_sequence(
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    *,
    tokenizer,
    grid_text: str,
    special_ids: HarmonyTokenIds | None = None,
    action_tokens: ActionTokens,
    chat_format: ChatFormat | None = None,
) -> TeacherForcedSequence:
    """Prompt + the completion's reasoning +
    ``<|end|><|start|>assistant<|channel|>final<|message|>`` + the answer prefix (in harmony;
    other formats through ``chat_format``). Anything after the completion's reasoning is
    replaced.

    Raises:
        SequenceError: the completion has no closed reasoning, or the grid is not found."""
    prompt = [int(i) for i in prompt_ids]
    ids = prompt + [int(i) for i in completion_ids]
    if chat_format is not None and not isinstance(chat_format, HarmonyFormat):
        return _format_sequence(prompt, ids, tokenizer, grid_text, action_tokens, chat_format)
    if special_ids is None:
        if chat_format is None:
            raise TypeError("build_sequence needs special_ids or chat_format")
        special_ids = chat_format.special
    stop = _reasoning_stop(len(prompt), ids, special_ids)
    s = special_ids
    tail = [s.end, s.start, s.assistant, s.channel, *s.final, s.message, *action_tokens.prefix_ids]
    full = ids[:stop] + tail
    anchors = find_anchors(full, special_ids)
    if anchors.pre_reasoning[0] != len(prompt) - 3 or anchors.post_reasoning != tuple(
        range(stop, stop + 3)
    ):
        raise SequenceError("the harmony anchors are not where the prompt and reasoning end")
    grid = locate_grid_tokens(prompt, tokenizer, grid_text, special_ids)
    return TeacherForcedSequence(
        token_ids=np.asarray(full, dtype=np.int64),
        prompt_length=len(prompt),
        grid=grid,
        anchors=anchors,
        reasoning_span=(len(prompt) + 2 + len(s.analysis), stop),
    )


def _format_sequence(
    prompt: list[int],
    ids: list[int],
    tokenizer,
    grid_text: str,
    action_tokens: ActionTokens,
    chat_format: ChatFormat,
) -> TeacherForcedSequence:
    """:func:`build_sequence` through a chat format other than harmony (``ids``: prompt and
    completion)."""
    try:
        anchors = chat_format.find_anchors(ids)
    except ValueError as err:
        raise SequenceError(str(err)) from err
    if anchors.pre_reasoning[-1] != len(prompt) - 1:
        raise SequenceError("the pre-reasoning anchor is not where the prompt ends")
    span = chat_format.reasoning_span(ids)
    if anchors.post_reasoning is None or span is None:
        raise SequenceError("the reasoning is cut off (nothing closes it)")
    answer = chat_format.answer_start(ids)
    head = ids[: answer if answer is not None else len(ids)]
    full = head + list(action_tokens.prefix_ids)
    if chat_format.find_anchors(full) != anchors:
        raise SequenceError("the anchors are not where the prompt and reasoning end")
    text, spans = token_char_spans(prompt, tokenizer)
    grid_start = text.rfind(grid_text)
    if grid_start < 0:
        raise SequenceError("the grid text does not occur in the prompt")
    return TeacherForcedSequence(
        token_ids=np.asarray(full, dtype=np.int64),
        prompt_length=len(prompt),
        grid=_grid_tokens(text, spans, 0, grid_text, grid_start),
        anchors=anchors,
        reasoning_span=(span.start, span.stop),
    )


def check_aligned(
    base: TeacherForcedSequence,
    cf: TeacherForcedSequence,
    changed_cells: Sequence[RowCol],
) -> None:
    """Raise :class:`SequenceError` unless the two prompts align token for token (length, grid
    layout) and differ only at the changed cells."""
    if base.prompt_length != cf.prompt_length:
        raise SequenceError(
            f"base and counterfactual prompts differ in length ({base.prompt_length} vs "
            f"{cf.prompt_length} tokens); positions would not align"
        )
    if base.grid.span != cf.grid.span or not np.array_equal(
        base.grid.cell_positions, cf.grid.cell_positions
    ):
        raise SequenceError("base and counterfactual grids lie at different token positions")
    n = base.prompt_length
    differing = set(np.flatnonzero(base.token_ids[:n] != cf.token_ids[:n]).tolist())
    allowed = {int(base.grid.cell_positions[r, c]) for r, c in changed_cells}
    if not differing <= allowed:
        raise SequenceError(
            f"base and counterfactual prompts differ at positions {sorted(differing - allowed)} "
            "outside the changed cells"
        )


def _positions(sequence: TeacherForcedSequence, site: str, changed_cells=()) -> np.ndarray:
    """``(k,)`` int64 positions of ``site`` in one sequence."""
    if site == "grid":
        return np.arange(*sequence.grid.span, dtype=np.int64)
    if site == "changed_cells":
        if not changed_cells:
            raise ValueError("the changed_cells site needs the changed cells")
        rows, cols = np.asarray(changed_cells, dtype=np.int64).T
        return sequence.grid.cell_positions[rows, cols]
    if site in ("pre_reasoning", "post_reasoning"):
        return np.asarray(getattr(sequence.anchors, site), dtype=np.int64)
    if site == "answer":
        return np.asarray([sequence.readout_position], dtype=np.int64)
    if site == "all":
        return np.arange(len(sequence), dtype=np.int64)
    raise ValueError(f"unknown site {site!r}; expected one of {SITES}")


def site_positions(
    source: TeacherForcedSequence,
    target: TeacherForcedSequence,
    site: str,
    changed_cells: Sequence[RowCol] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """``(source_positions, target_positions)`` ``(k,)`` of ``site`` (value ``i`` goes from source
    to target); ValueError for an unknown site, :class:`SequenceError` for ``"all"`` on sequences
    of different lengths."""
    if site == "all" and len(source) != len(target):
        raise SequenceError(
            f"site 'all' needs sequences of equal length, got {len(source)} and {len(target)}"
        )
    return _positions(source, site, changed_cells), _positions(target, site, changed_cells)


def capture_positions(sequence: TeacherForcedSequence, sites: Sequence[str]) -> np.ndarray:
    """``(k,)`` sorted positions of ``sequence`` that any of ``sites`` reads as a source."""
    if "all" in sites:
        return np.arange(len(sequence), dtype=np.int64)
    parts = [_positions(sequence, "grid" if s == "changed_cells" else s) for s in sites]
    return np.unique(np.concatenate([_positions(sequence, "answer"), *parts]))


CHUNK_PREFIX = "reasoning_chunk_"


def chunk_site(index: int, n_chunks: int) -> str:
    """The site name ``"reasoning_chunk_<index + 1>of<n_chunks>"`` of chunk ``index`` (0-based)."""
    if not 0 <= index < n_chunks:
        raise ValueError(f"chunk index {index} outside 0 .. {n_chunks - 1}")
    return f"{CHUNK_PREFIX}{index + 1}of{n_chunks}"


def chunk_bounds(sequence: TeacherForcedSequence, index: int, n_chunks: int) -> tuple[int, int]:
    """``(start, stop)`` positions of chunk ``index`` of ``n_chunks``: the reasoning body's fraction
    ``[index / n, (index + 1) / n)`` (floored); :class:`SequenceError` when it holds no token."""
    begin, end = sequence.reasoning_span
    length = end - begin
    start = begin + (index * length) // n_chunks
    stop = begin + ((index + 1) * length) // n_chunks
    if stop <= start:
        raise SequenceError(
            f"reasoning of {length} tokens has no token in chunk {index + 1} of {n_chunks}"
        )
    return start, stop


def chunk_positions(
    source: TeacherForcedSequence, target: TeacherForcedSequence, index: int, n_chunks: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(source_positions, target_positions)`` of reasoning chunk ``index``: every target position
    of the chunk with the source position at the same fraction of the source's chunk (a longer
    source chunk is subsampled, a shorter one repeated); :class:`SequenceError` if either is
    empty."""
    t0, t1 = chunk_bounds(target, index, n_chunks)
    s0, s1 = chunk_bounds(source, index, n_chunks)
    offsets = np.arange(t1 - t0, dtype=np.int64)
    return s0 + (offsets * (s1 - s0)) // (t1 - t0), t0 + offsets
