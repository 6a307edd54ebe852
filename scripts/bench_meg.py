"""Benchmark: known-utility MEG for many 15 x 15 grid worlds at once (vectorised, CPU).

Generates real grids with :func:`goalprobe.gridworld.generator.generate_grid` (obstacle
densities cycling over the study's six), builds their tabular MDPs
(:func:`goalprobe.gridworld.optimal.build_mdp`, horizon ``ceil(1.5 L)``), and scores policies that
mix the optimal policy with the uniform one (``eps`` cycling over 0, 0.05, 0.2, 0.5, 1: optimal,
near-optimal, noisy, very noisy and random agents) against the goal utility. Times
:func:`goalprobe.probes.scoring.meg.known_utility_meg_batch` on deterministic next-state indices (grid and
MDP construction are not timed), and checks a sample against the single-MDP dense path.
Run: ``python3 scripts/bench_meg.py [--grids 1000] [--size 15] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
from goalprobe.gridworld.generator import STUDY_DENSITIES, generate_grid
from goalprobe.gridworld.optimal import build_mdp
from goalprobe.probes.scoring.meg import (
    MDPBatch,
    TabularMDP,
    known_utility_meg,
    known_utility_meg_batch,
    stack_padded,
)

EPSILONS = (0.0, 0.05, 0.2, 0.5, 1.0)


def build(n_grids: int, size: int, seed: int):
    """Grids -> ``(batch, policies, utilities, eps, mdps_for_check)``; dense MDPs are dropped."""
    seeds = np.random.SeedSequence(seed).spawn(n_grids)
    nexts, initials, horizons, policies, utilities, eps, sample = [], [], [], [], [], [], []
    for i in range(n_grids):
        grid = generate_grid(
            size, STUDY_DENSITIES[i % len(STUDY_DENSITIES)], np.random.default_rng(seeds[i])
        )
        mdp = build_mdp(grid)
        e = EPSILONS[i % len(EPSILONS)]
        pi = (1 - e) * mdp.optimal_policy_matrix() + e / mdp.n_actions
        nexts.append(mdp.transitions.argmax(axis=2))
        initials.append(mdp.initial)
        horizons.append(mdp.horizon)
        policies.append(pi)
        utilities.append(mdp.goal_utility())
        eps.append(e)
        if i < 20:
            sample.append(TabularMDP(mdp.transitions, mdp.initial, mdp.horizon))
    n_s = max(len(x) for x in initials)
    loops = np.broadcast_to(np.arange(n_s)[:, None], (n_s, 4))
    next_state = np.stack([np.concatenate([n, loops[len(n) :]]) for n in nexts])
    batch = MDPBatch(stack_padded(initials, n_s, 0.0), np.array(horizons), next_state=next_state)
    return (
        batch,
        stack_padded(policies, n_s, 0.25),
        stack_padded(utilities, n_s, 0.0),
        np.array(eps),
        sample,
        (policies[:20], utilities[:20]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, default=1000)
    parser.add_argument("--size", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}, numpy {np.__version__}"
    )
    start = time.perf_counter()
    batch, policies, utilities, eps, sample, (sample_pi, sample_u) = build(
        args.grids, args.size, args.seed
    )
    print(
        f"{args.grids} grids {args.size}x{args.size} (setup {time.perf_counter() - start:.1f} s, "
        f"not timed): S padded to {batch.n_states}, horizon H = ceil(1.5 L) in "
        f"[{batch.horizon.min()}, {batch.horizon.max()}], mean {batch.horizon.mean():.1f}"
    )
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        res = known_utility_meg_batch(batch, policies, utilities)
        times.append(time.perf_counter() - start)
    print(
        f"known_utility_meg_batch: best {min(times):.2f} s, median {np.median(times):.2f} s over "
        f"{args.repeats} runs ({1e3 * min(times) / args.grids:.2f} ms per grid)"
    )
    finite = np.isfinite(res.beta) & (res.beta != 0)
    print(
        f"regimes: beta=+inf {int(np.sum(res.beta == np.inf))}, finite {int(finite.sum())}, "
        f"beta=0 {int(np.sum(res.beta == 0))}; all converged: {bool(res.converged.all())}; "
        f"soft passes per finite grid: mean {res.iterations[finite].mean():.1f}, "
        f"max {res.iterations.max()}"
    )
    print(f"{'eps':>5} {'mean MEG (nats)':>16} {'mean MEG / H':>13} {'median beta':>12}")
    for e in EPSILONS:
        sel = eps == e
        print(
            f"{e:>5} {res.meg[sel].mean():>16.3f} {(res.meg[sel] / res.n_decisions[sel]).mean():>13.3f} "
            f"{np.median(res.beta[sel]):>12.3f}"
        )
    start = time.perf_counter()
    single = [
        known_utility_meg(m, p, u).meg for m, p, u in zip(sample, sample_pi, sample_u, strict=True)
    ]
    per_single = (time.perf_counter() - start) / len(sample)
    dense = MDPBatch.from_mdps(sample, deterministic=False)
    n_s = dense.n_states
    dense_meg = known_utility_meg_batch(
        dense, stack_padded(sample_pi, n_s, 0.25), stack_padded(sample_u, n_s, 0.0)
    ).meg
    diff = max(
        np.max(np.abs(np.array(single) - res.meg[: len(sample)])),
        np.max(np.abs(dense_meg - res.meg[: len(sample)])),
    )
    print(
        f"check on {len(sample)} grids: one at a time with known_utility_meg "
        f"{1e3 * per_single:.1f} ms per grid; max |MEG difference| to the batch, one-at-a-time "
        f"and dense (B, S, A, S) batch: {diff:.2e}"
    )


if __name__ == "__main__":
    main()
