"""Minimum detectable wall map of the headline probe at the demo's design: writes
``probes/wall_power.json`` (package data the report reads beside the "wall map" verdict).

The power depends only on the design (grids, rows per grid, sizes, feature width, the headline
probe's settings), not on the agent or the run, so it is computed once here and committed;
``tests/probes/test_power.py`` checks that the stored design is the demo's.

    OMP_NUM_THREADS=1 python scripts/wall_power.py --signals 0,0.125,0.25,0.5 --seeds 0,1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from goalprobe.probes.cell_probes import CoordinateCellProbe
from goalprobe.probes.power import PowerDesign, wall_power

from goalprobe.config import demo_config
from goalprobe.provenance import demo_provenance
from goalprobe.stages.probes import cell_params, estimator_params

OUT = Path(__file__).resolve().parents[1] / "probes" / "wall_power.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", default="0,0.125,0.25,0.5")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--out", type=Path, default=OUT)
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
    result = wall_power(probe, design)
    result["probe"] = repr(probe)
    result["seconds"] = time.perf_counter() - started
    result["provenance"] = demo_provenance(jobs=1, threads_per_worker=1)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("detection", "minimum_detectable_effect")}))


if __name__ == "__main__":
    main()
