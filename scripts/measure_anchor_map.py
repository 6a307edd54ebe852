"""Measure what an agent's pre-reasoning anchors hold, with the toolkit's own commands.

Runs, for each ``--model`` (a bundled agent's name or a directory)::

    goalprobe grids   --sizes 7,9,11 --densities 0,...,1 --per-cell P --seed S1   (probing grids)
    goalprobe states  GRIDS --per-grid K --seed 1                                  (prompt-only)
    goalprobe extract STATES --model M --stages pre_reasoning --layers 0,1,2,3
    goalprobe train-probe STORE --probe per-cell --family mlp --layers 0,1,2,3
    goalprobe train-probe STORE --target position --layers 0,1,2,3
    goalprobe grids   --sizes 7,9,11 --densities 0,0.2,0.4,0.6 --per-cell Q --seed S2
    goalprobe patch   --grids PATCH_GRIDS --sites pre_reasoning --layers all,each
                      --directions cf_to_base --regenerate --backend hooks

and writes ``anchor_map.json`` into ``--out``: per model, per layer the per-cell MLP probe's cell
accuracy (grid cells), agent and goal top-1 localisation against the per-cell majority and the
shuffled-label control, the position probes' agent and goal top-1 (same test grids) against the size
prior and their shuffled control; per patched layer set the rate at which the regenerated action
moves into the counterfactual's optimal set (disjoint pairs) and changes at all (control pairs). The
grid seeds are never used in training (training draws its grids from its own stream).
Models measured before into the same ``--out`` with the same grid settings are kept in
``anchor_map.json`` (so agents can be measured one at a time); a model given again is
measured again.

Usage::

    python scripts/measure_anchor_map.py --model bundled --model bundled:map --out /tmp/anchors
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

PROBE_SEED = 8_100_001
PATCH_SEED = 8_200_001


def goalprobe(*args: object) -> None:
    command = ["goalprobe", *(str(a) for a in args)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def probe_figures(sweep: Path) -> dict:
    runs = json.loads(sweep.read_text(encoding="utf-8"))["runs"]
    out = {}
    for run in runs:
        models = run["metrics"]["models"]
        out[str(run["layer"])] = {
            name: {
                key: models[name][key]
                for key in ("accuracy_no_padding", "agent_top1", "goal_top1")
                if key in models[name]
            }
            for name in ("probe", "majority", "shuffled", "prior_size_density")
        } | {"n_test": run["n_test"], "n_test_grids": run["n_test_grids"]}
    return out


def position_figures(positions: Path) -> dict:
    out = {}
    for run in json.loads(positions.read_text(encoding="utf-8"))["runs"]:
        out[str(run["layer"])] = {
            target: {name: run[target]["models"][name]["top1"]
                     for name in ("probe", "prior_size", "shuffled")}
            for target in ("agent", "goal")
        }  # fmt: skip
    return out


def patch_figures(summary: Path) -> dict:
    out: dict = {}
    with summary.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["mode"] != "regenerated":
                continue
            entry = out.setdefault(row["layers"], {})
            if row["kind"] == "disjoint":
                entry["disjoint_into_cf_optimal"] = _rate(row, "into_source_optimal")
                entry["disjoint_changed"] = _rate(row, "action_changed")
                entry["n_disjoint"] = int(row["n_runs"])
            else:
                entry["control_changed"] = _rate(row, "action_changed")
                entry["n_control"] = int(row["n_runs"])
    return out


def _rate(row: dict, name: str) -> dict:
    """``{value, ci_low, ci_high}`` of a rate of ``patch_summary.csv`` (grid-bootstrap CI)."""
    return {
        "value": float(row[f"{name}_rate"]),
        "ci_low": float(row[f"{name}_ci_low"]),
        "ci_high": float(row[f"{name}_ci_high"]),
    }


def measure(model: str, out: Path, args: argparse.Namespace) -> dict:
    tag = model.replace(":", "_").replace("/", "_")
    states, store = out / "probe_states.jsonl", out / f"{tag}.h5"
    if not states.exists():
        goalprobe("grids", "--out", out / "probe_grids.jsonl", "--sizes", "7,9,11",
                  "--per-cell", args.probe_per_cell, "--seed", PROBE_SEED)  # fmt: skip
        goalprobe("states", out / "probe_grids.jsonl", "--out", states,
                  "--per-grid", args.per_grid, "--seed", 1)  # fmt: skip
    goalprobe("extract", states, "--model", model, "--stages", "pre_reasoning",
              "--layers", args.layers, "--out", store, "--overwrite")  # fmt: skip
    goalprobe("train-probe", store, "--out", out / f"probe_{tag}", "--probe", "per-cell",
              "--family", "mlp", "--layers", args.layers, "--no-progress",
              "--overwrite")  # fmt: skip
    goalprobe("train-probe", store, "--out", out / f"positions_{tag}", "--target", "position",
              "--layers", args.layers, "--overwrite")  # fmt: skip
    if not (out / "patch_grids.jsonl").exists():
        goalprobe("grids", "--out", out / "patch_grids.jsonl", "--sizes", "7,9,11",
                  "--densities", "0,0.2,0.4,0.6", "--per-cell", args.patch_per_cell,
                  "--seed", PATCH_SEED, "--min-distance", 3)  # fmt: skip
    goalprobe("patch", "--grids", out / "patch_grids.jsonl", "--model", model,
              "--out", out / f"patch_{tag}", "--sites", "pre_reasoning", "--layers", "all,each",
              "--directions", "cf_to_base", "--regenerate", "--max-new-tokens", 96,
              "--backend", "hooks", "--max-bases", 10_000, "--n-resamples", 200,
              "--overwrite")  # fmt: skip
    return {
        "probe": probe_figures(out / f"probe_{tag}" / "sweep.json"),
        "positions": position_figures(out / f"positions_{tag}" / "positions.json"),
        "patch": patch_figures(out / f"patch_{tag}" / "patch_summary.csv"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="repeatable")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--probe-per-cell", type=int, default=20, help="probing grids per cell")
    parser.add_argument("--per-grid", type=int, default=4, help="probing states per grid")
    parser.add_argument("--patch-per-cell", type=int, default=3, help="patch grids per cell")
    parser.add_argument("--layers", default="0,1,2,3", help="blocks probed")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "probe_grids": {"sizes": [7, 9, 11], "densities": "0-1", "per_cell": args.probe_per_cell,
                        "per_grid": args.per_grid, "seed": PROBE_SEED},
        "patch_grids": {"sizes": [7, 9, 11], "densities": [0, 0.2, 0.4, 0.6],
                        "per_cell": args.patch_per_cell, "seed": PATCH_SEED},
        "models": {},
    }  # fmt: skip
    previous = args.out / "anchor_map.json"
    if previous.is_file():
        before = json.loads(previous.read_text(encoding="utf-8"))
        if all(before.get(k) == result[k] for k in ("probe_grids", "patch_grids")):
            result["models"] = before["models"]
            print(f"kept from {previous}: {sorted(before['models'])}", flush=True)
    for model in args.model:
        result["models"][model] = measure(model, args.out, args)
    (args.out / "anchor_map.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result["models"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
