"""A rollout backend for any OpenAI-compatible chat-completions endpoint (vLLM, hosted providers,
``goalprobe serve``): one concurrent ``POST {base_url}/chat/completions`` per conversation, with
timeouts and backoff (:class:`ServerConfig`); :attr:`ServerBackend.stats` counts requests,
retries and failures.

**Token ids.** When the response carries them (``goalprobe serve``; vLLM >= 0.10.2 asked with
``return_token_ids``) the completion is ``token_ids_source="model"``: later stages replay the
ids the server rendered (vLLM renders harmony itself, with a ``Current date:`` line), and
reasoning and answer are read from the generated ids. vLLM 0.10.2-0.11.0 returns only the prompt
ids for gpt-oss (vllm-project/vllm#28246): the generated text is then re-tokenised. Otherwise
``require_token_ids`` refuses the response (:class:`ServerTokenIdsError`); without it prompt and
text are rendered and tokenised by goalprobe, marked ``"retokenized"`` and counted with a
warning (faithful only when the server renders as goalprobe does, which vLLM does not).

**Text.** Without ids the answer is ``message.content`` and the reasoning ``message.reasoning``
or ``message.reasoning_content``; a response finished with ``stop`` with reasoning but no
content (older vLLM's harmony parser) is read as an answer without reasoning. Think-tag models
(vLLM with ``--reasoning-parser``) get the instructions as the system message and
``chat_template_kwargs: {"enable_thinking": true}``. The API key is never logged, nor in
``repr``/``describe()``, and is removed from any quoted server message.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast
from urllib.parse import urlsplit, urlunsplit

import httpx
from goalprobe.agents.backend import (
    BatchGenerationError,
    Completion,
    FinishReason,
    SamplingConfig,
    TokenIdsSource,
    check_seeds,
    run_sync,
)
from goalprobe.agents.chat_format import ChatFormat, chat_format_for, with_chat_format
from goalprobe.agents.harmony import (
    CHANNEL,
    MESSAGE,
    RETURN,
    SPECIAL_TOKENS,
    Message,
    render_completion,
)

log = logging.getLogger(__name__)

RETRY_STATUSES: frozenset[int] = frozenset({408, 409, 429, 500, 502, 503, 504})
"""HTTP statuses retried with backoff (everything else >= 400 fails at once)."""


class ServerError(RuntimeError):
    """The endpoint refused a request or kept failing after every retry."""


class ServerBatchError(ServerError, BatchGenerationError):
    """Some requests of a batch failed (after their retries); the others' completions are kept
    in ``completions`` (None where a request failed, its reason in ``errors``)."""


class ServerTokenIdsError(ServerError):
    """The server answered without the token ids the backend needs (``require_token_ids``, or
    no tokenizer to rebuild them). Sending the request again cannot help: it stops the run."""


@dataclass
class RequestStats:
    """What the backend's requests went through (counts since the backend was built)."""

    requests: int = 0
    """Requests answered successfully."""

    retries: int = 0
    """Retries after a retryable failure."""

    failures: int = 0
    """Requests given up (refused, or still failing after every retry)."""

    problems: dict[str, int] = field(default_factory=dict)
    """Retryable failures by kind (``HTTP 503``, ``ReadTimeout``, ``malformed JSON``, ...)."""

    retokenized: int = 0
    """Completions whose ids were rebuilt locally because the server returned none."""

    by_endpoint: dict[str, int] = field(default_factory=dict)
    """Requests answered, by endpoint (public URL)."""


