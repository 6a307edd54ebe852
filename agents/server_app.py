"""An OpenAI-compatible chat-completions server over a local backend (``goalprobe serve``).

Endpoints: ``POST /v1/chat/completions`` (``messages``, ``temperature``, ``top_p``,
``max_tokens``/``max_completion_tokens``, ``seed``, ``n`` = 1, ``reasoning_effort``; the answer's
``content`` is the final channel, ``reasoning_content`` the analysis, and the token ids are
always included as vLLM's ``return_token_ids`` gives them), ``GET /v1/models`` and
``GET /health``.

Bad requests get an OpenAI-style error body with 400 (404 unknown model, 401 API key, 413 body
over ``max_body_bytes``, 503 with ``Retry-After`` when ``max_queue`` requests wait), all checked
before any compute; a prompt over the context is refused and ``max_tokens`` clamped to the
context left.

A request's ``seed`` seeds its own sampler; an unseeded sampled request draws one from the
server's generator (seeded with ``ServeConfig.seed``). A single worker batches requests with the
same sampling settings for up to ``batch_window_s`` (at most ``max_batch_size``); when a batch
fails each request is generated again alone, so one bad request never fails another.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from goalprobe.agents.backend import (
    Backend,
    Completion,
    PromptEncoder,
    SamplingConfig,
    accepts_seeds,
    generate_seeded,
)
from goalprobe.agents.harmony import Message, ReasoningEffort
from pydantic import BaseModel, ConfigDict, Field

from goalprobe.version import package_version

log = logging.getLogger(__name__)


class _TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One request message (OpenAI chat format)."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_TextPart]

    def text(self) -> str:
        """The content as one string."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(BaseModel):
    """The accepted fields of ``POST /v1/chat/completions`` (unknown fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None  # None: drawn from the server's seeded generator
    n: int = Field(default=1, ge=1)
    reasoning_effort: Literal["low", "medium", "high"] = "low"
    stream: bool = False


@dataclass(frozen=True)
class ServeConfig:
    """How the server behaves."""

    model_name: str
    """The model id the server answers to (``GET /v1/models``, the ``model`` request field)."""

    api_key: str | None = None
    """When set, requests must carry ``Authorization: Bearer <api_key>``."""

    default_max_tokens: int = 10_000
    """``max_tokens`` of requests that give none."""

    max_batch_size: int = 16
    """Most requests generated in one ``backend.generate`` call."""

    batch_window_s: float = 0.01
    """How long the worker waits for more requests before generating a batch."""

    seed: int | None = 0
    """Seed of the server's generator, which draws the seed of every sampled request that
    gives none (None: fresh entropy, not reproducible)."""

    max_queue: int = 256
    """Most requests waiting or generating at once; more are answered 503 with Retry-After."""

    max_body_bytes: int = 1 << 20
    """Largest accepted request body (bytes); larger ones are answered 413 unread."""

    retry_after_s: int = 1
    """``Retry-After`` (seconds) of a 503 for a full queue."""

    def __post_init__(self) -> None:
        for name, low in (
            ("max_batch_size", 1),
            ("batch_window_s", 0),
            ("default_max_tokens", 1),
            ("max_queue", 1),
            ("max_body_bytes", 1),
            ("retry_after_s", 0),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")


@dataclass(eq=False)
class _ApiError(Exception):
    """A request answered with an OpenAI-style error body (:func:`_error_body`)."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None


