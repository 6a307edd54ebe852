"""Benchmark: plan-decoder training throughput (examples/s) on CPU.

Trains :class:`goalprobe.probes.plan_decoder.PlanDecoder` on random activations for a fixed number of
epochs (no validation, so no early stopping) and prints examples per second of training, for
the study's width (d_model 2880, bottleneck 1024) and a small one, at 1, 2 and 4 decoder
layers. Run: ``python3 scripts/bench_plan_decoder.py [--examples 256] [--epochs 2]``.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch
from goalprobe.probes.plan_decoder import PlanDecoder
from goalprobe.probes.plan_metrics import encode_plans


def bench(d_model: int, d_bottleneck: int, n_layers: int, examples: int, epochs: int, device: str):
    """Seconds and examples/s of ``epochs`` training epochs on random data."""
    rng = np.random.default_rng(0)
    acts = rng.normal(size=(examples, 3, d_model)).astype(np.float16)
    plans = encode_plans([rng.integers(0, 4, rng.integers(0, 13)) for _ in range(examples)])
    decoder = PlanDecoder(
        n_layers=n_layers,
        d_bottleneck=d_bottleneck,
        max_epochs=epochs,
        batch_size=64,
        device=device,
        random_state=0,
    )
    # warm-up: one epoch on a small slice (allocator, kernels)
    PlanDecoder(**{**decoder.get_params(), "max_epochs": 1}).fit(acts[:64], plans[:64])
    start = time.perf_counter()
    decoder.fit(acts, plans)
    seconds = time.perf_counter() - start
    return seconds, examples * epochs / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.processor() or platform.machine()}, {args.threads} torch threads, "
        f"torch {torch.__version__}, device {args.device}"
    )
    print(f"{args.examples} examples x {args.epochs} epochs, batch 64, 3 tokens per example")
    print(f"{'d_model':>8} {'d_bottleneck':>12} {'layers':>6} {'seconds':>8} {'examples/s':>11}")
    for d_model, d_bottleneck in ((2880, 1024), (256, 128)):
        for n_layers in (1, 2, 4):
            seconds, rate = bench(
                d_model, d_bottleneck, n_layers, args.examples, args.epochs, args.device
            )
            print(f"{d_model:>8} {d_bottleneck:>12} {n_layers:>6} {seconds:>8.2f} {rate:>11.1f}")


if __name__ == "__main__":
    main()
