"""Time the demo's ``patching`` stage alone on a run's main rollouts (one agent).

Runs :func:`goalprobe.stages.patching.run` with the config of ``--scale`` (plus ``--set``
overrides) on ``RUN/rollouts/trajectories.jsonl`` of an existing run directory, in this process
with one torch thread, and prints the stage's wall and CPU time, the pairs kept and the anchors'
verdicts. Nothing in the run directory is touched: the stage writes into ``--out``.

Usage::

    python scripts/bench_patching_stage.py RUN --out DIR [--scale default]
        [--set patching.max_bases=16 ...]

``RUN`` needs the main rollouts (the ``grids`` and ``rollouts`` stages of ``goalprobe demo``).
To time code from another checkout, run this file with that checkout's interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="run directory holding the main rollouts")
    parser.add_argument("--out", type=Path, required=True, help="where the stage writes")
    parser.add_argument("--scale", default="default")
    parser.add_argument("--set", action="append", default=[], help="section.field=JSON value")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import goalprobe
    from goalprobe.config import demo_config, override
    from goalprobe.run_layout import RunLayout
    from goalprobe.stages import patching
    from goalprobe.stages.context import StageContext

    config = demo_config(args.scale)
    for item in args.set:
        key, _, value = item.partition("=")
        config = override(config, key, json.loads(value))
    print(f"code: {Path(goalprobe.__file__).parent}; {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"patching config: {config.patching}")
    args.out.mkdir(parents=True, exist_ok=True)
    context = StageContext(RunLayout(args.run), False, print)
    wall, cpu = time.perf_counter(), time.process_time()
    paths, counts = patching.run(context, patching.STAGE.receives(config), args.out)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"patching stage: {wall:.1f} s wall, {cpu:.1f} s CPU; {counts}")
    data = json.loads(Path(paths["results"]).read_text())
    print(f"preparation: {data['preparation']}; pairs kept: {data.get('n_pairs')}")
    for v in data.get("verdicts", []):
        moved = v["moved"]
        print(
            f"{v['site']:>15} {v['mode']:>14} {v['direction']}: n={v['n_pairs']} pairs "
            f"({v['n_grids']} grids), moved {moved['value']:.3f} [{moved['ci_low']}, "
            f"{moved['ci_high']}], random grid {v['random_grid']['value']}, invalid "
            f"{v['invalid']['value']:.3f}: {v['verdict']}"
        )


if __name__ == "__main__":
    main()