def _error_body(status: int, message: str, param: str | None, code: str | None) -> dict:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _BodyLimit:
    """ASGI middleware answering 413 to a body over ``max_bytes``: at once when
    ``Content-Length`` says so, else as soon as the received bytes pass the limit (the rest is
    never read and the app's own answer is replaced)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send, size: str) -> None:
        message = f"request body {size} is larger than this server accepts ({self.max_bytes} bytes)"
        payload = json.dumps(_error_body(413, message, None, "body_too_large")).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, f"of {int(declared)} bytes")
            return
        received = 0
        too_large = False

        async def limited_receive():
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    too_large = True  # hand the app an empty last chunk; its answer is replaced
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        refused = False

        async def guarded_send(message) -> None:
            nonlocal refused
            if too_large:
                if not refused:
                    refused = True
                    await self._refuse(send, f"of more than {self.max_bytes} bytes")
                return
            await send(message)

        await self.app(scope, limited_receive, guarded_send)


@dataclass
class _Job:
    messages: list[Message]
    sampling: SamplingConfig
    future: asyncio.Future


class QueueFull(RuntimeError):
    """``max_queue`` requests are already waiting or generating."""


class _Batcher:
    """Collects concurrent requests into ``backend.generate`` calls on one worker task."""

    def __init__(self, backend: Backend, config: ServeConfig) -> None:
        self.backend = backend
        self.config = config
        self.per_row_seeds = accepts_seeds(backend)
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.carry: deque[_Job] = deque()
        self.batches = 0
        self.pending = 0
        """Requests submitted and not yet answered."""
        self.rng = random.Random(config.seed)
        """The server's generator: draws the seeds of sampled requests that give none."""

    def _group_key(self, sampling: SamplingConfig) -> SamplingConfig:
        return replace(sampling, seed=None) if self.per_row_seeds else sampling

    def seeded(self, sampling: SamplingConfig) -> SamplingConfig:
        """``sampling`` with a seed: its own, else (when it samples) one from the server's
        generator. Greedy requests need none."""
        if sampling.seed is not None or sampling.temperature == 0:
            return sampling
        return replace(sampling, seed=self.rng.getrandbits(63))

    def check_room(self) -> None:
        """Raise :class:`QueueFull` when ``max_queue`` requests are already pending."""
        if self.pending >= self.config.max_queue:
            raise QueueFull(f"{self.pending} requests are already queued")

    async def submit(self, messages: list[Message], sampling: SamplingConfig) -> Completion:
        self.check_room()
        future = asyncio.get_running_loop().create_future()
        self.pending += 1
        try:
            self.queue.put_nowait(_Job(messages, self.seeded(sampling), future))
            return await future
        finally:
            self.pending -= 1

    async def run(self) -> None:
        while True:
            first = self.carry.popleft() if self.carry else await self.queue.get()
            jobs = [first]
            key = self._group_key(first.sampling)
            # matching jobs carried over from the last round first, then new arrivals
            for job in list(self.carry):
                if len(jobs) < self.config.max_batch_size and self._group_key(job.sampling) == key:
                    self.carry.remove(job)
                    jobs.append(job)
            deadline = asyncio.get_running_loop().time() + self.config.batch_window_s
            while len(jobs) < self.config.max_batch_size:
                remaining = deadline - asyncio.get_running_loop().time()
                try:
                    job = (
                        self.queue.get_nowait()
                        if remaining <= 0
                        else await asyncio.wait_for(self.queue.get(), remaining)
                    )
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                if self._group_key(job.sampling) == key:
                    jobs.append(job)
                else:
                    self.carry.append(job)
            await self._generate(jobs)

    async def _call(self, jobs: Sequence[_Job]) -> list[Completion]:
        batch = [job.messages for job in jobs]
        sampling = jobs[0].sampling
        self.batches += 1
        seeds = [job.sampling.seed for job in jobs]
        row_seeds = None if None in seeds else seeds  # greedy rows: the sampler ignores seeds
        return await asyncio.to_thread(
            generate_seeded, self.backend, batch, sampling, row_seeds, sampling.seed
        )

    async def _generate(self, jobs: Sequence[_Job]) -> None:
        live = [job for job in jobs if not job.future.done()]  # the client may have gone
        if not live:
            return
        try:
            completions = await self._call(live)
        except Exception as err:  # noqa: BLE001 - isolated below, reported per request
            if len(live) == 1:
                log.exception("generation failed for one request")
                if not live[0].future.done():
                    live[0].future.set_exception(err)
                return
            # one request must never fail another: generate each one on its own
            log.warning(
                "generation failed for a batch of %d requests (%s: %s); generating each alone",
                len(live),
                type(err).__name__,
                err,
            )
            for job in live:
                await self._generate([job])
            return
        for job, completion in zip(live, completions, strict=True):
            if not job.future.done():
                job.future.set_result(completion)


