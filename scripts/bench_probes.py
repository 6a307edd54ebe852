"""Benchmark of the cell-type probes: factorised against materialised, and the study's scale.

Every measurement runs in a fresh subprocess (so peak memory is its own): it draws synthetic
activations with a planted map (``goalprobe.probes.wall_planting``), fits a general MLP probe for one epoch
and reports the epoch's wall time and the process's peak resident memory.

``compare`` times the two modes pairwise: for each of ``--pairs`` pairs, one materialised
subprocess then one factorised subprocess on the same N and the same data seed, so both sides of
every ratio ran back to back under the same load; it prints each pair's ratio and their median
(min - max). A ratio of two runs made at different times on a shared machine is not reported.

Usage::

    python scripts/bench_probes.py compare --pairs 3  # factorised vs materialised, same data
    python scripts/bench_probes.py study              # 30,000 x (3 x 2880) x 225, one epoch
    python scripts/bench_probes.py study --device cuda

Figures print as a table and as JSON lines (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _rss_mb() -> float:
    """Current resident memory of this process, in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> dict:
    """One measurement (runs inside the subprocess); ``epoch_s`` is the last epoch's time."""
    import numpy as np
    import torch
    from goalprobe.probes.cell_probes import CoordinateCellProbe
    from goalprobe.probes.wall_planting import planted_cell_data

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    sizes = tuple(range(7, 16, 2))
    data = planted_cell_data(
        args.examples // args.steps,
        steps_per_grid=args.steps,
        sizes=sizes,
        canvas=15,
        d_model=args.d_model,
        dtype=np.float16,
        chunk_rows=512,
        random_state=0,
    )
    generate_s = time.perf_counter() - started
    # warm-up: torch imports optimiser machinery on first use; keep it out of the figures
    warm = torch.nn.Parameter(torch.zeros(1))
    torch.optim.AdamW([warm]).step()
    rss_data = _rss_mb()
    peak_before = _peak_mb()
    probe = CoordinateCellProbe(
        family="mlp",
        hidden_size=args.hidden,
        max_epochs=args.epochs,
        batch_size=args.batch_size,
        early_stopping=args.early_stopping,
        materialise=args.materialise,
        device=args.device,
        progress=args.progress,
    )
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    probe.fit(data.acts, data.labels, groups=data.grid_ids)
    fit_s = time.perf_counter() - started
    out = {
        "mode": "materialised" if args.materialise else "factorised",
        "examples": int(data.acts.shape[0]),
        "features": int(data.acts.shape[1] * data.acts.shape[2]),
        "cells": int(data.labels.shape[1] ** 2),
        "hidden": args.hidden,
        "threads": args.threads,
        "device": args.device,
        "early_stopping": args.early_stopping,
        "generate_s": round(generate_s, 2),
        "epochs": len(probe.history_),
        "first_epoch_s": round(probe.history_[0]["seconds"], 4),
        "epoch_s": round(probe.history_[-1]["seconds"], 4),
        "fit_s": round(fit_s, 2),
        "train_loss": round(probe.history_[-1]["train_loss"], 4),
        "rss_data_mb": round(rss_data, 1),
        "peak_before_fit_mb": round(peak_before, 1),
        "peak_mb": round(_peak_mb(), 1),
        "fit_extra_peak_mb": round(max(_peak_mb() - rss_data, 0.0), 1),
        "acts_mb": round(data.acts.nbytes / 2**20, 1),
    }
    if args.device.startswith("cuda"):
        out["cuda_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def _run(examples: int, materialise: bool, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "worker",
        f"--examples={examples}",
        f"--d-model={args.d_model}",
        f"--hidden={args.hidden}",
        f"--threads={args.threads}",
        f"--batch-size={args.batch_size}",
        f"--steps={args.steps}",
        f"--device={args.device}",
        f"--epochs={args.epochs}",
    ]
    if materialise:
        cmd.append("--materialise")
    if args.early_stopping:
        cmd.append("--early-stopping")
    if args.progress:
        cmd.append("--progress")
    # as every goalprobe verb does (docs/benchmarks.md, "OpenMP wait policy"): busy-waiting
    # OpenMP threads stall a multi-threaded fit on a shared machine
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def _x(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _print(rows: list[dict], as_json: bool) -> None:
    cols = [
        "mode",
        "examples",
        "features",
        "cells",
        "first_epoch_s",
        "epoch_s",
        "fit_s",
        "peak_mb",
        "fit_extra_peak_mb",
        "acts_mb",
    ]
    print(" | ".join(f"{c:>17}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r.get(c, ''):>17}" for c in cols))
    if as_json:
        for r in rows:
            print(json.dumps(r))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["compare", "study", "worker"])
    parser.add_argument("--examples", type=int, default=30_000)
    parser.add_argument(
        "--d-model", type=int, default=2880, help="anchor width (GPT-OSS-20B: 2880)"
    )
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="steps per synthetic grid")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs per fit; epoch_s is the last one (default: compare 2, study 1)",
    )
    parser.add_argument("--materialise", action="store_true")
    parser.add_argument("--early-stopping", action="store_true", help="carve validation grids")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="compare: interleaved (materialised, factorised) pairs per materialised N",
    )
    parser.add_argument(
        "--factorised-examples",
        default="",
        help="compare: extra N for factorised-only runs (memory growth), e.g. 1000,4000,16000",
    )
    parser.add_argument(
        "--materialised-examples", default="250", help="compare: N for the materialised runs"
    )
    parser.add_argument("--json", action="store_true", help="also print JSON lines")
    args = parser.parse_args()
    if args.epochs is None:
        args.epochs = 2 if args.what == "compare" else 1
    if args.what == "worker":
        print(json.dumps(worker(args)))
        return
    if args.what == "study":
        args.early_stopping = True
        _print([_run(args.examples, False, args)], args.json)
        return
    fact_n = [int(x) for x in args.factorised_examples.split(",") if x]
    mat_n = [int(x) for x in args.materialised_examples.split(",") if x]
    rows, pairs = [], []
    for n in mat_n:
        for _ in range(args.pairs):
            m, f = _run(n, True, args), _run(n, False, args)
            rows += [m, f]
            pairs.append((m, f))
    rows += [_run(n, False, args) for n in fact_n if n not in mat_n]
    _print(rows, args.json)
    for n in mat_n:
        here = [(m, f) for m, f in pairs if m["examples"] == f["examples"] == n]
        if not here:
            continue
        print(f"N={n}, {len(here)} interleaved pairs (materialised, then factorised):")
        for key, what in (("epoch_s", "last epoch"), ("first_epoch_s", "first epoch")):
            ratios = [m[key] / f[key] for m, f in here]
            print(
                f"  {what}: factorised {_x(_median(ratios))} faster "
                f"(min {_x(min(ratios))}, max {_x(max(ratios))}; pairs: "
                + ", ".join(_x(r) for r in ratios)
                + ")"
            )
        mem = [m["fit_extra_peak_mb"] / max(f["fit_extra_peak_mb"], 1.0) for m, f in here]
        peak = [m["peak_mb"] / f["peak_mb"] for m, f in here]
        print(
            f"  fit working memory: {_median([m['fit_extra_peak_mb'] for m, _ in here]):.0f} MiB "
            f"(materialised) vs {_median([f['fit_extra_peak_mb'] for _, f in here]):.0f} MiB "
            f"(factorised), median ratio {_x(_median(mem))}; peak RSS "
            f"{_median([m['peak_mb'] for m, _ in here]):.0f} vs "
            f"{_median([f['peak_mb'] for _, f in here]):.0f} MiB ({_x(_median(peak))})"
        )
    fr = sorted(
        {r["examples"]: r for r in rows if r["mode"] == "factorised"}.values(),
        key=lambda r: r["examples"],
    )
    if len(fr) > 1:
        slope = (fr[-1]["peak_mb"] - fr[0]["peak_mb"]) / (fr[-1]["examples"] - fr[0]["examples"])
        print(
            f"factorised peak memory grows {slope * 1024:.1f} KiB per example "
            f"(acts alone: {fr[0]['acts_mb'] / fr[0]['examples'] * 1024:.1f} KiB per example)"
        )


if __name__ == "__main__":
    main()
