"""The positive control's belief loop on walls at a larger n than the demo's (issue 39).

Rolls ``bundled:map`` out on fresh grids (``--grid-seed``, ``--per-cell`` grids per size x
density, the demo's rollout settings), extracts its activations, decodes them with the headline
read-out of an existing demo run's control (its probing-set probes and wall read-outs, trained on
other grids: ``RUN/control/probes`` and ``RUN/control/probing`` are copied), and scores the
headline maps as the demo's scoring stage does. Prints Acc. GT, Acc. Dec., the excess over the
prior map and over another grid's map, and the prior map's ceiling (the true walls with the same
agent/goal read-out).

    python3 scripts/measure_control_belief.py RUN OUT --per-cell 10   # 300 grids, ~8 min

docs/map_agent.md ("Sixth session") records the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from goalprobe.probes.scoring.config import ScoreConfig

from goalprobe.config import control_config, demo_config, from_dict, override
from goalprobe.run_layout import RunLayout
from goalprobe.scheduler import StageBook, run_in_order
from goalprobe.stages.decode import write_headline_maps
from goalprobe.stages.scoring import score_run


def fail(message: str) -> None:
    """One line on stderr and exit code 2, as the verbs do."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished default demo run (with control/)")
    parser.add_argument("out", type=Path, help="new run directory (resumed when it exists)")
    parser.add_argument("--per-cell", type=int, default=10, help="grids per size x density")
    parser.add_argument("--grid-seed", type=int, default=2, help="seed of the fresh grids")
    args = parser.parse_args()
    src = args.run / "control"
    if not (src / "probes").is_dir() or not (src / "scoring/config.json").is_file():
        fail(f"{src}: not a finished demo run's control (no probes/ or scoring/)")
    if args.grid_seed in (0, 1):
        fail("--grid-seed 0 and 1 are the demo's rollout and probing grids")
    config = control_config(demo_config("default"))
    config = override(config, "grids.n_per_cell", args.per_cell)
    config = override(config, "grids.seed", args.grid_seed)
    layout = RunLayout(args.out)
    start = time.perf_counter()
    book = StageBook(
        layout, config, set(), True, print, stages=("grids", "rollouts", "activations")
    )
    run_in_order([book], progress=False)
    for name in ("probes", "probing"):  # the demo run's read-out, trained on other grids
        if not (args.out / name).exists():
            shutil.copytree(src / name, args.out / name, ignore=shutil.ignore_patterns("decoded"))
    if write_headline_maps(layout) is None:
        fail(f"{src / 'probes'}: no headline read-out to decode with")
    shutil.rmtree(layout.root / "scoring", ignore_errors=True)
    saved = json.loads((src / "scoring/config.json").read_text())["config"]
    saved["decoded_maps"] = ["headline_pre_reasoning_L2"]
    score_run(layout, from_dict(ScoreConfig, saved), progress=False)
    belief = json.loads(layout.belief.read_text())
    entry = belief["probes"][belief["default_probe"]]
    nulls = entry["nulls"]
    print(
        json.dumps(
            {
                "n_steps": entry["n_steps"],
                "n_grids": entry["n_grids"],
                "acc_gt": entry["overall"]["acc_gt"],
                "acc_dec": entry["overall"]["acc_dec"],
                "excess_over_prior": nulls["prior"]["excess"]["acc_dec"],
                "ceiling_over_prior": nulls["prior"]["ceiling"],
                "excess_over_other_grid": nulls["other_grid"]["excess"]["acc_dec"],
                "seconds": round(time.perf_counter() - start, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
