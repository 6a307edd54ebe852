"""One batched generation of the bundled agent (the unit of every rollout), timed.

Usage::

    python scripts/bench_generate.py --batch 8 --threads 2 --size 9

Prints the seconds of one ``LocalBackend.generate`` call after a warm-up call (model load and
the shared prefix not counted) and the tokens generated. Run it under different environments
(e.g. ``OMP_WAIT_POLICY=ACTIVE`` vs ``PASSIVE``) side by side to compare them under the same load.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size", type=int, default=9, help="grid side")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls")
    args = parser.parse_args()

    import torch
    from goalprobe.agents.backend import SamplingConfig
    from goalprobe.agents.local_backend import LocalBackend
    from goalprobe.agents.prompts import build_messages
    from goalprobe.gridworld.dynamics import initial_state
    from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
    from goalprobe.gridworld.text import render

    torch.set_num_threads(args.threads)
    grids = generate_grid_set(GridSetConfig((args.size,), (0.2,), args.batch, seed=5))
    backend = LocalBackend.from_pretrained("bundled")
    batch = [
        build_messages(render(g, initial_state(g)), variant=g.variant, has_key=False) for g in grids
    ]
    sampling = SamplingConfig(
        temperature=0.7, top_p=0.95, max_new_tokens=256, reasoning_effort="low", seed=0
    )
    backend.generate(batch[:1], sampling, seeds=[0])  # warm-up: the shared prefix's KV cache
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = backend.generate(batch, sampling, seeds=list(range(len(batch))))
        seconds = time.perf_counter() - start
        tokens = sum(len(o.generated_token_ids) for o in out)
        print(
            f"batch {len(batch)}, {tokens} tokens: {seconds:.2f} s ({tokens / seconds:.0f} tok/s)"
        )


if __name__ == "__main__":
    main()
