"""Shared server fixtures: the tiny model served on loopback, and a faulty proxy in front of it.

The faulty proxy (:func:`faulty_app`) forwards ``POST /v1/chat/completions`` to a real
``goalprobe serve`` app and, at random but reproducibly, answers instead with a 5xx, a body that
is not JSON, a body cut off mid-stream (the connection closes before ``Content-Length`` bytes)
or nothing until the client times out. Faults are bounded: each distinct request body gets at
most ``max_faults`` of them, so a client retrying more often always gets through; whether an
attempt fails depends only on the seed, the request body and how often that body was sent
before, never on the order concurrent requests arrive in (the kinds take turns, so every kind
occurs once five faults were injected).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest
from agent_fixtures import build_tiny_backend, serving
from fastapi import FastAPI, Request
from fastapi.responses import Response
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.server_app import ServeConfig, create_app

TINY_MODEL = "tiny-gpt-oss"

FAULTS = ("http_500", "http_503", "malformed_json", "truncated", "timeout")
"""The kinds of fault the faulty proxy injects."""


@dataclass
class FaultLog:
    """What the faulty proxy did."""

    faults: Counter = field(default_factory=Counter)
    """Injected faults by kind."""

    forwarded: int = 0
    """Requests forwarded to the real server."""

    sent: Counter = field(default_factory=Counter)
    """Times each distinct request body (by SHA-256) arrived."""

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())


class _TruncatedResponse(Response):
    """Declares the whole body's length, sends half of it, and ends: the server closes the
    connection mid-body, as a crashed upstream or proxy does."""

    async def __call__(self, scope, receive, send) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        half = self.body[: len(self.body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})


def _uniform(*parts: object) -> float:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def faulty_app(
    upstream: str,
    log: FaultLog,
    *,
    seed: int = 0,
    rate: float = 0.5,
    max_faults: int = 2,
    hang_s: float = 1.0,
) -> FastAPI:
    """A proxy to ``upstream`` (a base URL, no ``/v1``) that injects faults (see module doc).

    Args:
        upstream: the real server.
        log: where the proxy counts what it did.
        seed: seed of the fault draws.
        rate: chance that an attempt fails (while its body has faults left).
        max_faults: most faults per distinct request body.
        hang_s: how long a "timeout" fault stays silent (then answers 504); bounded.
    """
    app = FastAPI()
    faults_of: Counter = Counter()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.body()
        digest = hashlib.sha256(body).hexdigest()
        log.sent[digest] += 1
        attempt = log.sent[digest]
        if faults_of[digest] < max_faults and _uniform(seed, digest, attempt) < rate:
            faults_of[digest] += 1
            kind = FAULTS[log.total_faults % len(FAULTS)]  # in turn: every kind occurs
            log.faults[kind] += 1
            if kind == "http_500":
                return Response(b'{"error": {"message": "boom"}}', 500)
            if kind == "http_503":
                return Response(b'{"error": {"message": "busy"}}', 503, {"Retry-After": "0"})
            if kind == "malformed_json":
                return Response(b'{"choices": [{"message": ', 200, media_type="application/json")
            if kind == "truncated":
                return _TruncatedResponse(b'{"choices": [{"message": {"content": "x"}}]}' * 4)
            await asyncio.sleep(hang_s)
            return Response(b'{"error": {"message": "late"}}', 504)
        log.forwarded += 1
        async with httpx.AsyncClient(timeout=120) as client:
            answer = await client.post(
                f"{upstream}/v1/chat/completions",
                content=body,
                headers={"content-type": "application/json"},
            )
        return Response(answer.content, answer.status_code, media_type="application/json")

    return app


@contextlib.contextmanager
def faulty_server(upstream: str, **options):
    """Serve :func:`faulty_app` on a free loopback port; yields ``(base_url, FaultLog)``."""
    log = FaultLog()
    with serving(faulty_app(upstream, log, **options)) as url:
        yield url, log


class PoisonableBackend(LocalBackend):
    """The tiny model, except that a batch holding a conversation that contains ``poison``
    raises: a real backend failure that only one request of a batch causes."""

    poison = "POISON"

    def generate(self, batch, sampling, *, seeds=None):
        if any(self.poison in message.content for messages in batch for message in messages):
            raise RuntimeError("the backend choked on a poisoned conversation")
        return super().generate(batch, sampling, seeds=seeds)


@pytest.fixture(scope="session")
def tiny_backend():
    """A LocalBackend over a random 2-layer GPT-OSS (512 positions) with the bundled tokenizer."""
    return build_tiny_backend()


@pytest.fixture(scope="session")
def tiny_server(tiny_backend):
    """``(base_url, app)``: ``tiny_backend`` served on loopback without an API key."""
    config = ServeConfig(model_name=TINY_MODEL, max_batch_size=8, batch_window_s=0.05)
    app = create_app(tiny_backend, config)
    with serving(app) as url:
        yield url, app
