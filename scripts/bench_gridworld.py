"""Benchmark: generate 15 x 15 grids with their exact optimal policies, grids/s on one core.

Each grid: maze carving, wall removal, start/goal sampling, ``solve`` (BFS distances and optimal
action masks of every state) and reading L and the horizon. Target: >= 1,000 grids/s.

    python3 scripts/bench_gridworld.py [--size 15] [--n 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.generator import STUDY_DENSITIES, generate_grid
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.variants import generate_variant


def bench(make, n: int, repeats: int) -> float:
    """Best-of-``repeats`` throughput (grids/s) of ``n`` calls of ``make(rng)`` + ``solve``."""
    best = 0.0
    for repeat in range(repeats):
        rng = np.random.default_rng(repeat)
        start = time.perf_counter()
        for _ in range(n):
            policy = solve(make(rng))
            _ = policy.shortest_path_length, policy.horizon
        best = max(best, n / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=15)
    parser.add_argument("--n", type=int, default=2000, help="grids per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, numpy {np.__version__}; pinned to one core"
    )
    print(f"{args.size} x {args.size} grids, generation + optimal policy, best of {args.repeats}")
    rates = []
    for density in STUDY_DENSITIES:
        rate = bench(lambda rng, d=density: generate_grid(args.size, d, rng), args.n, args.repeats)
        rates.append(rate)
        print(f"  plain d={density:.1f}: {rate:8.0f} grids/s")
    print(f"  plain, mean over densities: {np.mean(rates):8.0f} grids/s (target >= 1,000)")
    for variant in (Variant.KEY_DOOR, Variant.TWO_PATH_KEY):
        rate = bench(
            lambda rng, v=variant: generate_variant(v, args.size, 0.6, rng),
            max(1, args.n // 4),
            args.repeats,
        )
        print(f"  {variant} d=0.6: {rate:8.0f} grids/s")


if __name__ == "__main__":
    main()