class _Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class ServerConfig:
    """Where and how to reach an OpenAI-compatible endpoint."""

    base_url: str
    """The API root, e.g. ``http://127.0.0.1:8000/v1`` (requests go to ``{base_url}/chat/completions``)."""

    model: str
    """The model name sent with every request (e.g. ``openai/gpt-oss-20b``)."""

    more_base_urls: tuple[str, ...] = ()
    """Further endpoints serving the same model (e.g. one vLLM per GPU); each request goes to
    the endpoint with the fewest requests in flight (ties: the first listed)."""

    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the API key; None (or an unset variable) sends no key."""

    max_concurrency: int = 128
    """Requests in flight at once per endpoint (128 keeps a GPT-OSS-20B vLLM on one GPU busy
    without requests queueing long enough to reach ``timeout_s``)."""

    timeout_s: float = 600.0
    """Per-request timeout (connect, read, write) in seconds."""

    max_retries: int = 5
    """Retries of a request after a retryable failure (0: try once)."""

    backoff_s: float = 1.0
    """First backoff delay; doubles after every retry (with jitter)."""

    backoff_max_s: float = 60.0
    """Longest backoff delay (also caps a server's ``Retry-After``)."""

    request_token_ids: bool = False
    """Send ``return_token_ids: true`` (vLLM's extension returning prompt and generated ids,
    vLLM >= 0.10.2). Leave off for servers that reject unknown fields (OpenAI's own API)."""

    require_token_ids: bool = False
    """Refuse a response without prompt and generated token ids (:class:`ServerTokenIdsError`)
    instead of re-tokenising its text: for runs whose activations must be of the prompts the
    model read."""

    developer_role: str = "developer"
    """Role the instructions (harmony ``developer`` message) are sent as; ``"system"`` for
    endpoints that do not know ``developer``."""

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.developer_role not in ("developer", "system"):
            raise ValueError(
                f"developer_role must be 'developer' or 'system', got {self.developer_role!r}"
            )
        for url in self.base_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"base_url must start with http:// or https://, got {url!r}")
        if len(set(self.base_urls)) != len(self.base_urls):
            raise ValueError("base URLs repeat")

    @property
    def base_urls(self) -> tuple[str, ...]:
        """Every endpoint, ``base_url`` first."""
        return (self.base_url, *self.more_base_urls)


