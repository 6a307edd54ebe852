"""Chat formats: how a reasoning model's prompt and completion are laid out in tokens.

Everything after the rollout needs to know, for the model's tokenizer: how to render the
agent's prompt, how to split a completion into reasoning and answer, where the two activation
anchors and the reasoning lie in a token sequence (found by token ids, never by counting from
the end), which ids close the reasoning and open the answer (teacher forcing), and which ids
stop generation. A :class:`ChatFormat` says all of that for one tokenizer; its
:meth:`~ChatFormat.describe` JSON is stored in trajectory headers and activation stores.

Two implementations, by name in :data:`FORMATS`:

* ``harmony`` (:class:`HarmonyFormat`): GPT-OSS's harmony layout (:mod:`goalprobe.agents.harmony`,
  rendered by goalprobe); anchors ``<|end|> <|start|> assistant`` before the analysis channel
  and before ``<|channel|>final``.
* ``think_tag`` (:class:`ThinkTagFormat`): templates that wrap the reasoning in
  ``<think>...</think>`` (Qwen3, DeepSeek-R1 distills, OLMo-3-Think), rendered by the model's
  own chat template (``apply_chat_template`` with ``enable_thinking=True``). The template
  either lets the model emit ``<think>`` (Qwen3) or prefills it (R1 distills); both are read
  off the template. Anchors (``K = 3`` tokens each, as harmony):

  - *pre-reasoning*: the last three ids of the template's generation prompt (the assistant
    header, ``<|im_start|> assistant \\n`` for Qwen3, ``<｜Assistant｜> <think> \\n`` where the
    template prefills), found by matching the generation prompt's ids;
  - *post-reasoning*: the token before ``</think>`` (the last reasoning token, which may hold a
    newline it absorbed, such as ``".\\n"``, or the delimiter newline on its own), ``</think>``
    itself, and the token after it (the template's separator, ``"\\n\\n"`` for Qwen3), found by
    the id of ``</think>``.

  The reasoning span runs from the first token after ``<think>`` (a newline-only token right
  after it is the delimiter and is skipped) to ``</think>`` (a newline-only token right before
  it is the delimiter and is left out).

:func:`chat_format_for` picks the format a tokenizer supports (harmony when it holds the harmony
special tokens, else think-tag) and raises one clear error naming what is missing otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast

from goalprobe.agents import harmony
from goalprobe.agents.harmony import (
    DEFAULT_SYSTEM,
    AnchorPositions,
    HarmonyTokenIds,
    Message,
    ReasoningEffort,
    ReasoningSpan,
    SplitCompletion,
    SystemContent,
    encode_text,
)

ANCHOR_TOKENS = 3
"""Tokens per anchor, in every format (the store's ``K``)."""


class ChatFormat(Protocol):
    """What a chat format says about one tokenizer (see the module docstring)."""

    @property
    def name(self) -> str:
        """The format's registry name."""
        ...

    @property
    def anchor_tokens(self) -> int:
        """Tokens per anchor."""
        ...

    def render_prompt(
        self, messages: Sequence[Message], reasoning_effort: ReasoningEffort = "low"
    ) -> str:
        """The prompt text, ending where the model starts generating."""
        ...

    def encode_prompt(
        self, messages: Sequence[Message], reasoning_effort: ReasoningEffort = "low"
    ) -> list[int]:
        """``(prompt_len,)`` token ids of :meth:`render_prompt`."""
        ...

    def render_completion(self, reasoning: str, answer: str) -> str:
        """What the model generates: its reasoning, then its answer, then the stop token."""
        ...

    def split_completion(self, completion: str | Sequence[int]) -> SplitCompletion:
        """Reasoning and answer of a completion (text, or ids decoded with the tokenizer)."""
        ...

    def opens_reasoning(self, generated_ids: Sequence[int]) -> bool:
        """Whether a completion starts as the format's reasoning starts (else it is malformed and
        has no post-reasoning anchor)."""
        ...

    def find_anchors(self, token_ids: Sequence[int]) -> AnchorPositions:
        """Pre- and post-reasoning anchor positions (``K`` each) in prompt (+ completion) ids."""
        ...

    def reasoning_span(self, token_ids: Sequence[int]) -> ReasoningSpan | None:
        """Where the reasoning lies in prompt + completion ids (None: no complete reasoning)."""
        ...

    def answer_start(self, token_ids: Sequence[int]) -> int | None:
        """Index of the answer's first token in prompt + completion ids (None: no answer after
        a complete reasoning)."""
        ...

    def encode_reasoning(self, reasoning: str) -> list[int]:
        """Completion ids from its start up to the answer's first token (the reasoning and the
        ids that close it and open the answer, encoded together, so a newline the reasoning's
        last token absorbs is tokenized as the model would): what teacher forcing appends to a
        prompt."""
        ...

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end generation."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON description (stored in trajectory headers and activation stores)."""
        ...


def _decode(tokenizer, completion: str | Sequence[int]) -> str:
    if isinstance(completion, str):
        return completion
    return tokenizer.decode(
        [int(i) for i in completion], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


# ---------------------------------------------------------------------------------------------
# Harmony
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HarmonyFormat:
    """GPT-OSS's harmony format (:mod:`goalprobe.agents.harmony`) for one tokenizer, its
    prompts opened by the system content ``system``."""

    tokenizer: Any = field(repr=False, compare=False)
    special: HarmonyTokenIds
    name: str = "harmony"
    anchor_tokens: int = ANCHOR_TOKENS
    system: SystemContent = DEFAULT_SYSTEM

    @classmethod
    def from_tokenizer(cls, tokenizer) -> HarmonyFormat:
        """Raises ``ValueError`` when the tokenizer lacks a harmony special token."""
        return cls(tokenizer, HarmonyTokenIds.from_tokenizer(tokenizer))

    def render_prompt(self, messages, reasoning_effort="low") -> str:
        return harmony.render_prompt(messages, reasoning_effort, system=self.system)

    def encode_prompt(self, messages, reasoning_effort="low") -> list[int]:
        return harmony.encode_prompt(self.tokenizer, messages, reasoning_effort, self.system)

    def render_completion(self, reasoning: str, answer: str) -> str:
        return harmony.render_completion(reasoning, answer)

    def split_completion(self, completion) -> SplitCompletion:
        return harmony.split_completion(_decode(self.tokenizer, completion))

    def opens_reasoning(self, generated_ids) -> bool:
        return bool(generated_ids) and int(generated_ids[0]) == self.special.channel

    def find_anchors(self, token_ids) -> AnchorPositions:
        return harmony.find_anchors(token_ids, self.special)

    def reasoning_span(self, token_ids) -> ReasoningSpan | None:
        return harmony.reasoning_span(token_ids, self.special)

    def answer_start(self, token_ids) -> int | None:
        ids = [int(i) for i in token_ids]
        post = self.find_anchors(ids).post_reasoning
        later = range(post[2] + 1, len(ids)) if post is not None else ()
        message = next((i for i in later if ids[i] == self.special.message), len(ids))
        return message + 1 if message + 1 < len(ids) else None

    def encode_reasoning(self, reasoning: str) -> list[int]:
        text = harmony.render_completion(reasoning, "").removesuffix(harmony.RETURN)
        return encode_text(self.tokenizer, text)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self.special.stop_ids

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "anchor_tokens": self.anchor_tokens,
            "token_ids": {
                k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.special).items()
            },
        }


