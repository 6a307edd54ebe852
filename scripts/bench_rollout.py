"""Benchmark: rollout steps per second of the bundled agent on CPU, batch 1 against batched.

Runs the same episodes (same grids, seeds and config) once with one episode in flight and once
with ``--batch`` episodes in flight, and prints steps/s of each and the speed-up (target: >= 5x
from batching). The per-episode seeds make both runs sample the same episodes.

    python3 scripts/bench_rollout.py [--model bundled] [--size 7] [--grids 8] [--episodes 4]
                                     [--batch 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from goalprobe.agents.agent_config import local_backend
from goalprobe.agents.rollout import RolloutConfig, RolloutReport, run_rollouts
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set


def run(grids, backend, config: RolloutConfig, out: Path) -> RolloutReport:
    """One timed rollout into a fresh file."""
    out.unlink(missing_ok=True)
    return run_rollouts(grids, backend, config, out, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled", help="bundled, a directory or a hub id")
    parser.add_argument("--size", type=int, default=7, help="grid side")
    parser.add_argument("--densities", default="0.0,0.4,0.8", help="comma-separated")
    parser.add_argument("--grids", type=int, default=4, help="grids per density")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per grid")
    parser.add_argument("--batch", type=int, default=32, help="episodes in flight (batched run)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    grids = generate_grid_set(
        GridSetConfig(
            sizes=(args.size,),
            densities=tuple(float(d) for d in args.densities.split(",")),
            n_per_cell=args.grids,
            seed=0,
        )
    )
    backend, _ = local_backend(args.model, device="cpu")
    n_params = sum(p.numel() for p in backend.model.parameters())
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__} ({args.threads} threads), python {platform.python_version()}"
    )
    print(
        f"model: {args.model} ({n_params / 1e6:.2f} M parameters); {len(grids)} grids "
        f"{args.size} x {args.size} x {args.episodes} episodes; horizon ceil(1.5 L); "
        f"temperature 0.7, top_p 0.95, max_new_tokens {args.max_new_tokens}"
    )
    base = RolloutConfig(
        episodes_per_grid=args.episodes, max_new_tokens=args.max_new_tokens, seed=0, retries=2
    )
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up (first-call allocations) on one grid
        run(grids[:1], backend, replace(base, episodes_per_grid=1), Path(tmp) / "warm.jsonl")
        for batch in (1, args.batch):
            config = replace(base, batch_size=batch)
            report = run(grids, backend, config, Path(tmp) / f"b{batch}.jsonl")
            rates[batch] = report.steps_per_second
            print(
                f"batch {batch:>3}: {report.steps} steps ({report.invalid_steps} invalid, "
                f"{report.successes}/{report.episodes_run} episodes successful) in "
                f"{report.seconds:.1f} s = {report.steps_per_second:.2f} steps/s, "
                f"{report.generate_calls} generate calls"
            )
    print(f"speed-up from batching: {rates[args.batch] / rates[1]:.1f}x (target >= 5x)")


if __name__ == "__main__":
    main()
