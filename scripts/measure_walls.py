"""The conditional wall test in both frames on real agents' anchors (activation stores of the
probing set: ``goalprobe grids`` / ``states`` / ``extract --stages pre_reasoning``).

Writes, per store and layer, :func:`goalprobe.probes.wall_test.wall_readout`'s result (the
absolute and agent-centred frames, rings 1-3, probe against the same-size-and-density null,
verdicts with the committed power of ``probes/wall_power.json``) to ``--out`` as JSON, and
prints one line per frame and ring.

    OMP_NUM_THREADS=1 python scripts/measure_walls.py bundled=/tmp/w/bundled.h5 \\
        bundled:map=/tmp/w/bundled_map.h5 --out /tmp/w/walls.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from goalprobe.probes.probe_sweep import StoreProbeLoader
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.wall_test import WallTestConfig, wall_readout

POWER = Path(__file__).resolve().parents[1] / "probes" / "wall_power.json"


def _fmt(stat: dict, scale: float = 1.0, digits: int = 3) -> str:
    if stat.get("value") is None:
        return "n/a"
    v, lo, hi = (stat[k] * scale for k in ("value", "ci_low", "ci_high"))
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _line(name: str, block: dict) -> str:
    acc, bits, auc = block["accuracy"], block["bits"], block["auc_within_grid"]
    return (
        f"  {name:9s} acc probe {_fmt(acc['probe'], 100, 1)} null {_fmt(acc['null'], 100, 1)} "
        f"prior {_fmt(acc['prior'], 100, 1)} | bits probe-null {_fmt(bits['difference'])} "
        f"(probe {bits['probe']['value']:.3f}, null {bits['null']['value']:.3f}) | "
        f"AUC probe-null {_fmt(auc['difference'])} | cells/row {block['cells_per_row']:.1f} "
        f"| detected {block['detected']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+", help="NAME=PATH of an activation store")
    parser.add_argument("--layers", default=None, help="comma-separated (default: all stored)")
    parser.add_argument("--stage", default="pre_reasoning")
    parser.add_argument("--test-fraction", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"error: {args.out} exists (not overwritten)")
    power = json.loads(POWER.read_text()).get("conditional", {}).get("frames")
    results: dict = {"power_from": str(POWER) if power else None, "agents": {}}
    for spec in args.stores:
        name, _, path = spec.partition("=")
        if not path or not Path(path).is_file():
            sys.exit(f"error: {spec!r} is not NAME=PATH of a store")
        loader = StoreProbeLoader(path)
        layers = loader.layers if args.layers is None else [int(x) for x in args.layers.split(",")]
        for layer in layers:
            started = time.perf_counter()
            data = loader(args.stage, int(layer))
            split = split_by_grid(
                data.grid_ids,
                test_fraction=args.test_fraction,
                stratify=data.grid_sizes,
                random_state=args.seed,
            )
            res = wall_readout(
                data, split, config=WallTestConfig(random_state=args.seed), power=power
            )
            res["seconds"] = time.perf_counter() - started
            results["agents"].setdefault(name, {})[str(layer)] = res
            print(f"{name} layer {layer} ({res['seconds']:.0f} s)", flush=True)
            for frame, block in res["frames"].items():
                print(_line(frame, block["overall"]), res["verdicts"][frame]["verdict"])
                for ring, rb in block.get("rings", {}).items():
                    print(_line(f"ring {ring}", rb))
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