# ---------------------------------------------------------------------------------------------
# Think tags
# ---------------------------------------------------------------------------------------------

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
_PROBE_SYSTEM = "SYSTEM-PROBE"
_PROBE_USER = "USER-PROBE"
_PROBE_REASONING = "REASONING-PROBE"
_PROBE_ANSWER = "ANSWER-PROBE"


EFFORT_KEYWORD = "reasoning_effort"
"""The template variable that carries the reasoning effort where a template has one (GPT-OSS's,
Qwen3.8's)."""


class ChatFormatError(ValueError):
    """The tokenizer's chat template supports no known chat format (the message names what is
    missing)."""


def _single_token(tokenizer, token: str) -> int | None:
    token_id = tokenizer.convert_tokens_to_ids(token)
    unk = getattr(tokenizer, "unk_token_id", None)
    if token_id is None or token_id == unk:
        return None
    return int(token_id) if encode_text(tokenizer, token) == [int(token_id)] else None


@dataclass(frozen=True)
class ThinkTagFormat:
    """A template that wraps the reasoning in ``<think>...</think>`` (module docstring).

    Attributes:
        tokenizer: the tokenizer, whose ``chat_template`` renders prompts.
        open_id, close_id: ids of ``<think>`` and ``</think>``.
        generation_prompt: the text the template appends for generation (the assistant header,
            and ``<think>\\n`` where the template prefills it).
        generation_ids: its ids.
        prefilled: whether the generation prompt already opens the reasoning.
        reasoning_open: text the completion starts with before the reasoning (``<think>\\n``;
            ``""`` where prefilled).
        reasoning_close: text between the reasoning and the answer (``\\n</think>\\n\\n``).
        stop_token: the token that ends the assistant turn (the tokenizer's ``eos_token``).
        effort_keyword: the template's reasoning-effort variable (None: the template has none,
            and the effort is not rendered).
        template_sha256: sha256 of the chat template text.
    """

    tokenizer: Any = field(repr=False, compare=False)
    open_id: int
    close_id: int
    generation_prompt: str
    generation_ids: tuple[int, ...]
    prefilled: bool
    reasoning_open: str
    reasoning_close: str
    stop_token: str
    stop_token_id: int
    effort_keyword: str | None
    template_sha256: str
    name: str = "think_tag"
    anchor_tokens: int = ANCHOR_TOKENS

    @classmethod
    def from_tokenizer(cls, tokenizer, effort_keyword: str | None = None) -> ThinkTagFormat:
        """Read the format off the tokenizer's chat template (``effort_keyword`` None: the
        template's :data:`EFFORT_KEYWORD` when it reads that variable, else no effort).

        Raises:
            ChatFormatError: no chat template, no single-token ``<think>`` / ``</think>``, a
                template that never writes ``</think>``, or no stop token.
        """
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise ChatFormatError(
                "the tokenizer has no chat template and no harmony special tokens, so prompts "
                "cannot be rendered in its format"
            )
        missing = [t for t in (OPEN_TAG, CLOSE_TAG) if _single_token(tokenizer, t) is None]
        if missing or CLOSE_TAG not in template:
            what = (
                f"the tokenizer has no single token {' / '.join(missing)}"
                if missing
                else f"its chat template never writes {CLOSE_TAG}"
            )
            raise ChatFormatError(
                f"the chat template has no reasoning delimiters: {what} (and the tokenizer has no "
                "harmony special tokens); goalprobe needs a reasoning model whose template "
                f"separates reasoning from answer ({OPEN_TAG}...{CLOSE_TAG} or harmony channels)"
            )
        if effort_keyword is None and EFFORT_KEYWORD in template:
            effort_keyword = EFFORT_KEYWORD
        stop = getattr(tokenizer, "eos_token", None)
        if not stop or _single_token(tokenizer, stop) is None:
            raise ChatFormatError("the tokenizer has no single-token eos_token to stop on")
        messages = [
            {"role": "system", "content": _PROBE_SYSTEM},
            {"role": "user", "content": _PROBE_USER},
        ]

        def render(msgs, generation: bool) -> str:
            return tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=generation, enable_thinking=True
            )

        with_gen, without = render(messages, True), render(messages, False)
        if not with_gen.startswith(without) or with_gen == without:
            raise ChatFormatError(
                "the chat template's generation prompt does not extend the rendered conversation"
            )
        generation_prompt = with_gen[len(without) :]
        prefilled = OPEN_TAG in generation_prompt
        reasoning_open = "" if prefilled else f"{OPEN_TAG}\n"
        reasoning_close = f"\n{CLOSE_TAG}\n\n"
        turn = {
            "role": "assistant",
            "content": _PROBE_ANSWER,
            "reasoning_content": _PROBE_REASONING,
        }
        answered = render([*messages, turn], False)
        # where the template renders the last turn's reasoning, read the delimiters off it
        tail = answered[len(with_gen) :] if answered.startswith(with_gen) else ""
        if _PROBE_REASONING in tail and _PROBE_ANSWER in tail:
            reasoning_open = tail[: tail.index(_PROBE_REASONING)]
            reasoning_close = tail[
                tail.index(_PROBE_REASONING) + len(_PROBE_REASONING) : tail.index(_PROBE_ANSWER)
            ]
        generation_ids = tuple(encode_text(tokenizer, generation_prompt))
        if len(generation_ids) < ANCHOR_TOKENS:
            raise ChatFormatError(
                f"the chat template's generation prompt {generation_prompt!r} is "
                f"{len(generation_ids)} tokens, fewer than the {ANCHOR_TOKENS} anchor tokens"
            )
        return cls(
            tokenizer=tokenizer,
            open_id=cast(int, _single_token(tokenizer, OPEN_TAG)),  # checked above
            close_id=cast(int, _single_token(tokenizer, CLOSE_TAG)),
            generation_prompt=generation_prompt,
            generation_ids=generation_ids,
            prefilled=prefilled,
            reasoning_open=reasoning_open,
            reasoning_close=reasoning_close,
            stop_token=stop,
            stop_token_id=cast(int, _single_token(tokenizer, stop)),
            effort_keyword=effort_keyword,
            template_sha256=hashlib.sha256(template.encode("utf-8")).hexdigest(),
        )

    # -- rendering ------------------------------------------------------------------------------

    def chat_messages(self, messages: Sequence[Message]) -> list[dict[str, str]]:
        """The messages as the template takes them: developer instructions become the system
        message (think-tag templates have no developer role), after any system text."""
        system = [m.content for m in messages if m.role in ("system", "developer")]
        out = [{"role": "system", "content": "\n\n".join(system)}] if system else []
        for m in messages:
            if m.role in ("user", "assistant"):
                out.append({"role": m.role, "content": m.content})
        return out

    def render_prompt(self, messages, reasoning_effort="low") -> str:
        messages = list(messages)
        if not any(m.role == "user" for m in messages):
            raise ValueError("a prompt needs a user message")
        kwargs: dict[str, Any] = {"enable_thinking": True}
        if self.effort_keyword is not None:
            kwargs[self.effort_keyword] = reasoning_effort
        return self.tokenizer.apply_chat_template(
            self.chat_messages(messages), tokenize=False, add_generation_prompt=True, **kwargs
        )

    def encode_prompt(self, messages, reasoning_effort="low") -> list[int]:
        return encode_text(self.tokenizer, self.render_prompt(messages, reasoning_effort))

    def render_completion(self, reasoning: str, answer: str) -> str:
        for name, text in (("reasoning", reasoning), ("answer", answer)):
            for tag in (OPEN_TAG, CLOSE_TAG, self.stop_token):
                if tag in text:
                    raise ValueError(f"{name} contains the delimiter {tag}")
        return f"{self.reasoning_open}{reasoning}{self.reasoning_close}{answer}{self.stop_token}"

    def split_completion(self, completion) -> SplitCompletion:
        """Text before ``</think>`` is the reasoning (after ``<think>`` unless prefilled), text
        after it the answer; the template's delimiter newlines are removed. Well formed: the
        reasoning opens as the template opens it, closes, and the answer ends in the stop
        token."""
        text = _decode(self.tokenizer, completion)
        well_formed = True
        pos = 0
        if text.startswith(self.reasoning_open):
            pos = len(self.reasoning_open)
        elif text.lstrip().startswith(OPEN_TAG):
            pos = text.index(OPEN_TAG) + len(OPEN_TAG)
            well_formed = False
        elif not self.prefilled:
            well_formed = False
        close = text.find(CLOSE_TAG, pos)
        if close < 0:
            return SplitCompletion(text[pos:].strip("\n"), "", False)
        head = self.reasoning_close[: self.reasoning_close.index(CLOSE_TAG)]
        sep = self.reasoning_close[self.reasoning_close.index(CLOSE_TAG) + len(CLOSE_TAG) :]
        start = close - len(head) if head and text.endswith(head, pos, close) else close
        reasoning = text[pos:start]
        answer = text[close + len(CLOSE_TAG) :]
        if sep and answer.startswith(sep):
            answer = answer[len(sep) :]
        else:
            answer = answer.lstrip("\n")
            well_formed = False
        if answer.endswith(self.stop_token):
            answer = answer[: -len(self.stop_token)]
        else:
            well_formed = False
        return SplitCompletion(reasoning, answer, well_formed)

    # -- positions ------------------------------------------------------------------------------

    def _is_newline(self, token_id: int) -> bool:
        piece = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return piece != "" and piece.strip("\n") == ""

    def opens_reasoning(self, generated_ids) -> bool:
        if self.prefilled:
            return bool(generated_ids)
        return bool(generated_ids) and int(generated_ids[0]) == self.open_id

    def find_anchors(self, token_ids) -> AnchorPositions:
        """Pre: the last three ids of the last generation prompt before the first ``</think>``;
        post: the token before the first ``</think>`` after it, ``</think>``, the token after.
        ``ValueError``: no generation prompt in the ids (not rendered with this template).
        """
        ids = [int(i) for i in token_ids]
        header, n = list(self.generation_ids), len(self.generation_ids)
        close = ids.index(self.close_id) if self.close_id in ids else len(ids)
        starts = range(close - n, -1, -1)
        end = next((i + n for i in starts if ids[i : i + n] == header), None)
        if end is None:
            raise ValueError(
                f"no pre-reasoning anchor: the ids hold no generation prompt "
                f"{self.generation_prompt!r} of the chat template; render prompts with the "
                "model's chat format (goalprobe.agents.chat_format)"
            )
        pre = (end - 3, end - 2, end - 1)  # ANCHOR_TOKENS = 3
        post = (close - 1, close, close + 1) if end <= close - 1 < len(ids) - 2 else None
        return AnchorPositions(pre_reasoning=pre, post_reasoning=post)

    def reasoning_span(self, token_ids) -> ReasoningSpan | None:
        ids = [int(i) for i in token_ids]
        anchors = self.find_anchors(ids)
        if anchors.post_reasoning is None:
            return None
        start = anchors.pre_reasoning[-1] + 1
        stop = anchors.post_reasoning[1]
        if not self.prefilled:
            if start >= stop or ids[start] != self.open_id:
                return None
            start += 1
        if start < stop and self._is_newline(ids[start]):
            start += 1
        if stop > start and self._is_newline(ids[stop - 1]):
            stop -= 1
        return ReasoningSpan(start, stop)

    def answer_start(self, token_ids) -> int | None:
        """The first token after ``</think>`` that is not whitespace only."""
        ids = [int(i) for i in token_ids]
        post = self.find_anchors(ids).post_reasoning
        if post is None:
            return None
        i = post[1] + 1
        while i < len(ids) and self._is_newline(ids[i]):
            i += 1
        return i if i < len(ids) else None

    def encode_reasoning(self, reasoning: str) -> list[int]:
        return encode_text(
            self.tokenizer, f"{self.reasoning_open}{reasoning}{self.reasoning_close}"
        )

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.stop_token_id,)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "anchor_tokens": self.anchor_tokens,
            "open": OPEN_TAG,
            "close": CLOSE_TAG,
            "open_id": self.open_id,
            "close_id": self.close_id,
            "generation_prompt": self.generation_prompt,
            "generation_ids": list(self.generation_ids),
            "prefilled": self.prefilled,
            "reasoning_open": self.reasoning_open,
            "reasoning_close": self.reasoning_close,
            "stop": [self.stop_token],
            "stop_ids": list(self.stop_ids),
            "effort_keyword": self.effort_keyword,
            "template_sha256": self.template_sha256,
        }


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