class ServerBackend:
    """:class:`~goalprobe.agents.backend.Backend` over an OpenAI-compatible endpoint.

    ``tokenizer`` (the model's) reads reasoning and answer from returned ids and rebuilds ids
    when the server returns none (without one such a response raises :class:`ServerError`);
    ``chat_format`` None detects it from ``tokenizer`` (harmony without one).
    """

    def __init__(
        self,
        config: ServerConfig,
        tokenizer: _Tokenizer | None = None,
        chat_format: ChatFormat | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        if chat_format is None and tokenizer is not None:
            chat_format = chat_format_for(tokenizer)
        self.chat_format = chat_format
        """The model's chat format (None: harmony, as the server renders it)."""
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self._api_key = key or None
        self._rng = random.Random()
        self.stats = RequestStats()
        self._in_flight = [0] * len(config.base_urls)
        # the open session (client, concurrency limit) of the running task's context: each
        # event loop (a thread calling generate() inside a notebook's loop) has its own
        self._session: contextvars.ContextVar = contextvars.ContextVar(
            f"server-session-{id(self)}", default=None
        )

    def __repr__(self) -> str:
        return (
            f"ServerBackend(base_url={', '.join(map(_public_url, self.config.base_urls))!r}, "
            f"model={self.config.model!r}, api_key={'<set>' if self._api_key else None})"
        )

    def describe(self) -> dict[str, Any]:
        """What identifies this backend in a trajectory file (no URL credentials, no key), with
        its chat format unless harmony (:func:`~goalprobe.agents.chat_format.with_chat_format`)."""
        return with_chat_format(
            {"class": "ServerBackend", "model": self.config.model}, self.chat_format
        )

    def server_versions(self, timeout_s: float = 10.0) -> dict[str, str | None]:
        """Each endpoint's server version (for provenance): ``GET <root>/version`` beside the
        ``/v1`` base URL, which vLLM answers ``{"version": "0.11.1"}`` and ``goalprobe serve``
        ``{"version": ..., "server": "goalprobe"}`` (recorded as ``"goalprobe <version>"``).
        None for an endpoint that did not say (no such route, down, not JSON): a warning is
        logged and the version is recorded as unknown, never guessed."""
        versions: dict[str, str | None] = {}
        with httpx.Client(timeout=timeout_s, headers=self._headers()) as client:
            for base_url in self.config.base_urls:
                url = _version_url(base_url)
                try:
                    answer = client.get(url)
                    answer.raise_for_status()
                    body = answer.json()
                    version = body["version"]
                    if not isinstance(version, str) or not version:
                        raise ValueError(f"no version string in {answer.text[:200]!r}")
                except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
                    reason = self._redact(str(err))
                    log.warning("%s: no server version (%s)", _public_url(url), reason)
                    versions[_public_url(base_url)] = None
                    continue
                name = body.get("server")
                versions[_public_url(base_url)] = f"{name} {version}" if name else version
        return versions

    # -- Backend ------------------------------------------------------------------------------

    def generate(
        self,
        batch: Sequence[list[Message]],
        sampling: SamplingConfig,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """One completion per conversation, requested concurrently (``sampling`` passed through,
        ``max_new_tokens`` as ``max_tokens``; ``seeds``: one per conversation, overriding
        ``sampling.seed``); blocking."""
        check_seeds(seeds, len(batch))
        row_seeds = [sampling.seed] * len(batch) if seeds is None else [int(s) for s in seeds]

        async def complete_all() -> list:
            async with self.session():
                requests = [
                    self._complete(m, sampling, s) for m, s in zip(batch, row_seeds, strict=True)
                ]
                return await asyncio.gather(*requests, return_exceptions=True)

        outcomes = run_sync(complete_all())
        for outcome in outcomes:  # a bug or a missing-ids answer is raised as it is
            if isinstance(outcome, BaseException) and (
                not isinstance(outcome, ServerError) or isinstance(outcome, ServerTokenIdsError)
            ):
                raise outcome
        failed = [str(o) for o in outcomes if isinstance(o, ServerError)]
        if failed:
            message = failed[0]
            if len(batch) > 1:
                message = f"{len(failed)} of {len(batch)} requests failed; first: {message}"
            raise ServerBatchError(
                message,
                [o if isinstance(o, Completion) else None for o in outcomes],
                [str(o) if isinstance(o, ServerError) else None for o in outcomes],
            )
        return [o for o in outcomes if isinstance(o, Completion)]  # every other one raised

    @contextlib.asynccontextmanager
    async def session(self):
        """Keep one HTTP client (its connection pool and concurrency limit) open for every
        :meth:`acomplete` inside the block; nested blocks share the outer one."""
        if self._session.get() is not None:
            yield self
            return
        in_flight = self.config.max_concurrency * len(self._in_flight)
        limits = httpx.Limits(max_connections=in_flight)
        timeout = httpx.Timeout(self.config.timeout_s)
        async with httpx.AsyncClient(
            timeout=timeout, headers=self._headers(), limits=limits
        ) as client:
            token = self._session.set((client, asyncio.Semaphore(in_flight)))
            try:
                yield self
            finally:
                self._session.reset(token)

    async def acomplete(
        self, messages: list[Message], sampling: SamplingConfig, seed: int | None
    ) -> Completion:
        """One conversation's completion (inside :meth:`session`): what a per-episode scheduler
        calls. A request that failed after its retries raises :class:`ServerBatchError` (a
        :class:`~goalprobe.agents.backend.BatchGenerationError` of one conversation), a
        response without the ids the backend needs :class:`ServerTokenIdsError`."""
        try:
            return await self._complete(messages, sampling, seed)
        except ServerTokenIdsError:
            raise
        except ServerError as err:
            raise ServerBatchError(str(err), [None], [str(err)]) from err

    async def _complete(
        self, messages: list[Message], sampling: SamplingConfig, seed: int | None
    ) -> Completion:
        session = self._session.get()
        if session is None:
            raise RuntimeError("ServerBackend requests run inside `async with backend.session()`")
        client, semaphore = session
        async with semaphore:
            body = await self._post(client, self.request_body(messages, sampling, seed))
        return self._completion(messages, sampling, body)

    # -- requests -----------------------------------------------------------------------------

    def request_body(
        self, messages: Sequence[Message], sampling: SamplingConfig, seed: int | None
    ) -> dict[str, Any]:
        """The JSON body of one chat-completions request."""
        fmt = self._think_tag
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": (
                [self._message(m) for m in messages] if fmt is None else fmt.chat_messages(messages)
            ),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "reasoning_effort": sampling.reasoning_effort,
            "n": 1,
        }
        if fmt is not None:  # the template's own switches (vLLM's chat_template_kwargs)
            kwargs: dict[str, Any] = {"enable_thinking": True}
            if fmt.effort_keyword is None:
                del body["reasoning_effort"]
            else:
                kwargs[fmt.effort_keyword] = sampling.reasoning_effort
            body["chat_template_kwargs"] = kwargs
        if seed is not None:
            body["seed"] = int(seed)
        if self.config.request_token_ids:
            body["return_token_ids"] = True
        return body

    @property
    def _think_tag(self) -> Any:
        """The think-tag chat format, or None (harmony)."""
        fmt = self.chat_format
        return None if fmt is None or fmt.name == "harmony" else fmt

    def _message(self, message: Message) -> dict[str, str]:
        role = self.config.developer_role if message.role == "developer" else message.role
        return {"role": role, "content": message.content}

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "<redacted>") if self._api_key else text

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        attempts = self.config.max_retries + 1
        for attempt in range(attempts):
            retry_after: float | None = None
            # the least-loaded endpoint (no await between the choice and the count: atomic)
            endpoint = min(range(len(self._in_flight)), key=self._in_flight.__getitem__)
            url = self.config.base_urls[endpoint].rstrip("/") + "/chat/completions"
            public = _public_url(url)
            self._in_flight[endpoint] += 1
            try:
                response = await client.post(url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as err:
                kind = type(err).__name__
                problem = f"{kind}: {self._redact(str(err)) or 'no detail'}"
            else:
                if response.status_code < 400:
                    try:
                        payload = response.json()
                    except ValueError:
                        payload = None
                    if isinstance(payload, dict):
                        self.stats.requests += 1
                        where = _public_url(self.config.base_urls[endpoint])
                        self.stats.by_endpoint[where] = self.stats.by_endpoint.get(where, 0) + 1
                        return payload
                    # a proxy cut short or garbled the answer: worth another attempt
                    kind = "malformed JSON"
                    problem = (
                        f"answered {response.status_code} with a body that is not a JSON "
                        f"object: {self._redact(response.text[:200])!r}"
                    )
                else:
                    message = self._redact(_error_message(response))
                    kind = f"HTTP {response.status_code}"
                    problem = f"HTTP {response.status_code}: {message}"
                    if response.status_code not in RETRY_STATUSES:
                        self.stats.failures += 1
                        raise ServerError(f"{public} refused the request ({problem})")
                    retry_after = _retry_after(response)
            finally:
                self._in_flight[endpoint] -= 1
            self.stats.problems[kind] = self.stats.problems.get(kind, 0) + 1
            if attempt + 1 == attempts:
                self.stats.failures += 1
                raise ServerError(
                    f"{public}: giving up after {attempts} attempt(s); last: {problem}"
                )
            self.stats.retries += 1
            delay = min(self.config.backoff_max_s, self.config.backoff_s * 2**attempt)
            delay *= 0.5 + 0.5 * self._rng.random()
            if retry_after is not None:
                delay = min(self.config.backoff_max_s, max(delay, retry_after))
            log.warning(
                "%s: %s; retry %d/%d in %.1f s",
                public,
                problem,
                attempt + 1,
                self.config.max_retries,
                delay,
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _missing_ids_message(self, where: str, has_prompt_ids: bool = False) -> str:
        if has_prompt_ids:
            ask = (
                "the server returned prompt_token_ids but no generated token_ids (vLLM's "
                "gpt-oss chat completions before the fix of vllm-project/vllm#28246, 0.11.1): "
                "upgrade the server"
            )
        elif self.config.request_token_ids:
            ask = (
                "the server returned no prompt_token_ids/token_ids although the request asked "
                "for them (return_token_ids); vLLM returns them from 0.10.2 on: upgrade the "
                "server"
            )
        else:
            ask = (
                "the server returned no token ids; for vLLM (>= 0.10.2) ask for them "
                "(--server-token-ids)"
            )
        if self.config.require_token_ids:
            return f"{where}: {ask} (this run requires the ids the model read)"
        return f"{where}: {ask}, or give the model's tokenizer (--tokenizer) to re-tokenise"

    # -- responses ----------------------------------------------------------------------------

    def _completion(
        self, messages: Sequence[Message], sampling: SamplingConfig, body: dict[str, Any]
    ) -> Completion:
        where = f"{_public_url(self.config.base_url)} response"
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ServerError(f"{where}: no choices")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ServerError(f"{where}: choice has no message")
        final = _text(message.get("content"))
        reasoning = _text(message.get("reasoning")) or _text(message.get("reasoning_content"))
        finish_reason: FinishReason = (
            "length" if choice.get("finish_reason") == "length" else "stop"
        )
        fmt = self._think_tag
        if fmt is not None:  # the reasoning parser keeps the template's delimiter newlines
            reasoning, final = reasoning.strip("\n"), final.lstrip("\n")
        elif finish_reason == "stop" and not final and reasoning:
            # older vLLM: an answer without an analysis message lands in the reasoning field
            final, reasoning = reasoning, ""

        prompt_ids = _int_list(body.get("prompt_token_ids"))
        generated_ids = _int_list(choice.get("token_ids"))
        own_format = cast(ChatFormat, self.chat_format)  # set whenever a tokenizer is
        source: TokenIdsSource
        if prompt_ids is not None and generated_ids is not None:
            source = "model"
            if self.tokenizer is not None:
                # the ids are what the model generated: read the channels from them
                text = self.tokenizer.decode(generated_ids, skip_special_tokens=False)
                reasoning, final, well_formed = own_format.split_completion(text)
            else:
                text = _harmony_text(reasoning, final, finish_reason)
                well_formed = finish_reason == "stop" and bool(final)
        else:
            if self.config.require_token_ids or self.tokenizer is None:
                raise ServerTokenIdsError(self._missing_ids_message(where, prompt_ids is not None))
            source = "retokenized"
            if fmt is None:
                text = _harmony_text(reasoning, final, finish_reason)
            else:
                text = _think_tag_text(fmt, reasoning, final, finish_reason)
            if prompt_ids is None:  # else keep the prompt the server rendered
                prompt_ids = own_format.encode_prompt(list(messages), sampling.reasoning_effort)
            generated_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            well_formed = finish_reason == "stop" and bool(final) and bool(reasoning)
            self.stats.retokenized += 1
            if self.stats.retokenized == 1:
                log.warning(
                    "%s returned no token ids: re-tokenising its text with goalprobe's %s "
                    "rendering (the prompt ids may differ from what the model read; counted "
                    "in the run's retokenized steps)",
                    where,
                    "harmony" if fmt is None else fmt.name,
                )
        return Completion(
            prompt_token_ids=[int(i) for i in prompt_ids],
            generated_token_ids=[int(i) for i in generated_ids],
            text=text,
            reasoning=reasoning,
            final=final,
            token_ids_source=source,
            finish_reason=finish_reason,
            well_formed=well_formed,
        )


def _harmony_text(reasoning: str, final: str, finish_reason: str) -> str:
    """The harmony text of a completion given as reasoning + final (cut off if it was; an
    answer without reasoning is a lone final message)."""
    if finish_reason == "length" and not final:
        return f"{CHANNEL}analysis{MESSAGE}{reasoning}"
    if not reasoning and final and not any(t in final for t in SPECIAL_TOKENS):
        closer = RETURN if finish_reason == "stop" else ""
        return f"{CHANNEL}final{MESSAGE}{final}{closer}"
    try:
        return render_completion(reasoning, final)
    except ValueError as err:
        raise ServerError(f"cannot re-render the server's text in harmony: {err}") from err


def _think_tag_text(fmt: Any, reasoning: str, final: str, finish_reason: str) -> str:
    """The think-tag completion text of a reasoning + answer (cut off inside the reasoning:
    the open reasoning only)."""
    if finish_reason == "length" and not final:
        return f"{fmt.reasoning_open}{reasoning}"
    try:
        text = fmt.render_completion(reasoning, final)
    except ValueError as err:
        raise ServerError(f"cannot re-render the server's text in {fmt.name}: {err}") from err
    return text if finish_reason == "stop" else text.removesuffix(fmt.stop_token)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: [{"type": "text", "text": ...}]
        return "".join(p.get("text", "") for p in value if isinstance(p, dict))
    return str(value)


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return value
    return None


def _error_message(response: httpx.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload))
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:300]
        return str(error)[:300]
    return str(payload)[:300]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _version_url(base_url: str) -> str:
    """``<root>/version`` for an endpoint's ``.../v1`` base URL."""
    return f"{base_url.rstrip('/').removesuffix('/v1')}/version"


def _public_url(url: str) -> str:
    """``url`` without user:password and query (which may hold credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
