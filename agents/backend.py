"""The one interface every rollout backend implements (local transformers, OpenAI-compatible server).

A backend turns a batch of conversations (lists of :class:`~goalprobe.agents.harmony.Message`)
into one :class:`Completion` each, sampling with a :class:`SamplingConfig`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from goalprobe.agents.harmony import REASONING_EFFORTS, Message, ReasoningEffort

if TYPE_CHECKING:
    from goalprobe.agents.chat_format import ChatFormat

FinishReason = Literal["stop", "length"]
TokenIdsSource = Literal["model", "retokenized"]


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled (defaults: the study's appendix G.1 settings).

    Attributes:
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus-sampling mass (1.0 keeps every token).
        max_new_tokens: most tokens generated per completion (reasoning + answer).
        reasoning_effort: harmony's ``Reasoning:`` level, ``"low"``, ``"medium"`` or ``"high"``
            (a think-tag template sees it only where it reads ``reasoning_effort``).
        seed: seed of the sampler; the same seed, batch and model give the same completions.
            None draws fresh randomness.
    """

    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 10_000
    reasoning_effort: ReasoningEffort = "low"
    seed: int | None = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(
                f"reasoning_effort must be one of {REASONING_EFFORTS}, "
                f"got {self.reasoning_effort!r}"
            )


@dataclass(frozen=True)
class Completion:
    """One sampled completion.

    Attributes:
        prompt_token_ids: ``(prompt_len,)`` ids of the prompt rendered in the model's chat
            format (:mod:`goalprobe.agents.chat_format`), unpadded.
        generated_token_ids: ``(gen_len,)`` ids the model generated after the prompt (up to and
            including the stop token when it stopped), unpadded.
        text: the generated text, special tokens included (decoded ``generated_token_ids``).
        reasoning: the reasoning (harmony's analysis channel, the text inside ``<think>``; see
            the format's ``split_completion``).
        final: the answer to parse (harmony's final channel, the text after ``</think>``).
        token_ids_source: ``"model"`` when the ids are the ones the model sampled,
            ``"retokenized"`` when a server returned text that was tokenised again locally.
        finish_reason: ``"stop"`` (a stop token ended it) or ``"length"`` (token limit).
        well_formed: whether the completion was laid out as its format writes one (harmony:
            one analysis then one final message; think-tag: reasoning, ``</think>``, answer,
            stop token).
    """

    prompt_token_ids: list[int]
    generated_token_ids: list[int]
    text: str
    reasoning: str
    final: str
    token_ids_source: TokenIdsSource
    finish_reason: FinishReason
    well_formed: bool = True


class BatchGenerationError(RuntimeError):
    """Some conversations of a batch failed while others were answered.

    Raised by backends that answer each conversation independently (a server: one request each),
    so that a caller can keep the completions it got and try the failed conversations again.

    Attributes:
        completions: one entry per conversation, None where it failed.
        errors: one entry per conversation, the reason where it failed, else None.
    """

    def __init__(
        self, message: str, completions: Sequence[Completion | None], errors: Sequence[str | None]
    ) -> None:
        super().__init__(message)
        if len(completions) != len(errors):
            raise ValueError(f"{len(completions)} completions but {len(errors)} errors")
        self.completions = list(completions)
        self.errors = list(errors)


@runtime_checkable
class PromptEncoder(Protocol):
    """A backend that can say, before generating, how long a prompt is and how long it may be
    (``goalprobe serve`` checks limits with it before any compute)."""

    @property
    def context_length(self) -> int:
        """Most positions (prompt + generated tokens) the model handles."""
        ...

    def encode_prompt(
        self, messages: Sequence[Message], reasoning_effort: ReasoningEffort = "low"
    ) -> list[int]:
        """The token ids of one conversation's prompt."""
        ...


@runtime_checkable
class Backend(Protocol):
    """Anything that samples harmony completions for a batch of conversations."""

    def generate(
        self, batch: Sequence[list[Message]], sampling: SamplingConfig
    ) -> list[Completion]:
        """One :class:`Completion` per conversation of ``batch``, in order."""
        ...


def accepts_seeds(backend: Backend) -> bool:
    """Whether ``backend.generate`` takes per-conversation ``seeds=`` (row ``i`` seeded by
    ``seeds[i]``; what the rollout loop and the server check before passing ``seeds=``)."""
    try:
        return "seeds" in inspect.signature(backend.generate).parameters
    except (TypeError, ValueError):
        return False


def generate_seeded(
    backend: Backend,
    batch: Sequence[list[Message]],
    sampling: SamplingConfig,
    seeds: Sequence[int | None] | None,
    call_seed: int | None,
) -> list[Completion]:
    """``backend.generate`` of ``batch`` with one seed per conversation when it takes them
    (:func:`accepts_seeds`; ``seeds`` None: it derives them), else with ``call_seed`` for the
    whole call."""
    if accepts_seeds(backend):
        seeded: Any = backend
        row_seeds = None if seeds is None else list(seeds)
        return seeded.generate(batch, replace(sampling, seed=None), seeds=row_seeds)
    return backend.generate(batch, replace(sampling, seed=call_seed))


def check_seeds(seeds: Sequence[int | None] | None, n_conversations: int) -> None:
    """``ValueError`` unless ``seeds`` is None or holds one seed per conversation."""
    if seeds is not None and len(seeds) != n_conversations:
        raise ValueError(f"got {len(seeds)} seeds for {n_conversations} conversations")


class ChatFormatBackend:
    """What a backend that renders prompts in its own ``chat_format`` and decodes completions
    with ``tokenizer`` shares (local model, oracle)."""

    chat_format: ChatFormat
    tokenizer: Any

    def encode_prompt(
        self, messages: Sequence[Message], reasoning_effort: ReasoningEffort = "low"
    ) -> list[int]:
        """``(prompt_len,)`` token ids of one conversation's prompt in the chat format."""
        return self.chat_format.encode_prompt(messages, reasoning_effort)

    def _completion(
        self, prompt: Sequence[int], ids: Sequence[int], text: str, finish: FinishReason
    ) -> Completion:
        """The completion of ``prompt`` the model generated as ``ids`` (decoded: ``text``),
        split by the chat format."""
        split = self.chat_format.split_completion(text)
        return Completion(
            prompt_token_ids=list(prompt),
            generated_token_ids=list(ids),
            text=text,
            reasoning=split.reasoning,
            final=split.final,
            token_ids_source="model",
            finish_reason=finish,
            well_formed=split.well_formed,
        )


def run_sync(coroutine):
    """Run ``coroutine`` to its end and return its result (on a worker thread when called from
    inside an event loop, such as a notebook's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