def create_app(backend: Backend, config: ServeConfig) -> FastAPI:
    """The FastAPI app serving ``backend`` under ``config.model_name``.

    Run it with uvicorn (``goalprobe serve`` does, on 127.0.0.1 by default).
    """
    batcher = _Batcher(backend, config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        worker = asyncio.create_task(batcher.run())
        try:
            yield
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    app = FastAPI(title="goalprobe agent server", lifespan=lifespan)
    app.add_middleware(_BodyLimit, max_bytes=config.max_body_bytes)
    app.state.batcher = batcher
    encoder = backend if isinstance(backend, PromptEncoder) else None
    card = {
        "id": config.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "goalprobe",
    }

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        problems = []
        param = None
        for error in exc.errors():
            loc = [str(p) for p in error.get("loc", ()) if p != "body"]
            param = param or (".".join(loc) or None)
            problems.append(f"{'.'.join(loc) or 'body'}: {error.get('msg', 'invalid')}")
        return await _api_error(
            _request, _ApiError(400, "invalid request: " + "; ".join(problems), param)
        )

    @app.exception_handler(_ApiError)
    async def _api_error(_request: Request, exc: _ApiError):
        body = _error_body(exc.status, exc.message, exc.param, exc.code)
        return JSONResponse(status_code=exc.status, content=body, headers=exc.headers)

    def check_key(request: Request) -> None:
        if config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), config.api_key.encode()
        ):
            raise _ApiError(401, "missing or invalid API key (Authorization: Bearer ...)")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": config.model_name}

    @app.get("/version")
    async def version() -> dict[str, Any]:  # as vLLM's GET /version, plus the server's name
        return {"version": package_version(), "server": "goalprobe"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_key(request)
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> dict[str, Any]:
        check_key(request)
        if body.model is not None and body.model != config.model_name:
            raise _ApiError(
                404,
                f"model {body.model!r} is not served here; this server serves "
                f"{config.model_name!r}",
                "model",
                "model_not_found",
            )
        if body.n != 1:
            raise _ApiError(400, f"n must be 1, got {body.n}", "n")
        if body.stream:
            raise _ApiError(400, "streaming is not supported; send stream=false", "stream")
        try:
            messages = [Message(m.role, m.text()) for m in body.messages]
        except (ValueError, TypeError) as err:
            raise _ApiError(400, f"invalid message: {err}", "messages") from err
        if messages[-1].role == "assistant":
            raise _ApiError(400, "the last message must not be an assistant message", "messages")
        max_tokens = body.max_completion_tokens or body.max_tokens or config.default_max_tokens
        try:
            batcher.check_room()  # before tokenising: a full server does no work at all
        except QueueFull as err:
            raise _busy(err, config) from err
        if encoder is not None:  # limits before any compute
            max_tokens = await _fit_context(encoder, messages, body.reasoning_effort, max_tokens)
        try:
            sampling = SamplingConfig(
                temperature=body.temperature,
                top_p=body.top_p,
                max_new_tokens=max_tokens,
                reasoning_effort=body.reasoning_effort,
                seed=body.seed,
            )
        except ValueError as err:
            raise _ApiError(400, str(err)) from err
        try:
            completion = await batcher.submit(messages, sampling)
        except QueueFull as err:
            raise _busy(err, config) from err
        except ValueError as err:
            raise _ApiError(400, f"cannot generate for this request: {err}") from err
        except Exception as err:  # noqa: BLE001 - reported to the client as a 500
            raise _ApiError(500, f"generation failed: {type(err).__name__}: {err}") from err
        return _response(config.model_name, completion)

    return app


def _busy(err: QueueFull, config: ServeConfig) -> _ApiError:
    return _ApiError(
        503,
        f"server busy: {err}; retry later",
        code="queue_full",
        headers={"Retry-After": str(config.retry_after_s)},
    )


async def _fit_context(
    encoder: PromptEncoder, messages: list[Message], effort: ReasoningEffort, max_tokens: int
) -> int:
    """``max_tokens`` clamped to the context left after the prompt; a 400 when the prompt
    leaves no room for even one token."""
    context = encoder.context_length
    try:
        prompt_ids = await asyncio.to_thread(encoder.encode_prompt, messages, effort)
    except ValueError as err:
        raise _ApiError(400, f"invalid message: {err}", "messages") from err
    room = context - len(prompt_ids)
    if room < 1:
        raise _ApiError(
            400,
            f"the prompt is {len(prompt_ids)} tokens; this model's context is {context} "
            "positions (prompt and answer together), so it cannot be answered",
            "messages",
            "context_length_exceeded",
        )
    return min(max_tokens, room)


def _response(model_name: str, completion: Completion) -> dict[str, Any]:
    prompt_ids = [int(i) for i in completion.prompt_token_ids]
    generated_ids = [int(i) for i in completion.generated_token_ids]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": completion.final,
                    "reasoning_content": completion.reasoning,
                },
                "finish_reason": completion.finish_reason,
                "token_ids": generated_ids,
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(generated_ids),
            "total_tokens": len(prompt_ids) + len(generated_ids),
        },
        "prompt_token_ids": prompt_ids,
        "goalprobe": {
            "token_ids_source": completion.token_ids_source,
            "well_formed": completion.well_formed,
        },
    }
