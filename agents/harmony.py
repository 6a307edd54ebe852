"""GPT-OSS's harmony chat format, rendered by goalprobe, and the two activation anchors.

The one place in the toolkit that knows the harmony layout. A prompt is (without line breaks)::

    <|start|>system<|message|>{system content}<|end|>
    <|start|>developer<|message|># Instructions\n\n{instructions}<|end|>
    <|start|>user<|message|>{grid}<|end|>
    <|start|>assistant

and a completion ``<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant
<|channel|>final<|message|>{answer}<|return|>``. The system content follows
``openai_harmony.SystemContent``'s defaults. The pre-reasoning anchor (study, section 5) is the
``<|end|> <|start|> assistant`` that closes the prompt, the post-reasoning anchor the one that
closes the reasoning; :func:`find_anchors` locates both by token ids for any tokenizer with the
harmony special tokens.

A chat-completions server (vLLM, openai-harmony) renders gpt-oss prompts its own way: a
``Current date:`` line in its system message (the server's clock, unless
``VLLM_SYSTEM_START_DATE`` is set), its own channel list, a developer message without the
``# Instructions`` header, and in older versions an empty developer message first. Rollouts replay
the ids the server returned; a prompt goalprobe renders itself (the probing set, every prompt-only
state) must be rendered the same way, or probes are trained on one prompt and read on another:
:class:`ServedHarmony` reads that rendering off one served prompt and renders any conversation as
that server would, token for token (with the date the served prompt carried, never the local
clock).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
RETURN = "<|return|>"
CALL = "<|call|>"
CONSTRAIN = "<|constrain|>"

SPECIAL_TOKENS: tuple[str, ...] = (START, END, MESSAGE, CHANNEL, RETURN, CALL, CONSTRAIN)
"""Every harmony formatting token the toolkit renders or recognises."""

ReasoningEffort = Literal["low", "medium", "high"]
REASONING_EFFORTS: tuple[ReasoningEffort, ...] = ("low", "medium", "high")

Role = Literal["system", "developer", "user", "assistant"]
_ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant")


@dataclass(frozen=True)
class Message:
    """One chat message.

    Attributes:
        role: ``"developer"`` (instructions), ``"user"`` or ``"assistant"``. A ``"system"``
            message replaces the system content :func:`render_prompt` would build (its text is
            rendered verbatim, so it must carry its own ``Reasoning:`` line).
        content: the message text (no harmony special tokens).
        channel: for assistant messages, ``"analysis"`` or ``"final"``; None otherwise.
    """

    role: Role
    content: str
    channel: str | None = None

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(f"unknown message role {self.role!r}; expected one of {_ROLES}")
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be str, got {type(self.content).__name__}")
        for token in SPECIAL_TOKENS:
            if token in self.content:
                raise ValueError(
                    f"{self.role} message content contains the harmony special token {token}"
                )
        if self.channel is not None and self.role != "assistant":
            raise ValueError(f"only assistant messages have a channel, got a {self.role} one")


@dataclass(frozen=True)
class SystemContent:
    """The system message harmony puts first (defaults: ``openai_harmony.SystemContent.new()``).

    Attributes:
        model_identity: first line of the system message.
        knowledge_cutoff: rendered as ``Knowledge cutoff: ...``; None leaves the line out.
        conversation_start_date: rendered as ``Current date: ...``; None leaves the line out
            (the default, so that prompts do not change from day to day).
        valid_channels: the channels the system message declares.
    """

    model_identity: str | None = "You are ChatGPT, a large language model trained by OpenAI."
    knowledge_cutoff: str | None = "2024-06"
    conversation_start_date: str | None = None
    valid_channels: tuple[str, ...] = field(default=("analysis", "commentary", "final"))

    def render(self, reasoning_effort: ReasoningEffort) -> str:
        """The system message text for ``reasoning_effort`` (no special tokens)."""
        _check_effort(reasoning_effort)
        top = [self.model_identity] if self.model_identity is not None else []
        if self.knowledge_cutoff is not None:
            top.append(f"Knowledge cutoff: {self.knowledge_cutoff}")
        if self.conversation_start_date is not None:
            top.append(f"Current date: {self.conversation_start_date}")
        sections = ["\n".join(top)] if top else []
        sections.append(f"Reasoning: {reasoning_effort}")
        if self.valid_channels:
            sections.append(
                f"# Valid channels: {', '.join(self.valid_channels)}. "
                "Channel must be included for every message."
            )
        return "\n\n".join(sections)


DEFAULT_SYSTEM = SystemContent()


def _check_effort(reasoning_effort: str) -> None:
    if reasoning_effort not in REASONING_EFFORTS:
        raise ValueError(
            f"unknown reasoning effort {reasoning_effort!r}; expected one of {REASONING_EFFORTS}"
        )


INSTRUCTIONS_HEADER = "# Instructions\n\n"
"""What goalprobe's (and openai-harmony's ``DeveloperContent``) developer message opens with."""


def render_message(message: Message, instructions_header: bool = True) -> str:
    """One message as ``<|start|>{role}[<|channel|>{channel}]<|message|>{content}<|end|>`` (a
    developer message opened by :data:`INSTRUCTIONS_HEADER` unless ``instructions_header`` is
    off)."""
    header: str = message.role
    if message.channel is not None:
        header += f"{CHANNEL}{message.channel}"
    content = message.content
    if message.role == "developer" and instructions_header:
        content = f"{INSTRUCTIONS_HEADER}{content}"
    return f"{START}{header}{MESSAGE}{content}{END}"


def render_prompt(
    messages: Sequence[Message],
    reasoning_effort: ReasoningEffort = "low",
    *,
    system: SystemContent = DEFAULT_SYSTEM,
) -> str:
    """Render a conversation for completion: ``system`` (unless ``messages`` starts with a system
    message, which replaces it), the messages, then ``<|start|>assistant``, so the text ends in
    the pre-reasoning anchor ``<|end|><|start|>assistant``. The study uses effort ``"low"``."""
    _check_effort(reasoning_effort)
    messages = list(messages)
    if not messages:
        raise ValueError("cannot render an empty conversation")
    if any(m.role == "system" for m in messages[1:]):
        raise ValueError("a system message may only come first")
    if messages[0].role == "system":
        parts = [render_message(messages[0])]
        messages = messages[1:]
    else:
        parts = [f"{START}system{MESSAGE}{system.render(reasoning_effort)}{END}"]
    parts.extend(render_message(m) for m in messages)
    parts.append(f"{START}assistant")
    return "".join(parts)


def encode_prompt(
    tokenizer,
    messages: Sequence[Message],
    reasoning_effort: ReasoningEffort,
    system: SystemContent = DEFAULT_SYSTEM,
) -> list[int]:
    """``(prompt_len,)`` token ids of one conversation's harmony prompt under ``tokenizer`` (the
    ids a local model is run on; special tokens are parsed from the rendered text)."""
    return encode_text(tokenizer, render_prompt(messages, reasoning_effort, system=system))


def encode_text(tokenizer, text: str) -> list[int]:
    """The token ids of ``text`` (special tokens parsed from it, none added)."""
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def render_completion(reasoning: str, final: str) -> str:
    """The assistant's completion of a :func:`render_prompt` prompt (module docstring's layout)."""
    for name, text in (("reasoning", reasoning), ("final", final)):
        for token in SPECIAL_TOKENS:
            if token in text:
                raise ValueError(f"{name} contains the harmony special token {token}")
    return (
        f"{CHANNEL}analysis{MESSAGE}{reasoning}{END}"
        f"{START}assistant{CHANNEL}final{MESSAGE}{final}{RETURN}"
    )


# ---------------------------------------------------------------------------------------------
# Splitting a completion
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitCompletion:
    """A completion split into its channels.

    Attributes:
        reasoning: the analysis-channel text ("" when there is none).
        final: the final-channel text ("" when there is none).
        well_formed: True when the completion is exactly one analysis message then one final
            message closed by ``<|return|>`` (or ``<|end|>``), as :func:`render_completion`
            writes it.
    """

    reasoning: str
    final: str
    well_formed: bool

    def __iter__(self):
        return iter((self.reasoning, self.final, self.well_formed))


class _Decoder(Protocol):
    def decode(self, token_ids, skip_special_tokens: bool = ...) -> str: ...


def split_completion(completion: str | Sequence[int], tokenizer: _Decoder | None = None):
    """Split generated text (or token ids, with ``tokenizer``) into reasoning and final answer.

    Accepts what follows the prompt, with or without a leading ``<|start|>assistant``. Several
    analysis messages are joined by newlines; messages of other channels are ignored. A final
    message cut off before its end token still gives its text, but is not well formed.
    """
    if not isinstance(completion, str):
        if tokenizer is None:
            raise TypeError("split_completion needs a tokenizer to decode token ids")
        completion = tokenizer.decode(list(completion), skip_special_tokens=False)
    head = _HEAD_RE.match(completion)
    pos = head.end() if head is not None else 0
    messages: list[tuple[str, str, str]] = []
    while pos < len(completion):
        match = _MESSAGE_RE.match(completion, pos)
        if match is None:
            break
        messages.append((match["channel"].strip(), match["text"], match["closer"]))
        pos = match.end()
        if match["closer"] in ("", RETURN, CALL):
            break
    analysis = [text for channel, text, _ in messages if channel == "analysis"]
    finals = [text for channel, text, _ in messages if channel == "final"]
    well_formed = (
        pos == len(completion)
        and len(messages) == 2
        and messages[0][0] == "analysis"
        and messages[0][2] == END
        and messages[1][0] == "final"
        and messages[1][2] in (RETURN, END)
    )
    return SplitCompletion("\n".join(analysis), "\n".join(finals), well_formed)


_HEAD_RE = re.compile(r"\s*(?:<\|start\|>)?\s*assistant(?=<\|channel\|>)")
_MESSAGE_RE = re.compile(
    r"(?:<\|start\|>\s*assistant)?<\|channel\|>(?P<channel>[^<]*?)"
    r"(?:<\|constrain\|>[^<]*?)?<\|message\|>(?P<text>.*?)"
    r"(?P<closer><\|end\|>|<\|return\|>|<\|call\|>|$)",
    re.DOTALL,
)


# ---------------------------------------------------------------------------------------------
# Token ids and anchors
# ---------------------------------------------------------------------------------------------


class _Tokenizer(Protocol):
    def convert_tokens_to_ids(self, tokens): ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class HarmonyTokenIds:
    """The token ids that harmony's structure is made of, for one tokenizer.

    Attributes:
        start, end, message, channel, return_, call, constrain: ids of the special tokens.
        assistant: id of the role word ``assistant`` (a single token in every supported
            tokenizer; :meth:`from_tokenizer` checks).
        user: ids of the role word ``user``.
        analysis: ids of the channel name ``analysis``.
        final: ids of the channel name ``final``.
    """

    start: int
    end: int
    message: int
    channel: int
    return_: int
    call: int
    constrain: int
    assistant: int
    user: tuple[int, ...]
    analysis: tuple[int, ...]
    final: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: _Tokenizer) -> HarmonyTokenIds:
        """Read the ids from a Hugging Face tokenizer (bundled or GPT-OSS's own)."""
        specials: dict[str, int] = {}
        unk = getattr(tokenizer, "unk_token_id", None)
        for token in SPECIAL_TOKENS:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == unk:
                raise ValueError(
                    f"tokenizer has no harmony special token {token}; it cannot render harmony"
                )
            specials[token] = int(token_id)

        def words(word: str) -> tuple[int, ...]:
            ids = tuple(int(i) for i in tokenizer.encode(word, add_special_tokens=False))
            if not ids or (unk is not None and unk in ids):
                raise ValueError(f"tokenizer cannot encode the harmony word {word!r}")
            return ids

        assistant = words("assistant")
        if len(assistant) != 1:
            raise ValueError(
                f"'assistant' encodes to {len(assistant)} tokens {assistant}; anchors need one"
            )
        return cls(
            start=specials[START],
            end=specials[END],
            message=specials[MESSAGE],
            channel=specials[CHANNEL],
            return_=specials[RETURN],
            call=specials[CALL],
            constrain=specials[CONSTRAIN],
            assistant=assistant[0],
            user=words("user"),
            analysis=words("analysis"),
            final=words("final"),
        )

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end generation (``<|return|>``, ``<|call|>``)."""
        return (self.return_, self.call)


@dataclass(frozen=True)
class AnchorPositions:
    """Absolute positions (indices into the token ids) of the two anchors.

    Attributes:
        pre_reasoning: positions of ``<|end|> <|start|> assistant`` closing the prompt.
        post_reasoning: positions of ``<|end|> <|start|> assistant`` closing the reasoning,
            before ``<|channel|>final``; None when the ids hold no final message (prompt only,
            or reasoning cut off).
    """

    pre_reasoning: tuple[int, int, int]
    post_reasoning: tuple[int, int, int] | None


def _matches(ids: Sequence[int], at: int, pattern: Sequence[int]) -> bool:
    return at >= 0 and tuple(ids[at : at + len(pattern)]) == tuple(pattern)


def find_anchors(token_ids: Sequence[int], special_ids: HarmonyTokenIds) -> AnchorPositions:
    """Locate the pre- and post-reasoning anchors in a prompt (+ completion) token sequence.

    The pre-reasoning anchor is the first ``<|end|> <|start|> assistant`` after the last user
    message that is followed by the end of the ids or by ``<|channel|>``; the post-reasoning
    anchor is the first later ``<|end|> <|start|> assistant`` followed by
    ``<|channel|>final``. ``token_ids``: ``(seq,)``, without padding. ``ValueError`` when no
    pre-reasoning anchor exists (the ids were not rendered with :func:`render_prompt`).
    """
    ids = [int(i) for i in token_ids]
    s = special_ids
    triple = (s.end, s.start, s.assistant)
    user_header = (s.start, *s.user)
    last_user = range(len(ids) - len(user_header), -1, -1)
    search_from = next((i for i in last_user if _matches(ids, i, user_header)), 0)
    pre = next(
        (
            i
            for i in range(search_from, len(ids) - 2)
            if _matches(ids, i, triple) and (i + 3 == len(ids) or ids[i + 3] == s.channel)
        ),
        None,
    )
    if pre is None:
        raise ValueError(
            "no pre-reasoning anchor: the ids hold no '<|end|><|start|>assistant' closing the "
            "prompt (followed by the end of the ids or by '<|channel|>'); render prompts with "
            "goalprobe.agents.harmony.render_prompt"
        )
    final_header = (*triple, s.channel, *s.final)
    later = range(pre + 3, len(ids) - 2)
    post = next((i for i in later if _matches(ids, i, final_header)), None)
    return AnchorPositions(
        pre_reasoning=(pre, pre + 1, pre + 2),
        post_reasoning=None if post is None else (post, post + 1, post + 2),
    )


@dataclass(frozen=True)
class ReasoningSpan:
    """The content tokens of a step's analysis message: ``ids[start:stop]``.

    Attributes:
        start: the first token after the analysis message's ``<|message|>``.
        stop: the post-reasoning anchor's ``<|end|>`` (exclusive end of the reasoning).
    """

    start: int
    stop: int

    @property
    def length(self) -> int:
        """Reasoning tokens (0 for an empty analysis message)."""
        return self.stop - self.start


def reasoning_span(token_ids: Sequence[int], special_ids: HarmonyTokenIds) -> ReasoningSpan | None:
    """Where the reasoning of a prompt + completion lies: the analysis message that opens the
    completion (``<|channel|>analysis<|message|>`` right after the pre-reasoning anchor) up to
    the post-reasoning anchor. None when the ids hold no complete analysis message (prompt
    only, reasoning cut off, or a completion that opens another channel first); ``ValueError``
    as :func:`find_anchors`.
    """
    ids = [int(i) for i in token_ids]
    s = special_ids
    anchors = find_anchors(ids, s)
    if anchors.post_reasoning is None:
        return None
    header = (s.channel, *s.analysis, s.message)
    at = anchors.pre_reasoning[2] + 1
    if not _matches(ids, at, header):
        return None
    start = at + len(header)
    stop = anchors.post_reasoning[0]
    return ReasoningSpan(start, stop) if stop >= start else None


def reasoning_offsets(length: int, every: int) -> tuple[int, ...]:
    """Offsets (from the reasoning's first token) read along a reasoning of ``length`` tokens:
    every ``every``-th token (offsets ``every - 1, 2 every - 1, ...``) and the last one
    (``length - 1``); empty for an empty reasoning."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    if length <= 0:
        return ()
    return tuple(sorted({*range(every - 1, length, every), length - 1}))


_SERVED_MESSAGE = re.compile(
    r"<\|start\|>(?P<header>[^<]*?)<\|message\|>(?P<content>.*?)<\|end\|>", re.DOTALL
)
_REASONING = re.compile(r"^Reasoning: (low|medium|high)$", re.MULTILINE)
_DATE = re.compile(r"^Current date: (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class ServedHarmony:
    """A server's harmony rendering, for one tokenizer.

    Attributes:
        head: the text of the messages the server puts before the request's (system message,
            empty developer message), verbatim, its ``Reasoning:`` line included.
        developer_header: whether the server opens a developer message with ``# Instructions``.
    """

    tokenizer: Any
    head: str
    developer_header: bool

    @classmethod
    def from_prompt_ids(
        cls, tokenizer, prompt_ids: Sequence[int], request_messages: int = 2
    ) -> ServedHarmony:
        """Read the rendering off the ids a server rendered for a conversation of
        ``request_messages`` messages (a developer message, then the user's: every agent step).

        Raises:
            ValueError: the ids do not tokenize back from their text, or are not a harmony
                prompt of that many request messages ending in ``<|start|>assistant``, or hold
                no system message.
        """
        ids = [int(i) for i in prompt_ids]
        text = tokenizer.decode(ids, skip_special_tokens=False)
        if encode_text(tokenizer, text) != ids:
            raise ValueError("the served prompt's text does not tokenize back to its ids")
        found = list(_SERVED_MESSAGE.finditer(text))
        if not found or text[found[-1].end() :] != f"{START}assistant":
            raise ValueError("the served prompt does not end in '<|start|>assistant'")
        if len(found) < request_messages + 1 or found[0]["header"] != "system":
            raise ValueError(
                f"the served prompt holds {len(found)} message(s), not a system message and "
                f"{request_messages} request message(s)"
            )
        first = found[len(found) - request_messages]
        developer = [
            m for m in found[len(found) - request_messages :] if m["header"] == "developer"
        ]
        header = bool(developer) and developer[0]["content"].startswith(INSTRUCTIONS_HEADER)
        return cls(tokenizer, text[: first.start()], header)

    @property
    def date(self) -> str | None:
        """The ``Current date:`` the served system message carries (None: none)."""
        match = _DATE.search(self.head)
        return None if match is None else match.group(1)

    def render_prompt(
        self, messages: Sequence[Message], reasoning_effort: ReasoningEffort = "low"
    ) -> str:
        """The prompt text the server renders for ``messages`` (developer/user messages)."""
        _check_effort(reasoning_effort)
        head = _REASONING.sub(f"Reasoning: {reasoning_effort}", self.head, count=1)
        parts = [head]
        for message in messages:
            if message.role == "system":
                raise ValueError("a served rendering brings its own system message")
            parts.append(render_message(message, self.developer_header))
        parts.append(f"{START}assistant")
        return "".join(parts)

    def encode_prompt(
        self, messages: Sequence[Message], reasoning_effort: ReasoningEffort = "low"
    ) -> list[int]:
        """``(prompt_len,)`` ids of :meth:`render_prompt` (the ids the server would return)."""
        return encode_text(self.tokenizer, self.render_prompt(messages, reasoning_effort))

    def describe(self) -> dict[str, Any]:
        """JSON facts (recorded with the prompts it renders; part of a prompt-only run id)."""
        return {
            "rendering": "served",
            "date": self.date,
            "developer_header": self.developer_header,
            "head_sha256": hashlib.sha256(self.head.encode()).hexdigest()[:16],
        }


def served_harmony_in(tokenizer, path: str | Path) -> ServedHarmony | None:
    """The rendering of the first served prompt (a step with ``token_ids_source == "model"``)
    of a rollout trajectory file; None for a prompt-only file or one without such a step
    (``ValueError`` when the served prompt is not a harmony prompt of one agent step).
    """
    from goalprobe.agents.prompt_states import is_prompt_only
    from goalprobe.agents.trajectories import read_run_header, read_trajectories

    if is_prompt_only(read_run_header(path)):
        return None
    for episode in read_trajectories(path):
        for step in episode.steps:
            if step.token_ids_source == "model" and step.prompt_token_ids:
                return ServedHarmony.from_prompt_ids(tokenizer, step.prompt_token_ids)
    return None
