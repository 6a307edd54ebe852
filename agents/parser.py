"""Parse the agent's final answer into an :class:`~goalprobe.gridworld.core.Action`.

:func:`parse_action` accepts the study's ``{"action": "UP"}`` with the usual noise (text
around it, code fences, any case, trailing commas, single quotes, an unquoted key, other keys;
a lone ``"action": "UP"`` pair as ``form="key_value"``) and rejects, with an ``error``, anything
that does not name exactly one action; it never raises. :func:`parse_completion` names no
action for an answer cut off by the token limit (``truncated=True``); every caller that turns a
generation into an action goes through it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from goalprobe.gridworld.core import Action

ParseForm = Literal["json", "relaxed_json", "key_value"]

_FLAT_OBJECT = re.compile(r"\{[^{}]*\}")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_UNQUOTED_KEY = re.compile(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)(\s*:)")
_KEY_VALUE = re.compile(
    r"""["']?\baction\b["']?\s*:\s*["']\s*([A-Za-z]+)\s*["']""",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ParseResult:
    """The outcome of parsing one final answer.

    Attributes:
        action: the parsed action, or None when the answer named no single valid action.
        error: why parsing failed (None on success).
        form: how the action was found: ``"json"`` (strict JSON object), ``"relaxed_json"``
            (after fixing trailing commas, single quotes or unquoted keys) or ``"key_value"``
            (an ``"action": "..."`` pair outside any complete object); None on failure.
        truncated: the generation was cut off by the token limit (no action, whatever the
            text says; see :func:`parse_completion`).
    """

    action: Action | None
    error: str | None = None
    form: ParseForm | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Whether an action was parsed."""
        return self.action is not None


@dataclass(frozen=True)
class _Candidate:
    value: object
    form: ParseForm


TRUNCATED_ERROR = "truncated: the generation hit the token limit (finish_reason 'length')"
"""The ``error`` of a :class:`ParseResult` for a cut-off generation."""


def parse_completion(final: str | None, finish_reason: str) -> ParseResult:
    """The action of one generation: none when it was cut off by the token limit
    (``finish_reason == "length"``: truncated, whatever its text holds), else
    :func:`parse_action` of its final text (empty text counts as none)."""
    if finish_reason == "length":
        return ParseResult(None, TRUNCATED_ERROR, None, truncated=True)
    return parse_action(final if final else None)


def parse_action(text: str | None) -> ParseResult:
    """Parse one completion's final-channel text (None when there is none) into one action; never
    raises (``result.action`` is None exactly when ``result.error`` is set)."""
    if text is None:
        return ParseResult(None, "no final answer (the model produced no final message)")
    if not isinstance(text, str):
        return ParseResult(None, f"final answer is a {type(text).__name__}, not text")
    if not text.strip():
        return ParseResult(None, "empty final answer")

    candidates = _object_candidates(text)
    if not candidates:
        candidates = _key_value_candidates(text)
    if not candidates:
        return ParseResult(None, f'no {{"action": ...}} object in the final answer: {_clip(text)}')

    actions: list[Action] = []
    for cand in candidates:
        if isinstance(cand.value, _Conflict):
            return ParseResult(
                None,
                f"ambiguous answer: the action key is given twice "
                f"({cand.value.first!r} and {cand.value.second!r})",
            )
        if not isinstance(cand.value, str):
            return ParseResult(
                None, f"action value must be a string, got {type(cand.value).__name__}"
            )
        try:
            actions.append(Action.from_name(cand.value))
        except ValueError:
            return ParseResult(
                None, f"unknown action {_clip(cand.value)}; expected UP, DOWN, LEFT or RIGHT"
            )
    distinct = sorted(set(actions))
    if len(distinct) > 1:
        names = ", ".join(a.name for a in distinct)
        return ParseResult(None, f"ambiguous answer: conflicting actions {names}")
    # the least strict form that contributed describes the answer
    form = min((c.form for c in candidates), key=_FORM_ORDER.index)
    return ParseResult(distinct[0], None, form)


_FORM_ORDER: tuple[ParseForm, ...] = ("key_value", "relaxed_json", "json")


def _object_candidates(text: str) -> list[_Candidate]:
    """The ``action`` values (any key case) of the outermost JSON objects in ``text``."""
    found: list[_Candidate] = []
    covered: list[tuple[int, int]] = []
    decoder = json.JSONDecoder(object_pairs_hook=_merge_pairs)
    # Strict JSON from every '{' (handles nesting); only top-level keys of each object count.
    for match in re.finditer(r"\{", text):
        start = match.start()
        if any(s <= start < e for s, e in covered):
            continue
        try:
            value, end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            covered.append((start, end))
            found.extend(_Candidate(v, "json") for v in _action_values(value))
    # Relaxed parsing of flat objects that strict JSON rejected (trailing comma, quotes, keys).
    for match in _FLAT_OBJECT.finditer(text):
        start = match.start()
        if any(s <= start < e for s, e in covered):
            continue
        value = _relaxed_loads(match.group(0))
        if isinstance(value, dict):
            found.extend(_Candidate(v, "relaxed_json") for v in _action_values(value))
    return found


def _action_values(obj: dict) -> list[object]:
    """The values of the keys of ``obj`` spelling ``action`` in any case and spacing."""
    return [v for k, v in obj.items() if isinstance(k, str) and k.strip().lower() == "action"]


def _relaxed_loads(fragment: str) -> object | None:
    """``json.loads`` after repairing the usual near-JSON mistakes; None when still invalid."""
    repaired = _TRAILING_COMMA.sub(r"\1", fragment)
    repaired = _UNQUOTED_KEY.sub(r'\1"\2"\3', repaired)
    if '"' not in repaired:
        repaired = repaired.replace("'", '"')
    try:
        return json.loads(repaired, object_pairs_hook=_merge_pairs)
    except (json.JSONDecodeError, RecursionError):
        return None


@dataclass(frozen=True)
class _Conflict:
    """The value of a key that one object gives twice with different values."""

    first: object
    second: object


def _merge_pairs(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` keeping a duplicated key's conflicting values visible."""
    merged: dict[str, object] = {}
    for key, value in pairs:
        if key in merged and merged[key] != value:
            merged[key] = _Conflict(merged[key], value)
        else:
            merged[key] = value
    return merged


def _key_value_candidates(text: str) -> list[_Candidate]:
    """Bare ``"action": "X"`` pairs, used only when no complete object was found."""
    return [_Candidate(m.group(1), "key_value") for m in _KEY_VALUE.finditer(text)]


def _clip(text: str, limit: int = 80) -> str:
    """A short repr of ``text`` for error messages."""
    return repr(text if len(text) <= limit else text[:limit] + "...")
