"""Benchmark: ``goalprobe score`` (``score_run``) on a run of about 1,000 steps (CPU, no model).

Builds the synthetic run of ``scripts/bench_viewer.py`` (grids of sizes 7-15 at the study's six
densities, a noisy optimal agent, step lines with study-length token-id lists, a real activation
store and one decoded-maps file over every row with noisy one-hot probabilities), then times
``score_run``: belief scoring of every decoded row (Acc GT/Dec, top-k for k = 1, 3, 5, 10,
belief-weighted scores) plus true and subjective MEG per grid, with 1,000 grid-bootstrap
resamples, serially and with ``--jobs`` worker processes.

    python scripts/bench_score.py --episodes 150 --jobs 2
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from pathlib import Path

from bench_viewer import build
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.probes.scoring.config import ScoreConfig

from goalprobe.stages.scoring import score_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=150, help="episodes (~8 steps each)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes of the 2nd run")
    parser.add_argument("--out", type=Path, default=Path("/tmp/goalprobe-bench-score"))
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    shutil.rmtree(args.out, ignore_errors=True)
    t = time.perf_counter()
    n_steps = build(args.out, args.episodes, prompt_len=1200, gen_len=300)
    print(f"built a run of {n_steps} steps in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    n_read = sum(
        len(ep.steps) for ep in read_trajectories(args.out / "rollouts/trajectories.jsonl")
    )
    print(f"reading the trajectory file alone: {time.perf_counter() - t:.2f} s ({n_read} steps)")

    for jobs in sorted({1, args.jobs}):
        config = ScoreConfig(meg_probe="mlp_pre_L15", n_jobs=jobs)
        t = time.perf_counter()
        summary = score_run(args.out, config)
        seconds = time.perf_counter() - t
        n_grids = summary.meg["overall"]["n_grids"]
        entry = summary.belief["probes"]["mlp_pre_L15"]
        print(
            f"score_run, n_jobs={jobs}: {seconds:.1f} s for {entry['n_steps']} steps and "
            f"{n_grids} grids ({1000 * seconds / entry['n_steps']:.1f} ms per step, all included)"
        )
    overall = entry["overall"]
    print(
        "  Acc GT {:.3f}, Acc Dec {:.3f}, Recovery {}, true MEG/decision {:.3f}".format(
            overall["acc_gt"]["value"],
            overall["acc_dec"]["value"],
            overall["recovery"]["value"],
            summary.meg["overall"]["true"]["meg_per_decision"]["value"],
        )
    )


if __name__ == "__main__":
    main()
