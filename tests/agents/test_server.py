"""The OpenAI-compatible server (real uvicorn on 127.0.0.1) and the server rollout backend."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import httpx
import pytest
from agent_fixtures import SHORT_TEMPLATES, build_tiny_backend, serving
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from goalprobe.agents.backend import SamplingConfig
from goalprobe.agents.prompts import build_messages
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.server_app import ServeConfig, create_app
from goalprobe.agents.server_backend import ServerBackend, ServerConfig, ServerError
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.text import render

SECRET = "sk-goalprobe-test-3f9c1d7e5b2a4c6e8f0a"
KEY_ENV = "GOALPROBE_TEST_SERVER_KEY"
MODEL = "tiny-gpt-oss"


@pytest.fixture(scope="module")
def backend():
    return build_tiny_backend()


@pytest.fixture(scope="module")
def server(backend):
    config = ServeConfig(model_name=MODEL, api_key=SECRET, max_batch_size=3, batch_window_s=0.3)
    app = create_app(backend, config)
    with serving(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def grids():
    return generate_grid_set(GridSetConfig(sizes=(5,), densities=(0.0, 1.0), n_per_cell=1))


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("templates")
    for name, text in SHORT_TEMPLATES.items():
        (directory / name).write_text(text + "\n", encoding="utf-8")
    return directory


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRET}"}


# ---------------------------------------------------------------------------------------------


def test_health_and_models(server):
    url, _ = server
    assert httpx.get(f"{url}/health").json() == {"status": "ok", "model": MODEL}
    models = httpx.get(f"{url}/v1/models", headers=auth()).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_chat_completion_returns_text_reasoning_and_token_ids(server, backend, grids):
    url, _ = server
    messages = build_messages(render(grids[0]), variant="plain", has_key=False)
    body = {
        "model": MODEL,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "temperature": 1.0,
        "top_p": 0.9,
        "max_tokens": 5,
        "seed": 123,
        "reasoning_effort": "low",
    }
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(), timeout=60)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    choice = data["choices"][0]
    # the same request straight to the backend gives the same sample (per-request seed)
    sampling = SamplingConfig(temperature=1.0, top_p=0.9, max_new_tokens=5, seed=None)
    (direct,) = backend.generate([messages], sampling, seeds=[123])
    assert data["prompt_token_ids"] == direct.prompt_token_ids == backend.encode_prompt(messages)
    assert choice["token_ids"] == direct.generated_token_ids
    assert 0 < len(choice["token_ids"]) <= 5
    assert choice["message"]["content"] == direct.final
    assert choice["message"]["reasoning_content"] == direct.reasoning
    assert choice["finish_reason"] == direct.finish_reason
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert data["goalprobe"]["token_ids_source"] == "model"


@pytest.mark.parametrize(
    ("change", "status", "needle"),
    [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "role"),
        ({"temperature": -1}, 400, "temperature"),
        ({"top_p": 0}, 400, "top_p"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"n": 2}, 400, "n must be 1"),
        ({"stream": True}, 400, "stream"),
        ({"reasoning_effort": "extreme"}, 400, "reasoning_effort"),
        ({"messages": [{"role": "user", "content": "a <|end|> b"}]}, 400, "special token"),
        ({"model": "gpt-4"}, 404, "not served"),
    ],
)
def test_bad_requests_get_clear_errors(server, change, status, needle):
    url, _ = server
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body | change, headers=auth())
    assert answer.status_code == status, answer.text
    assert needle in answer.json()["error"]["message"]


def test_missing_or_wrong_key_is_refused(server):
    url, _ = server
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 401
    wrong = {"Authorization": "Bearer sk-wrong"}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=wrong).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200


def test_concurrent_requests_are_batched(server, grids, key_env):
    url, app = server
    client = ServerBackend(ServerConfig(base_url=f"{url}/v1", model=MODEL, api_key_env=KEY_ENV))
    messages = build_messages(render(grids[0]), variant="plain", has_key=False)
    before = app.state.batcher.batches
    completions = client.generate(
        [messages] * 3, SamplingConfig(max_new_tokens=3, seed=None), seeds=[1, 2, 3]
    )
    assert app.state.batcher.batches - before == 1  # three requests, one backend call
    assert len({tuple(c.generated_token_ids) for c in completions}) > 1  # own seeds


def test_rollout_through_server_equals_local_and_never_leaks_the_key(
    server, backend, grids, template_dir, tmp_path, key_env, caplog, capsys, monkeypatch
):
    url, _ = server
    caplog.set_level(logging.DEBUG)
    config = RolloutConfig(
        episodes_per_grid=2,
        horizon_steps=2,
        retries=1,
        batch_size=3,
        max_new_tokens=4,
        temperature=1.0,
        seed=3,
        template_dir=str(template_dir),
    )
    remote = ServerBackend(
        ServerConfig(base_url=f"{url}/v1", model=MODEL, api_key_env=KEY_ENV, max_concurrency=3)
    )
    via_server, local = tmp_path / "server.jsonl", tmp_path / "local.jsonl"
    run_rollouts(grids, remote, config, via_server, progress=True)
    run_rollouts(grids, backend, config, local, progress=False)

    def episodes(path):
        return {
            e.key: [asdict(s) | {"run_id": None} for s in e.steps] for e in read_trajectories(path)
        }

    assert episodes(via_server) == episodes(local)
    assert all(s["token_ids_source"] == "model" for ep in episodes(via_server).values() for s in ep)

    captured = capsys.readouterr()
    outputs = [via_server.read_text(), captured.out, captured.err, caplog.text]
    outputs += [repr(remote), json.dumps(remote.describe())]
    assert all(SECRET not in text for text in outputs)
    # a refused key: the error names the problem, not the key
    monkey_key = SECRET + "-wrong"
    monkeypatch.setenv(KEY_ENV, monkey_key)
    wrong = ServerBackend(ServerConfig(base_url=f"{url}/v1", model=MODEL, api_key_env=KEY_ENV))
    with pytest.raises(ServerError, match="401") as err:
        wrong.generate([[build_messages("x", variant="plain", has_key=False)[1]]], SamplingConfig())
    assert monkey_key not in str(err.value) and SECRET not in caplog.text


# -- a scripted endpoint for the client's retry and re-tokenisation paths ----------------------


def scripted_app(counts: dict[str, int]) -> FastAPI:
    """503 twice then success (``/flaky``), always 503 (``/down``), 400 (``/bad``), a slow
    answer (``/slow``), and an answer without token ids (``/noids``)."""
    app = FastAPI()
    answer = {
        "choices": [
            {
                "message": {"content": '{"action": "UP"}', "reasoning": "A is at (1, 1)."},
                "finish_reason": "stop",
            }
        ]
    }

    @app.post("/{mode}/v1/chat/completions")
    async def chat(mode: str, request: Request):
        counts[mode] = counts.get(mode, 0) + 1
        body = await request.json()
        counts[f"{mode}:seed"] = body.get("seed")
        if mode == "flaky" and counts[mode] <= 2:
            return JSONResponse({"error": {"message": "busy"}}, 503, {"Retry-After": "0"})
        if mode == "down":
            return JSONResponse({"error": {"message": "overloaded"}}, 503)
        if mode == "bad":
            return JSONResponse({"error": {"message": "unknown field return_token_ids"}}, 400)
        if mode == "slow":
            await asyncio.sleep(2)
        if mode == "noids":
            return answer
        return answer | {
            "prompt_token_ids": [5, 6, 7],
            "choices": [answer["choices"][0] | {"token_ids": [8, 9]}],
        }

    return app


@pytest.fixture(scope="module")
def scripted():
    counts: dict[str, int] = {}
    with serving(scripted_app(counts)) as url:
        yield url, counts


def client_for(url: str, mode: str, tokenizer=None, **kwargs) -> ServerBackend:
    options = {"api_key_env": None, "backoff_s": 0.01, "backoff_max_s": 0.05} | kwargs
    return ServerBackend(ServerConfig(base_url=f"{url}/{mode}/v1", model="m", **options), tokenizer)


def test_retries_with_backoff_then_succeeds_or_gives_up(scripted, caplog):
    url, counts = scripted
    messages = build_messages("x", variant="plain", has_key=False)
    (completion,) = client_for(url, "flaky").generate([messages], SamplingConfig(seed=11))
    assert counts["flaky"] == 3 and counts["flaky:seed"] == 11
    assert completion.final == '{"action": "UP"}' and completion.reasoning == "A is at (1, 1)."
    assert completion.token_ids_source == "model" and completion.prompt_token_ids == [5, 6, 7]
    assert "retry 1/5" in caplog.text

    with pytest.raises(ServerError, match=r"giving up after 3 attempt\(s\).*503.*overloaded"):
        client_for(url, "down", max_retries=2).generate([messages], SamplingConfig())
    assert counts["down"] == 3

    with pytest.raises(ServerError, match="refused the request.*400.*return_token_ids"):
        client_for(url, "bad").generate([messages], SamplingConfig())
    assert counts["bad"] == 1  # a 4xx other than 408/409/429 is not retried

    with pytest.raises(ServerError, match="ReadTimeout"):
        client_for(url, "slow", timeout_s=0.2, max_retries=1).generate([messages], SamplingConfig())
    assert counts["slow"] == 2


def test_text_without_ids_is_retokenized_and_flagged(scripted, backend):
    url, _ = scripted
    messages = build_messages("x", variant="plain", has_key=False)
    with pytest.raises(ServerError, match="no token ids"):
        client_for(url, "noids").generate([messages], SamplingConfig())
    tokenizer = backend.tokenizer
    (completion,) = client_for(url, "noids", tokenizer).generate([messages], SamplingConfig())
    assert completion.token_ids_source == "retokenized"
    assert completion.prompt_token_ids == backend.encode_prompt(messages)
    text = tokenizer.decode(completion.generated_token_ids, skip_special_tokens=False)
    assert text == (
        "<|channel|>analysis<|message|>A is at (1, 1).<|end|><|start|>assistant"
        '<|channel|>final<|message|>{"action": "UP"}<|return|>'
    )


# -- `goalprobe serve` as a real subprocess ---------------------------------------------------


@pytest.mark.slow
def test_goalprobe_serve_subprocess(backend, tmp_path, key_env):
    model_dir = tmp_path / "tiny"
    backend.model.save_pretrained(model_dir)
    backend.tokenizer.save_pretrained(model_dir)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = "from goalprobe.commands.serve import command; import typer; typer.run(command)"
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-c", code, "--model", str(model_dir), "--port", str(port)]
    argv += ["--model-name", MODEL, "--api-key-env", KEY_ENV, "--log-level", "warning"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "goalprobe serve did not come up"
            time.sleep(0.3)
        client = ServerBackend(ServerConfig(base_url=f"{url}/v1", model=MODEL, api_key_env=KEY_ENV))
        messages = build_messages("x", variant="plain", has_key=False)
        sampling = replace(SamplingConfig(), max_new_tokens=3)
        (completion,) = client.generate([messages], sampling, seeds=[5])
        (direct,) = backend.generate([messages], sampling, seeds=[5])
        assert completion.generated_token_ids == direct.generated_token_ids
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0].decode()
    assert SECRET not in output
