"""Benchmark: `goalprobe serve` under a bounded mixed load (requests/s, p50/p95 latency).

Starts ``goalprobe serve`` (a subprocess on 127.0.0.1) with the bundled agent and sends
``--requests`` chat completions, ``--concurrency`` at a time: real grid prompts with a seed,
some without one (server-side seeds), and ``--invalid`` of them malformed (empty messages, a
prompt beyond the context, a bad ``top_p``, an unknown model). Checks that every valid request
was answered (200 with token ids), every invalid one refused with a 4xx, and the server is still
healthy at the end; prints requests/s and latency percentiles of the valid requests.

    python3 scripts/bench_serve.py [--requests 200] [--concurrency 16] [--invalid 0.1]
                                   [--max-tokens 128] [--threads 1] [--omp-wait-policy PASSIVE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
from goalprobe.agents.prompts import build_messages
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.text import render

MODEL_NAME = "bundled"


def request_bodies(n: int, invalid_fraction: float, max_tokens: int, seed: int) -> list[dict]:
    """``n`` request bodies: grid prompts (3 in 4 seeded), every ``1/invalid_fraction``-th one
    invalid (marked ``_invalid``)."""
    rng = np.random.default_rng(seed)
    grids = generate_grid_set(
        GridSetConfig(sizes=(7,), densities=(0.0, 0.4, 0.8), n_per_cell=4, seed=seed)
    )
    invalid = [
        {"messages": []},
        {"messages": [{"role": "user", "content": "x " * 5000}]},
        {"messages": [{"role": "user", "content": "hi"}], "top_p": 0},
        {"messages": [{"role": "user", "content": "hi"}], "model": "not-served"},
    ]
    every = max(1, round(1 / invalid_fraction)) if invalid_fraction > 0 else None
    bodies = []
    for i in range(n):
        if every is not None and i % every == every - 1:
            bodies.append(invalid[(i // every) % len(invalid)] | {"_invalid": True})
            continue
        grid = grids[int(rng.integers(len(grids)))]
        messages = build_messages(render(grid), variant=grid.variant, has_key=False)
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "top_p": 0.95,
        }
        if rng.random() < 0.75:
            body["seed"] = int(rng.integers(2**31))
        bodies.append(body)
    return bodies


async def load(url: str, bodies: list[dict], concurrency: int) -> list[tuple[int, float, dict]]:
    """Send every body, ``concurrency`` at a time: ``(status, seconds, json)`` per body."""
    semaphore = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(body: dict) -> tuple[int, float, dict]:
            payload = {k: v for k, v in body.items() if k != "_invalid"}
            async with semaphore:
                started = time.perf_counter()
                response = await client.post(f"{url}/v1/chat/completions", json=payload)
                return response.status_code, time.perf_counter() - started, response.json()

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def start_server(port: int, args: argparse.Namespace) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    else:
        env.pop("OMP_WAIT_POLICY", None)
    argv = [sys.executable, "-c", "from goalprobe.cli import main; main()", "serve"]
    argv += ["--model", args.model, "--model-name", MODEL_NAME, "--port", str(port)]
    argv += ["--max-batch-size", str(args.concurrency), "--log-level", "warning"]
    return subprocess.Popen(argv, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled", help="bundled, a directory or a hub id")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--invalid", type=float, default=0.1, help="fraction of bad requests")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="the server's OMP_NUM_THREADS")
    parser.add_argument(
        "--omp-wait-policy",
        default="",
        help="the server's OMP_WAIT_POLICY ('': goalprobe serve's default, PASSIVE)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    bodies = request_bodies(args.requests, args.invalid, args.max_tokens, args.seed)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = start_server(port, args)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("goalprobe serve did not come up")
            time.sleep(0.5)
        valid_bodies = [b for b in bodies if not b.get("_invalid")]
        asyncio.run(load(url, valid_bodies[: args.concurrency], args.concurrency))  # warm-up
        started = time.perf_counter()
        results = asyncio.run(load(url, bodies, args.concurrency))
        seconds = time.perf_counter() - started
        alive = httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"
    finally:
        server.terminate()
        server.wait(timeout=60)

    problems = []
    latencies, tokens = [], 0
    for i, (body, (status, latency, payload)) in enumerate(zip(bodies, results, strict=True)):
        if body.get("_invalid"):
            if not 400 <= status < 500:
                problems.append(f"request {i}: invalid but answered {status}")
        elif status != 200 or not payload["choices"][0]["token_ids"]:
            problems.append(f"request {i}: valid but answered {status}: {payload}")
        else:
            latencies.append(latency)
            tokens += payload["usage"]["completion_tokens"]
    p50, p95 = np.percentile(latencies, [50, 95]) if latencies else (float("nan"),) * 2
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}; server OMP_NUM_THREADS={args.threads}, "
        f"OMP_WAIT_POLICY={args.omp_wait_policy or '(serve default)'}"
    )
    summary = {
        "requests": len(bodies),
        "invalid": sum(bool(b.get("_invalid")) for b in bodies),
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "seconds": round(seconds, 2),
        "requests_per_s": round(len(bodies) / seconds, 2),
        "completion_tokens_per_s": round(tokens / seconds, 1),
        "p50_latency_s": round(float(p50), 3),
        "p95_latency_s": round(float(p95), 3),
        "server_alive": alive,
        "problems": problems,
    }
    print(json.dumps(summary, indent=2))
    if problems or not alive:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
