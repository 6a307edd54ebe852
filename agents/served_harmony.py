"""The harmony prompt as a chat-completions server renders it, adopted for local rendering.

vLLM renders gpt-oss prompts itself (openai-harmony): its system message has a ``Current
date:`` line (from the server's clock, unless ``VLLM_SYSTEM_START_DATE`` is set) and its own
channel list, the request's developer message is plain text (no ``# Instructions`` header), and
older versions put an empty developer message first. Rollouts replay the ids the server
returned; a prompt goalprobe renders itself (the probing set, every prompt-only state) must
be rendered the same way, or probes are trained on one prompt and read on another.

:meth:`ServedHarmony.from_prompt_ids` reads that rendering off one served prompt (the ids the
server returned for a known conversation, or any rollout step's ``prompt_token_ids``): the
messages before the request's (the system message, with the server's date, and any empty
developer message) are kept verbatim, and whether the developer message carries harmony's
``# Instructions`` header is detected. :meth:`ServedHarmony.encode_prompt` then renders any
conversation as that server would, token for token. The date is the one the served prompt
carried, recorded in :meth:`ServedHarmony.describe` (never the local clock).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goalprobe.agents.harmony import (
    INSTRUCTIONS_HEADER,
    START,
    Message,
    ReasoningEffort,
    _check_effort,
    encode_text,
    render_message,
)

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
