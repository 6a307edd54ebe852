"""The steering test (issue 39 item 6) on real agents' probing sets, outside the demo.

A probing set per agent: ``goalprobe grids --per-cell 14 --seed 1`` (the default demo's), then
``goalprobe states GRIDS --per-grid 4 --model M`` and ``goalprobe extract STATES --model M
--stages pre_reasoning``. Runs :func:`goalprobe.stages.steering.steer` (the stage's one path)
with the probes section's split (test fraction 0.25, seed 0 at the default scale) and writes
the results (with the per-state records) to ``--out``:

    OMP_NUM_THREADS=1 python scripts/measure_steering.py \\
        bundled:map=/tmp/steer/bundled_map.h5,/tmp/steer/states_bundled_map.jsonl \\
        bundled=/tmp/steer/bundled.h5,/tmp/steer/states_bundled.jsonl --out /tmp/steer/out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from goalprobe.agents.agent_config import Agent, AgentConfig
from goalprobe.probes.steering import CONDITIONS, SteeringConfig

from goalprobe.stages.steering import steer


def _rate(r: dict) -> str:
    if r.get("value") is None:
        return "n/a"
    return f"{100 * r['value']:.1f}% [{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("agents", nargs="+", help="MODEL=STORE,STATES")
    parser.add_argument("--max-states", type=int, default=0, help="0: every test state")
    parser.add_argument("--test-fraction", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"error: {args.out} exists (not overwritten)")
    torch.set_num_threads(1)
    config = dataclasses.replace(
        SteeringConfig(), max_states=args.max_states or None, seed=args.seed
    )
    results: dict = {}
    for spec in args.agents:
        model, _, paths = spec.partition("=")
        store, _, states = paths.partition(",")
        if not Path(store).is_file() or not Path(states).is_file():
            sys.exit(f"error: {spec!r} is not MODEL=STORE,STATES of existing files")
        loaded = Agent(AgentConfig(model=model)).loaded()
        started, cpu = time.perf_counter(), time.process_time()
        result, records = steer(
            Path(store), Path(states), loaded.model, loaded.tokenizer, config,
            test_fraction=args.test_fraction, seed=args.seed,
        )  # fmt: skip
        result["seconds"] = time.perf_counter() - started
        result["cpu_seconds"] = time.process_time() - cpu
        results[model] = {**result, "records": records}
        print(f"{model}: {result['n_states']} states on {result['n_grids']} grids "
              f"({result['seconds']:.0f} s, {result['cpu_seconds']:.0f} CPU s), dropped {result['dropped']}")  # fmt: skip
        for c in CONDITIONS:
            print(f"  success {c:10s} {_rate(result['rates'][c])}  "
                  f"invalid {_rate(result['invalid'][c])}")  # fmt: skip
        for c, d in result["differences"].items():
            print(f"  probe - {c:10s} {d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
                  f" p={d['p_draws']}")  # fmt: skip
        print(f"  read-out flips {result['read_flip']}; verdict {result['verdict']} "
              f"({result['reason']}; detectable {result['detectable']})")  # fmt: skip
        cal = result["calibration"]
        print(f"  calibration: multiple {cal['multiple']} train flip {cal['train_flip']}")
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
