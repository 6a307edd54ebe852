"""`goalprobe serve` under bad and concurrent clients, and rollouts through a faulty server.

Real uvicorn servers on 127.0.0.1, the tiny random GPT-OSS (512 positions); the faulty proxy of
``server_fixtures`` injects 5xx, malformed JSON, truncated bodies and timeouts.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from dataclasses import asdict

import httpx
import pytest
from agent_fixtures import SHORT_TEMPLATES, serving
from goalprobe.agents.backend import SamplingConfig
from goalprobe.agents.local_backend import PerRowSampler
from goalprobe.agents.prompts import build_messages
from goalprobe.agents.rollout import RolloutConfig, RolloutStopped, run_rollouts
from goalprobe.agents.server_app import ServeConfig, create_app
from goalprobe.agents.server_backend import ServerBackend, ServerConfig
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.gridworld.text import render
from server_fixtures import FAULTS, TINY_MODEL, PoisonableBackend, faulty_server
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def grids():
    return generate_grid_set(GridSetConfig(sizes=(5,), densities=(0.0, 1.0), n_per_cell=1))


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("templates")
    for name, text in SHORT_TEMPLATES.items():
        (directory / name).write_text(text + "\n", encoding="utf-8")
    return directory


def grid_messages(grid) -> list[dict[str, str]]:
    messages = build_messages(render(grid), variant="plain", has_key=False)
    return [{"role": m.role, "content": m.content} for m in messages]


async def post_all(url: str, bodies: list[dict], concurrency: int = 16) -> list[httpx.Response]:
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(body):
            async with semaphore:
                return await client.post(f"{url}/v1/chat/completions", json=body)

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def token_ids(response: httpx.Response) -> list[int]:
    return response.json()["choices"][0]["token_ids"]


# -- seeds and isolation ----------------------------------------------------------------------


def test_unseeded_requests_sample_from_the_servers_seeded_generator(tiny_backend, grids):
    body = {"messages": grid_messages(grids[0]), "max_tokens": 6, "temperature": 1.0}

    def answers(seed: int) -> list[list[int]]:
        app = create_app(tiny_backend, ServeConfig(model_name=TINY_MODEL, seed=seed))
        with serving(app) as url:
            responses = [httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)]
            responses += [httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)]
            responses += [httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)]
        assert [r.status_code for r in responses] == [200] * 3, responses[0].text
        return [token_ids(r) for r in responses]

    first = answers(seed=7)
    assert len({tuple(ids) for ids in first}) > 1  # each unseeded request draws a new seed
    assert answers(seed=7) == first  # the same server seed replays the same answers
    assert answers(seed=8) != first


def test_one_bad_request_never_fails_the_others_of_its_batch(tiny_backend, grids):
    backend = PoisonableBackend(tiny_backend.model, tiny_backend.tokenizer)
    config = ServeConfig(model_name=TINY_MODEL, max_batch_size=16, batch_window_s=0.5)
    app = create_app(backend, config)
    seeded = [
        {"messages": grid_messages(grids[i % 2]), "max_tokens": 5, "seed": i, "temperature": 1.0}
        for i in range(5)
    ]
    unseeded = [{"messages": grid_messages(grids[0]), "max_tokens": 5} for _ in range(3)]
    poisoned = {"messages": [{"role": "user", "content": "POISON"}], "max_tokens": 5, "seed": 1}
    invalid = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "seed": "x"}
    with serving(app) as url:
        before = app.state.batcher.batches
        responses = asyncio.run(post_all(url, seeded + unseeded + [poisoned, invalid]))
        batches = app.state.batcher.batches - before
    statuses = [r.status_code for r in responses]
    assert statuses == [200] * 8 + [500, 400], [r.text for r in responses]
    assert batches > 1  # the failed batch was split up
    assert "poisoned" in responses[8].json()["error"]["message"]
    assert "seed" in responses[9].json()["error"]["message"]
    for body, response in zip(seeded, responses, strict=False):
        messages = build_messages(render(grids[body["seed"] % 2]), variant="plain", has_key=False)
        sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=5, seed=None)
        (direct,) = tiny_backend.generate([messages], sampling, seeds=[body["seed"]])
        assert token_ids(response) == direct.generated_token_ids


# -- limits before compute --------------------------------------------------------------------


def test_oversize_prompt_and_body_are_refused_before_any_compute(tiny_server):
    url, app = tiny_server
    long_prompt = {"messages": [{"role": "user", "content": "x " * 3000}], "max_tokens": 5}
    before = app.state.batcher.batches
    started = time.perf_counter()
    answer = httpx.post(f"{url}/v1/chat/completions", json=long_prompt, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "context is 512 positions" in error["message"]
    assert error["code"] == "context_length_exceeded"
    huge = {"messages": [{"role": "user", "content": "y" * (2 << 20)}]}
    answer = httpx.post(f"{url}/v1/chat/completions", json=huge, timeout=60)
    assert answer.status_code == 413 and "larger than this server accepts" in answer.text

    def chunks():  # no Content-Length: the limit applies while reading
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(300):
            yield b"z" * 10_000
        yield b'"}]}'

    answer = httpx.post(
        f"{url}/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 413
    assert time.perf_counter() - started < 10
    assert app.state.batcher.batches == before  # nothing reached the model


def test_max_tokens_is_clamped_to_the_context_left(tiny_server, tiny_backend):
    url, _ = tiny_server
    from goalprobe.agents.harmony import Message

    messages = [Message("user", "x " * 445)]
    prompt_length = len(tiny_backend.encode_prompt(messages))
    assert 490 < prompt_length < 510
    body = {"messages": [{"role": "user", "content": "x " * 445}], "max_tokens": 10_000}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body | {"temperature": 0}, timeout=60)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] == prompt_length
    assert usage["total_tokens"] <= 512
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=512 - prompt_length)
    (direct,) = tiny_backend.generate([messages], greedy)
    assert token_ids(answer) == direct.generated_token_ids


def test_full_queue_answers_503_with_retry_after(tiny_backend, grids):
    config = ServeConfig(model_name=TINY_MODEL, max_queue=2, batch_window_s=0.5, retry_after_s=3)
    with serving(create_app(tiny_backend, config)) as url:
        body = {"messages": grid_messages(grids[0]), "max_tokens": 3, "seed": 1}
        responses = asyncio.run(post_all(url, [body] * 6))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 503, 503, 503, 503]
    busy = [r for r in responses if r.status_code == 503]
    assert all(r.headers["retry-after"] == "3" for r in busy)
    assert all(r.json()["error"]["code"] == "queue_full" for r in busy)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]}, "type"),
        ({"messages": [{"role": "user"}]}, "content"),
        ({"messages": [{"role": "user", "content": "hi"}], "seed": "abc"}, "seed"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, "top_p"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "assistant"),
        ([1, 2], "body"),
    ],
)
def test_every_field_is_validated_with_a_400(tiny_server, body, needle):
    url, _ = tiny_server
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert needle in answer.json()["error"]["message"]


def test_malformed_json_body_is_a_400(tiny_server):
    url, _ = tiny_server
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        content=b'{"messages": [',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400 and "invalid request" in answer.json()["error"]["message"]


def test_sampler_is_finite_near_temperature_zero():
    import torch

    scores = torch.tensor([[3.0, 1.0, -2.0, -math.inf], [0.5, 0.25, 0.75, 0.0]])
    sampler = PerRowSampler([1, 2], 1e-30, 0.9, torch.device("cpu"))
    out = sampler(torch.zeros((2, 1), dtype=torch.long), scores)
    assert out.argmax(dim=-1).tolist() == [0, 2]  # the argmax, as greedy decoding gives


# -- rollouts through a faulty server ---------------------------------------------------------


def rollout_config(template_dir) -> RolloutConfig:
    return RolloutConfig(
        episodes_per_grid=2,
        horizon_steps=2,
        retries=1,
        batch_size=4,
        max_new_tokens=4,
        temperature=1.0,
        seed=5,
        template_dir=str(template_dir),
    )


def episodes(path) -> dict:
    found = list(read_trajectories(path))
    keys = [e.key for e in found]
    assert len(keys) == len(set(keys)), "an episode was written twice"
    return {e.key: [asdict(s) for s in e.steps] for e in found}


def client(url: str, **options) -> ServerBackend:
    options = {"api_key_env": None, "backoff_s": 0.01, "backoff_max_s": 0.05} | options
    return ServerBackend(ServerConfig(base_url=f"{url}/v1", model=TINY_MODEL, **options))


@pytest.mark.slow
def test_rollout_through_a_faulty_server_retries_and_equals_a_clean_run(
    tiny_server, grids, template_dir, tmp_path
):
    url, _ = tiny_server
    config = rollout_config(template_dir)
    clean = tmp_path / "clean.jsonl"
    run_rollouts(grids, client(url), config, clean, progress=False)
    with faulty_server(url, seed=3, rate=0.6, max_faults=2, hang_s=4.0) as (faulty, log):
        backend = client(faulty, max_retries=2, timeout_s=3.0)
        out = tmp_path / "faulty.jsonl"
        report = run_rollouts(grids, backend, config, out, progress=False)
    assert set(log.faults) == set(FAULTS), log.faults  # every kind of fault happened
    assert backend.stats.retries == log.total_faults and backend.stats.failures == 0
    assert report.failed_rounds == 0 and report.episodes_run == 4
    assert episodes(out) == episodes(clean)


@pytest.mark.slow
def test_rollout_stops_resumably_and_resumes_without_loss_or_duplicates(
    tiny_server, grids, template_dir, tmp_path
):
    """Every request body fails twice (``rate=1.0, max_faults=2``), then passes: with
    ``max_failed_rounds=1`` an episode's request failing twice in a row stops the run, and each
    rerun gets further (the proxy remembers the faults each body has had).

    Per-episode scheduling counts failures per episode (a failed request is sent again at once,
    with the same seed), not per lockstep round: a server that fails half its requests at random
    but never the same one twice in a row is retried through, and the run finishes without a
    stop. The faults must therefore hit one request twice in a row for the stop to happen; the
    earlier random faults (``rate=0.5``, seed 11) never did."""
    url, _ = tiny_server
    config = rollout_config(template_dir)
    clean = tmp_path / "clean.jsonl"
    run_rollouts(grids, client(url), config, clean, progress=False)
    out = tmp_path / "faulty.jsonl"
    stops = 0
    with faulty_server(url, seed=11, rate=1.0, max_faults=2, hang_s=1.2) as (faulty, log):
        for _ in range(40):  # every run gets further: each request body has 2 faults at most
            backend = client(faulty, max_retries=0, timeout_s=1.0)
            try:
                report = run_rollouts(
                    grids, backend, config, out, progress=False, max_failed_rounds=1
                )
            except RolloutStopped as err:
                stops += 1
                assert "rerun the same command to resume" in str(err)
                assert err.report.failed_rounds >= 2
                continue
            break
        else:
            pytest.fail("the rollout never finished")
    assert stops >= 1 and log.total_faults > 0
    assert report.episodes_skipped + report.episodes_run == 4
    assert episodes(out) == episodes(clean)


def test_rollout_cli_against_a_down_server_is_one_error_line_and_exit_2(
    tiny_server, grids, template_dir, tmp_path
):
    from goalprobe.cli import app

    url, _ = tiny_server
    grid_file = tmp_path / "grids.jsonl"
    write_grid_set(grid_file, grids)
    out = tmp_path / "traj.jsonl"
    argv = ["rollout", str(grid_file), "--out", str(out), "--model", TINY_MODEL]
    argv += ["--episodes", "2", "--horizon", "2", "--max-new-tokens", "4", "--no-progress"]
    argv += ["--template-dir", str(template_dir), "--api-key-env", "GOALPROBE_UNSET_KEY"]
    argv += ["--retry-backoff", "0.01", "--retry-backoff-max", "0.02"]
    argv += ["--preflight-steps", "0"]  # the rollout loop's own handling (the pre-flight's: below)
    with faulty_server(url, seed=0, rate=1.0, max_faults=100) as (faulty, log):
        result = CliRunner().invoke(
            app,
            [*argv, "--server", f"{faulty}/v1", "--request-retries", "1"]
            + ["--request-timeout", "0.3", "--max-failed-rounds", "1"],
        )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "failed 2 times in a row" in lines[0] and "rerun" in lines[0]
    assert "retried" in lines[0] and log.forwarded == 0
    result = CliRunner().invoke(app, [*argv, "--server", f"{url}/v1"])  # the server is back
    assert result.exit_code == 0, result.output
    assert "4 episode(s) run" in result.stderr and "0 retried" in result.stderr
    assert len(episodes(out)) == 4


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--api-key-env", "GOALPROBE_UNSET_KEY"], "GOALPROBE_UNSET_KEY is unset"),
        (["--model", "/nonexistent/model-dir"], "/nonexistent/model-dir"),
        (["--max-queue", "0"], "max-queue"),
    ],
)
def test_serve_cli_errors_are_one_line_and_exit_2(options, needle, monkeypatch):
    from goalprobe.cli import app

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # serve sets it; restored after the test

    result = CliRunner().invoke(app, ["serve", "--port", "0", *options])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0]


# -- load -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_serve_under_load_answers_every_valid_request_and_refuses_every_invalid_one(
    tiny_backend, grids
):
    config = ServeConfig(model_name=TINY_MODEL, max_batch_size=16, batch_window_s=0.02)
    app = create_app(tiny_backend, config)
    distinct = [
        {"messages": grid_messages(grids[i % 2]), "max_tokens": 6, "seed": i, "temperature": 1.0}
        for i in range(8)
    ]
    invalid = [
        {"messages": []},
        {"messages": [{"role": "user", "content": "x " * 3000}]},
        {"messages": [{"role": "user", "content": "hi"}], "top_p": 0},
        {"messages": [{"role": "user", "content": "hi"}], "model": "other"},
    ]
    bodies: list[dict] = []
    for i in range(200):
        if i % 10 == 3:
            bodies.append(invalid[(i // 10) % len(invalid)])
        elif i % 10 == 7:
            bodies.append({"messages": grid_messages(grids[0]), "max_tokens": 6})  # unseeded
        else:
            bodies.append(distinct[i % len(distinct)])
    with serving(app) as url:
        responses = asyncio.run(post_all(url, bodies, concurrency=16))
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
    reference = {}
    for body in distinct:
        messages = build_messages(render(grids[body["seed"] % 2]), variant="plain", has_key=False)
        sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=6, seed=None)
        (direct,) = tiny_backend.generate([messages], sampling, seeds=[body["seed"]])
        reference[body["seed"]] = direct.generated_token_ids
    for body, response in zip(bodies, responses, strict=True):
        if body in invalid:
            assert 400 <= response.status_code < 500, response.text
        else:
            assert response.status_code == 200, response.text
            ids = token_ids(response)
            assert 0 < len(ids) <= 6
            if "seed" in body:
                assert ids == reference[body["seed"]]


def test_a_preflight_against_a_down_server_is_one_error_line_and_exit_2(
    grids, template_dir, tmp_path
):
    from goalprobe.cli import app

    grid_file = tmp_path / "grids.jsonl"
    write_grid_set(grid_file, grids)
    out = tmp_path / "traj.jsonl"
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = ["rollout", str(grid_file), "--out", str(out), "--model", TINY_MODEL]
    argv += ["--episodes", "1", "--horizon", "1", "--max-new-tokens", "4", "--no-progress"]
    argv += ["--template-dir", str(template_dir), "--api-key-env", "GOALPROBE_UNSET_KEY"]
    argv += ["--retry-backoff", "0.01", "--retry-backoff-max", "0.02", "--request-retries", "0"]
    argv += ["--server", f"http://127.0.0.1:{port}/v1", "--request-timeout", "0.3"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "pre-flight" in lines[0], result.output
