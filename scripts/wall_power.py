"""Minimum detectable wall map of the headline probe and of the conditional wall test at the
demo's design: writes ``probes/wall_power.json`` (package data the report reads beside the "wall
map" verdict).

Two blocks: the top-level keys are the headline coordinate probe's pooled-AUC-minus-prior
statistic (``probes/wall_planting.py``); ``conditional`` is the conditional wall test's
(``probes/wall_test.py``, ``probes/wall_planting.py``): walls planted in each frame (absolute
cells, offsets from the agent) on the probing set's own grids, with density planted as real
anchors carry it, and per frame the minimum detectable strength and the bits per prior-uncertain
cell it carries. ``--skip-headline`` keeps the headline block of the existing ``--out`` file.

The power depends only on the design (grids, rows per grid, sizes, feature width, the headline
probe's settings), not on the agent or the run, so it is computed once here and committed;
``tests/probes/test_power.py`` checks that the stored design is the demo's.

    OMP_NUM_THREADS=1 python scripts/wall_power.py --signals 0,0.125,0.25,0.5 --seeds 0,1
    OMP_NUM_THREADS=1 python scripts/wall_power.py --skip-headline --strengths 0,0.125,0.25,0.5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from goalprobe.probes.cell_probes import CoordinateCellProbe
from goalprobe.probes.wall_planting import (
    PowerDesign,
    WallPowerDesign,
    demo_layouts,
    wall_power,
    wall_power_curve,
)

from goalprobe.config import demo_config
from goalprobe.runner import demo_provenance
from goalprobe.stages.probes import cell_params, estimator_params

OUT = Path(__file__).resolve().parents[1] / "probes" / "wall_power.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", default="0,0.125,0.25,0.5")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--strengths", default="0,0.125,0.25,0.5", help="conditional test's")
    parser.add_argument("--frames", default="absolute,agent")
    parser.add_argument("--skip-headline", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    p = demo_config("default").probes
    probe = CoordinateCellProbe(
        **cell_params("coordinate", p), **estimator_params(p.training, "cpu", p.seed, False)
    )
    probing = demo_config("default").probing.grids
    design = PowerDesign(
        n_grids=len(probing.sizes) * len(probing.densities) * probing.n_per_cell,
        sizes=probing.sizes,
        densities=probing.densities,
        grid_seed=probing.seed,  # the probing set's own grids (walls, goals)
        signals=tuple(float(s) for s in args.signals.split(",")),
        seeds=tuple(int(s) for s in args.seeds.split(",")),
        test_fraction=p.test_fraction,
    )
    started = time.perf_counter()
    if args.skip_headline:
        result = json.loads(args.out.read_text())
        result.pop("conditional", None)
    else:
        result = wall_power(probe, design)
        result["probe"] = repr(probe)
        result["seconds"] = time.perf_counter() - started
        result["provenance"] = demo_provenance(jobs=1, threads_per_worker=1)
    started = time.perf_counter()
    conditional_design = WallPowerDesign(
        strengths=tuple(float(s) for s in args.strengths.split(",")),
        seeds=design.seeds,
        frames=tuple(args.frames.split(",")),
        steps_per_grid=design.steps_per_grid,
        test_fraction=design.test_fraction,
    )
    conditional = wall_power_curve(demo_layouts(design), conditional_design)
    conditional["statistic"] = (
        "conditional wall test: held-out bits per prior-uncertain cell of the per-cell logistic "
        "probe with the size-and-density prior as offset, minus the same probe fitted on another "
        "same-size-and-density grid's anchors; detected when that and the within-grid AUC "
        "difference have 95% grid-bootstrap intervals above 0"
    )
    conditional["seconds"] = time.perf_counter() - started
    conditional["provenance"] = demo_provenance(jobs=1, threads_per_worker=1)
    result["conditional"] = conditional
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result.get(k) for k in ("detection", "minimum_detectable_effect")}))
    for frame, block in conditional["frames"].items():
        keys = ("detection", "bits_by_strength", "minimum_detectable_strength", "bits_at_mds")
        print(frame, json.dumps({k: block[k] for k in keys}))


if __name__ == "__main__":
    main()
