"""Time what reasoning-chunk patching (issue 30) adds to the demo's ``patching`` stage.

Prepares the counterfactual pairs of a run's main rollouts with the ``--scale`` config (fewer
bases: the chunks touch only the first ``chunk_pairs`` pairs of each kind), then runs
:func:`goalprobe.probes.patching.patched_runs.run_patching` on the same prepared pairs at the
anchors only, without and with the reasoning chunks (at the block the run's decision read-out
picks), and prints the wall and CPU time of each, their difference and the chunk verdicts.
One torch thread; nothing in the run directory is written.

Usage::

    python scripts/bench_chunk_patching.py RUN [--scale default] [--bases 40] [--agent bundled:map]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="run directory (rollouts and decision stages)")
    parser.add_argument("--scale", default="default")
    parser.add_argument("--bases", type=int, default=40, help="bases drawn (default 40)")
    parser.add_argument("--agent", default=None, help="bundled agent name (default: bundled)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from goalprobe.activations.capture import make_backend
    from goalprobe.agents.agent_config import AgentConfig
    from goalprobe.agents.bundled import load_bundled_agent
    from goalprobe.probes.patching.counterfactuals import (
        CounterfactualConfig,
        build_counterfactuals,
    )
    from goalprobe.probes.patching.experiment import PatchConfig, PatchingContext, prepare_pairs
    from goalprobe.probes.patching.patched_runs import run_patching
    from goalprobe.probes.patching.results import anchor_verdicts
    from goalprobe.probes.patching.run import draw_bases, read_trajectory_bases

    from goalprobe.config import demo_config
    from goalprobe.run_layout import RunLayout
    from goalprobe.stages.patching import readout_peak

    section = demo_config(args.scale).patching
    p = section.patch
    layout = RunLayout(args.run)
    agent = args.agent or AgentConfig().model
    model, tokenizer = load_bundled_agent(directory=agent)
    peak = readout_peak(layout.decision_lens, int(model.config.num_hidden_layers))
    read = read_trajectory_bases(layout.trajectories)
    bases = draw_bases(read.bases, args.bases, p.seed)
    pairs = build_counterfactuals(
        bases, CounterfactualConfig(disjoint_per_move=1, control_per_move=0, random_state=p.seed)
    ) + build_counterfactuals(
        bases[: section.control_bases],
        CounterfactualConfig(disjoint_per_move=0, control_per_move=1, random_state=p.seed),
    )
    config = PatchConfig(
        sites=("pre_reasoning",),
        layers=("all",),
        anchor_sites=("pre_reasoning",),
        full_pairs=0,
        max_new_tokens=p.max_new_tokens,
        batch_size=p.batch_size,
        regenerate=False,
        regenerate_batch_size=p.regenerate_batch_size,
        reasoning_effort=read.reasoning_effort,
        reasoning_chunks=p.reasoning_chunks,
        chunk_layers=(str(peak["layer"]),),
        chunk_pairs=p.chunk_pairs,
        seed=p.seed,
    )
    backend = make_backend("nnsight", model, tokenizer)
    start = time.perf_counter()
    prepared, report = prepare_pairs(pairs, PatchingContext(backend, config))
    print(f"agent {agent}; peak {peak}; prepared {report.to_dict()} in "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    times = {}
    for chunks in (0, p.reasoning_chunks):
        context = PatchingContext(backend, dataclasses.replace(config, reasoning_chunks=chunks))
        wall, cpu = time.perf_counter(), time.process_time()
        records, skipped = run_patching(prepared, context)
        times[chunks] = (time.perf_counter() - wall, time.process_time() - cpu)
        print(f"reasoning_chunks={chunks}: {len(records)} records, {times[chunks][0]:.1f} s "
              f"wall, {times[chunks][1]:.1f} s CPU; skipped {dict(skipped)}")  # fmt: skip
    added = [b - a for a, b in zip(times[0], times[p.reasoning_chunks], strict=True)]
    print(f"added by the chunks: {added[0]:.1f} s wall, {added[1]:.1f} s CPU")
    label = str(peak["layer"])
    sites = sorted({r.site for r in records if r.site.startswith("reasoning_chunk_")})
    confidence = 1 - 0.05 / len(sites)  # Bonferroni over the chunks, as the stage
    for v in anchor_verdicts(
        records, layers=label, sites=sites, n_resamples=1000, confidence=confidence
    ):
        print(f"{v['site']}: n={v['n_pairs']} moved {v['moved']['value']} "
              f"[{v['moved']['ci_low']}, {v['moved']['ci_high']}] invalid "
              f"{v['invalid']['value']} random {v['random_grid']['value']} controls changed "
              f"{v['control_changed']['value']} (n={v['control_changed']['n']}) -> "
              f"{v['verdict']}")  # fmt: skip


if __name__ == "__main__":
    main()
