"""Benchmark activation patching on the CPU and print its figures.

Model: the bundled agent, or, while it is not trained yet, a random GPT-OSS of the bundled
agent's shape (the printout says which). Pairs: counterfactuals of 7 x 7 grids (the study's
size) with oracle reasoning (no generation), both directions.

Figures:

1. clean forward passes per second (one sequence, residual stream captured at every site);
2. patched forward passes per second, per site and backend, batched (``--batch-size`` copies of
   the target per pass): nnsight and plain hooks with their prefix KV cache, nnsight without
   it, TransformerLens;
3. the whole experiment (``prepare_pairs`` + ``run_patching``): pairs and patched runs per second.

Usage::

    python scripts/bench_patching.py [--pairs 4] [--batch-size 16] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch


def load_agent():
    """``(model, tokenizer, description)``: the bundled agent, else its untrained shape."""
    from goalprobe.agents.bundled import load_bundled_agent

    try:
        model, tokenizer = load_bundled_agent()
        return model, tokenizer, "bundled agent (trained weights)"
    except FileNotFoundError:
        from goalprobe.agents.bundled import BundledModelConfig, gpt_oss_config
        from goalprobe.agents.tokenizer import build_tokenizer
        from transformers import GptOssForCausalLM

        tokenizer = build_tokenizer()
        torch.manual_seed(0)
        model = GptOssForCausalLM(gpt_oss_config(BundledModelConfig(), tokenizer)).eval()
        return model, tokenizer, "random GPT-OSS of the bundled agent's shape (agent not trained)"


def best_time(fn, repeats: int) -> float:
    """Fastest of ``repeats`` wall-clock timings of ``fn()`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="counterfactual pairs")
    parser.add_argument("--batch-size", type=int, default=16, help="patched copies per pass")
    parser.add_argument("--repeats", type=int, default=3, help="timings per figure (best kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from goalprobe.activations.capture import Patch, make_backend
    from goalprobe.gridworld.generator import generate_grid
    from goalprobe.probes.patching.counterfactuals import (
        CounterfactualConfig,
        base_from_grid,
        build_counterfactuals,
    )
    from goalprobe.probes.patching.experiment import (
        PatchConfig,
        PatchingContext,
        prepare_pairs,
    )
    from goalprobe.probes.patching.patched_runs import run_patching
    from goalprobe.probes.patching.sites import DEFAULT_SITES, site_positions

    model, tokenizer, description = load_agent()
    n_layers = model.config.num_hidden_layers
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {args.threads} thread(s)"
    )
    print(f"model: {description}; {n_layers} blocks, d_model {model.config.hidden_size}")

    grids = [
        generate_grid(7, 0.5, np.random.default_rng(seed), grid_id=f"b{seed}", min_distance=3)
        for seed in range(args.pairs)
    ]
    pairs = build_counterfactuals(
        [base_from_grid(g) for g in grids],
        CounterfactualConfig(moves=("agent",), disjoint_per_move=1, control_per_move=0),
    )[: args.pairs]
    config = PatchConfig(
        sites=DEFAULT_SITES,
        layers=("each", "all"),
        reasoning="oracle",
        require_optimal=False,
        batch_size=args.batch_size,
    )
    nnsight_backend = make_backend("nnsight", model, tokenizer)
    context = PatchingContext(nnsight_backend, config)
    start = time.perf_counter()
    prepared, _ = prepare_pairs(pairs, context)
    prepare_s = time.perf_counter() - start
    item = prepared[0]
    target, source = item.base, item.cf
    print(
        f"sequence length: {len(target.sequence)} tokens (prompt {target.sequence.prompt_length})"
    )

    # 1. clean runs
    positions = np.arange(len(target.sequence))
    clean_s = best_time(
        lambda: nnsight_backend.clean_run(target.sequence.token_ids, range(n_layers), positions),
        args.repeats,
    )
    print(f"\nclean forward + capture (all layers, all positions): {1 / clean_s:.1f} / s")

    # 2. patched forwards per site
    backends = {
        "nnsight (prefix cache)": nnsight_backend,
        "nnsight (full pass)": make_backend("nnsight", model, tokenizer, prefix_cache=False),
        "hooks (prefix cache)": make_backend("hooks", model, tokenizer),
        "transformer_lens": make_backend("transformer_lens", model, tokenizer),
    }
    print(f"\npatched forward passes per second (batch {args.batch_size}, one layer each):")
    header = f"{'site':<16}" + "".join(f"{name:>26}" for name in backends)
    print(header)
    for site in DEFAULT_SITES:
        src_pos, tgt_pos = site_positions(
            source.sequence, target.sequence, site, item.pair.changed_cells
        )
        patches = [
            Patch(
                (i % n_layers,),
                torch.as_tensor(tgt_pos),
                source.clean.values([i % n_layers], src_pos),
            )
            for i in range(args.batch_size)
        ]
        row = f"{site:<16}"
        for backend in backends.values():
            seconds = best_time(
                lambda b=backend, p=patches: b.patched_logits(target.sequence.token_ids, p),
                args.repeats,
            )
            row += f"{args.batch_size / seconds:>26.1f}"
        print(row)

    # 3. whole experiment
    start = time.perf_counter()
    records, _ = run_patching(prepared, context)
    run_s = time.perf_counter() - start
    print(
        f"\nexperiment ({len(prepared)} pairs x 2 directions x {len(DEFAULT_SITES)} sites x "
        f"{len(context.layer_sets)} layer sets, nnsight): prepare {prepare_s:.1f} s "
        f"({len(prepared) / prepare_s:.2f} pairs/s), patch {run_s:.1f} s for {len(records)} "
        f"runs ({len(records) / run_s:.1f} patched runs/s)"
    )


if __name__ == "__main__":
    main()