FORMATS: dict[str, Any] = {"harmony": HarmonyFormat, "think_tag": ThinkTagFormat}
"""Chat formats by name; each class has ``from_tokenizer(tokenizer)``."""

HARMONY_DESCRIPTION_NAME = "harmony"
"""The format of trajectory files and stores written before formats were recorded."""


def chat_format_for(tokenizer, name: str | None = None) -> ChatFormat:
    """The chat format of ``tokenizer``: ``name`` from :data:`FORMATS`, or detected (harmony
    when the tokenizer holds the harmony special tokens, else think-tag). Raises
    :class:`ChatFormatError` when no format fits, ``ValueError`` for an unknown ``name``.
    """
    if name is not None:
        if name not in FORMATS:
            raise ValueError(f"unknown chat format {name!r}; expected one of {sorted(FORMATS)}")
        return FORMATS[name].from_tokenizer(tokenizer)
    if all(_single_token(tokenizer, t) is not None for t in harmony.SPECIAL_TOKENS):
        return HarmonyFormat.from_tokenizer(tokenizer)
    return ThinkTagFormat.from_tokenizer(tokenizer)


def model_chat_format(model: str) -> ChatFormat:
    """The chat format of ``model`` (a registered agent's name, a model directory or a hub id),
    read off its tokenizer without loading its weights (what a verb checks before any model
    loads); :class:`ChatFormatError` when no format fits.
    """
    from goalprobe.agents.models import load_tokenizer

    return chat_format_for(load_tokenizer(model))


def with_chat_format(description: dict[str, Any], chat_format: ChatFormat | None) -> dict[str, Any]:
    """A backend description (it enters the rollouts' run id) with the chat format's
    description added, unless the format is harmony (or None): a harmony run keeps the run id it
    had before formats were recorded, and a run in another format never resumes a file of
    another format (or of the same model under another chat template)."""
    if chat_format is None or chat_format.name == HARMONY_DESCRIPTION_NAME:
        return dict(description)
    return {**description, "chat_format": chat_format.describe()}


def format_name(description: dict[str, Any] | None) -> str:
    """The format name of a stored description (None, from older files: harmony)."""
    if not description:
        return HARMONY_DESCRIPTION_NAME
    return str(description.get("name", HARMONY_DESCRIPTION_NAME))
