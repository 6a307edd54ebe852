"""Benchmark: greedy generation of a bundled agent under eager attention against the SDPA sinks
kernel (agents/attention.py), same model, same prompts, alternating, in one process.

Prompts are the first ``--rows`` steps' prompts of a trajectory file cut to ``--prompt-tokens``
(equal lengths: one batch, no padding, as the rollouts' batches); each kernel generates
``--new-tokens`` tokens greedily ``--repeats`` times. Prints the seconds of each, the ratio,
whether the greedy tokens are the same and the largest logit difference on the prompts.

    python3 scripts/bench_attention.py runs/demo/rollouts/trajectories.jsonl --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trajectories", type=Path, help="a trajectory JSONL (goalprobe rollout)")
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=480)
    parser.add_argument("--new-tokens", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not args.trajectories.is_file():
        print(f"error: {args.trajectories}: no such trajectory file", file=sys.stderr)
        raise SystemExit(2)

    import torch
    from goalprobe.agents.attention import SINK_ATTENTION, set_attention
    from goalprobe.agents.models import load_model

    torch.set_num_threads(args.threads)
    prompts = []
    with args.trajectories.open() as lines:
        for line in lines:
            record = json.loads(line)
            ids = record.get("prompt_token_ids") or []
            if record.get("kind") == "step" and len(ids) >= args.prompt_tokens:
                prompts.append(ids[: args.prompt_tokens])
            if len(prompts) == args.rows:
                break
    if len(prompts) < args.rows:
        raise SystemExit(f"error: {args.trajectories} has {len(prompts)} long enough prompts")
    ids = torch.tensor(prompts)
    loaded = load_model(args.model, device="cpu")
    model, pad = loaded.model, loaded.tokenizer.pad_token_id
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({args.threads} thread(s)); {args.model}; {args.rows} rows x {args.prompt_tokens} "
        f"prompt tokens + {args.new_tokens} greedy tokens, {args.repeats} repeats each"
    )
    seconds: dict[str, list[float]] = {"eager": [], SINK_ATTENTION: []}
    outputs = {}
    for _ in range(args.repeats):
        for kernel in seconds:
            set_attention(model, kernel, "cpu")
            with torch.inference_mode():
                logits = model(ids[:8]).logits
                started = time.perf_counter()
                out = model.generate(
                    ids,
                    max_new_tokens=args.new_tokens,
                    min_new_tokens=args.new_tokens,
                    do_sample=False,
                    pad_token_id=pad,
                )
                seconds[kernel].append(time.perf_counter() - started)
            outputs[kernel] = (logits, out)
    (eager_logits, eager_out), (sink_logits, sink_out) = outputs.values()
    for kernel, times in seconds.items():
        print(f"{kernel}: " + ", ".join(f"{t:.2f} s" for t in times))
    ratio = min(seconds[SINK_ATTENTION]) / min(seconds["eager"])
    print(f"ratio {SINK_ATTENTION} / eager (best of each): {ratio:.2f}")
    same = float((eager_out == sink_out).float().mean())
    print(
        f"same greedy tokens: {same:.4f}; largest logit difference on the prompts: "
        f"{float((eager_logits - sink_logits).abs().max()):.2e}"
    )


if __name__ == "__main__":
    main()
