"""What a map agent's anchors hold of the walls around A, three ways (issue 39, item 4).

For each ``--model`` (a bundled agent's name or a directory):

1. **Anchors, agent-centred.** The probing set of ``scripts/measure_anchor_map.py`` (``goalprobe
   grids`` sizes 7, 9, 11 at densities 0-1, seed 8100001; ``states``; ``extract --stages
   pre_reasoning``), then :func:`goalprobe.probes.wall_test.conditional_wall_test` in the agent
   frame per block: bits per prior-uncertain cell of the probe minus the same probe fitted on
   another grid's anchors of the same size and density, by ring (the instrument's rings: the
   cells k steps from A, the copy line's rings 1 and 2); the position probe
   (``goalprobe train-probe --target position``) for A and G.
2. **The copy line.** Greedy completions on fresh grids (sizes 7, 9, 11 at densities 0-1, seed
   8300001, one epsilon-optimal state each); the symbols of ``The walls by A:``
   (:func:`goalprobe.agents.reasoning.parse_near`) against the true grid, per Manhattan ring,
   on every cell and on the prior-uncertain ones, beside the prior's majority call (the wall
   frequency given variant, size and density).
3. **Behaviour** (``--behaviour``): the model card's protocol restricted to sizes 7-11 at
   densities <= 0.4 (the same held-out grids as the card's cells: 4 grids x 3 episodes).

Writes ``walls.json`` into ``--out``. Usage::

    OMP_NUM_THREADS=1 python scripts/measure_map_walls.py --model bundled:map --model DIR \\
        --out /tmp/walls --per-cell 10 --copy-per-cell 6 --behaviour
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from agent_training.evaluation import EvaluationConfig, evaluate_agent, quality_status
from agent_training.map_supervision import prior_wall_frequency
from agent_training.training_data import make_example, sample_state
from goalprobe.agents.bundled import load_bundled_agent
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.reasoning import NEAR_OFFSETS, near_symbols, parse_near
from goalprobe.gridworld.core import SYMBOL_TO_CELL, Action, CellType, Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.probe_sweep import StoreProbeLoader
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.wall_test import (
    WallTestConfig,
    conditional_wall_test,
    wall_inputs,
)

from goalprobe.stats import GridBootstrap

PROBE_SEED = 8_100_001
COPY_SEED = 8_300_001
DENSITIES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def goalprobe(*args: object) -> None:
    command = ["goalprobe", *(str(a) for a in args)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def _strip(block: dict) -> dict:
    return {k: v for k, v in block.items() if k not in ("probe", "null")}


def anchor_walls(model: str, tag: str, out: Path, args: argparse.Namespace) -> dict:
    """The agent-centred wall test and the position probes at the anchors, per block."""
    states, store = out / "probe_states.jsonl", out / f"{tag}.h5"
    if not states.exists():
        goalprobe("grids", "--out", out / "probe_grids.jsonl", "--sizes", "7,9,11",
                  "--per-cell", args.per_cell, "--seed", PROBE_SEED)  # fmt: skip
        goalprobe("states", out / "probe_grids.jsonl", "--out", states,
                  "--per-grid", args.per_grid, "--seed", 1)  # fmt: skip
    goalprobe("extract", states, "--model", model, "--stages", "pre_reasoning",
              "--layers", args.layers, "--out", store, "--overwrite")  # fmt: skip
    goalprobe("train-probe", store, "--out", out / f"positions_{tag}", "--target", "position",
              "--layers", args.layers, "--overwrite")  # fmt: skip
    positions = json.loads((out / f"positions_{tag}" / "positions.json").read_text())
    result: dict = {"positions": {}, "walls": {}}
    for run in positions["runs"]:
        result["positions"][str(run["layer"])] = {
            target: {name: run[target]["models"][name]["top1"]
                     for name in ("probe", "prior_size", "shuffled")}
            for target in ("agent", "goal")
        }  # fmt: skip
    loader = StoreProbeLoader(store)
    for layer in [int(x) for x in args.layers.split(",")]:
        started = time.perf_counter()
        data = loader("pre_reasoning", layer)
        split = split_by_grid(
            data.grid_ids, test_fraction=0.25, stratify=data.grid_sizes, random_state=0
        )
        X = wall_inputs(data.acts, data.grid_sizes, data.densities, data.agent_row_col)
        config = WallTestConfig(frame="agent", random_state=0)
        res = conditional_wall_test(
            X, data.cell_types, data.grid_ids, split.train, split.test, config
        )
        result["walls"][str(layer)] = {
            "n_train_grids": res["n_train_grids"],
            "overall": res["overall"],
            "rings": res["rings"],
            "seconds": time.perf_counter() - started,
        }
        r = result["walls"][str(layer)]
        for name in ("1", "2", "3"):
            _print_block(
                f"{tag} block {layer} ring {name} (cells {name} steps from A)", r["rings"][name]
            )
    return result


def _print_block(name: str, block: dict) -> None:
    bits, acc = block["bits"], block["accuracy"]
    d = bits["difference"]
    print(
        f"{name}: bits probe-null {d['value']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]; "
        f"acc probe {acc['probe']['value']:.3f} null {acc['null']['value']:.3f} "
        f"prior {acc['prior']['value']:.3f}; cells/row {block['cells_per_row']:.1f}",
        flush=True,
    )


def copy_line(model_name: str, args: argparse.Namespace) -> dict:
    """Accuracy of the copy line's symbols against the true grid (greedy completions)."""
    model, tokenizer = load_bundled_agent("cpu", model_name)
    tokenizer.padding_side = "left"
    grids = generate_grid_set(
        GridSetConfig(sizes=(7, 9, 11), densities=DENSITIES, n_per_cell=args.copy_per_cell,
                      variant=Variant.PLAIN, seed=COPY_SEED)
    )  # fmt: skip
    rng = np.random.default_rng(COPY_SEED)
    rows = []
    for grid in grids:
        policy = solve(grid)
        if not policy.is_solvable:
            continue
        state = sample_state(grid, policy, 0.3, rng)
        example = make_example(grid, state, (Action.UP,))
        rows.append((grid, state, example.prompt))
    texts: list[str] = []
    for size in sorted({g.size for g, _, _ in rows}):
        chunk = [r for r in rows if r[0].size == size]
        for start in range(0, len(chunk), 16):
            prompts = [p for _, _, p in chunk[start : start + 16]]
            enc = tokenizer(prompts, add_special_tokens=False, return_tensors="pt", padding=True)
            with torch.no_grad():
                ids = model.generate(
                    **enc, max_new_tokens=args.max_new_tokens, do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )  # fmt: skip
            texts += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :])
    ordered = [
        r for size in sorted({g.size for g, _, _ in rows}) for r in rows if r[0].size == size
    ]
    ring = np.abs(np.asarray(NEAR_OFFSETS)).sum(axis=1)
    correct = np.zeros((len(ordered), len(NEAR_OFFSETS)), dtype=bool)
    prior_correct = correct.copy()
    uncertain = correct.copy()
    has_line = np.zeros(len(ordered), dtype=bool)
    for i, ((grid, state, _), text) in enumerate(zip(ordered, texts, strict=True)):
        named = parse_near(text)
        truth = [SYMBOL_TO_CELL[s] for s in near_symbols(grid, state)]
        freq = prior_wall_frequency(grid)
        for j, (d_row, d_col) in enumerate(NEAR_OFFSETS):
            r, c = state.agent[0] + d_row, state.agent[1] + d_col
            inside = 0 <= r < grid.size and 0 <= c < grid.size
            wall_truth = truth[j] == CellType.WALL
            p = freq[r, c] if inside else 1.0
            uncertain[i, j] = inside and 0 < p < 1
            prior_correct[i, j] = (p > 0.5) == wall_truth
            if named is not None:
                has_line[i] = True
                correct[i, j] = named[j] == truth[j]
    ids = np.asarray([g.grid_id for g, _, _ in ordered])
    boot = GridBootstrap.from_grid_ids(ids, n_resamples=1000, random_state=0)
    out = {"n_states": len(ordered), "with_copy_line": int(has_line.sum()), "rings": {}}
    for k in (1, 2):
        cols = ring == k
        block = {}
        for cells, sel in (("all", np.ones_like(uncertain)), ("uncertain", uncertain)):
            sel = sel[:, cols]
            n = sel.sum(axis=1).astype(float)
            block[cells] = {
                "copy": boot.rate_summary((correct[:, cols] & sel).sum(axis=1), n),
                "prior_majority": boot.rate_summary((prior_correct[:, cols] & sel).sum(axis=1), n),
            }
        out["rings"][str(k)] = block
        u = block["uncertain"]
        print(
            f"{model_name} copy line ring {k}: all {block['all']['copy']['value']:.3f}; "
            f"uncertain cells {u['copy']['value']:.3f} [{u['copy']['ci_low']:.3f}, "
            f"{u['copy']['ci_high']:.3f}] vs prior {u['prior_majority']['value']:.3f} "
            f"(n cells {u['copy']['n']})",
            flush=True,
        )
    out["example"] = texts[0] if texts else None
    return out


def behaviour(model_name: str) -> dict:
    """The card's protocol on sizes 7-11 at densities <= 0.4 (same held-out grids)."""
    model, tokenizer = load_bundled_agent("cpu", model_name)
    config = EvaluationConfig(sizes=(7, 9, 11), densities=(0.0, 0.2, 0.4))
    result = evaluate_agent(LocalBackend(model, tokenizer), config)
    status = quality_status(result)
    accuracies = [c["action_accuracy"] for c in result["cells"]]
    print(f"{model_name} per-action accuracy 7-11, d <= 0.4: {np.mean(accuracies):.3f}", flush=True)
    return {"evaluation": result, "target_cells_accuracy": status["target_cells_accuracy"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="repeatable")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-cell", type=int, default=10, help="probing grids per cell")
    parser.add_argument("--per-grid", type=int, default=4, help="probing states per grid")
    parser.add_argument("--layers", default="1,2,3", help="blocks probed")
    parser.add_argument("--copy-per-cell", type=int, default=6, help="copy-line grids per cell")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--behaviour", action="store_true", help="also run the behaviour check")
    parser.add_argument("--skip-anchors", action="store_true")
    parser.add_argument("--skip-copy", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "walls.json"
    result = json.loads(path.read_text()) if path.is_file() else {"models": {}}
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    for model in args.model:
        tag = model.replace(":", "_").replace("/", "_")
        entry = result["models"].setdefault(model, {})
        parts = [("copy_line", lambda m=model: copy_line(m, args))]
        if not args.skip_anchors:
            parts.append(("anchors", lambda m=model, t=tag: anchor_walls(m, t, args.out, args)))
        if args.behaviour:
            parts.append(("behaviour", lambda m=model: behaviour(m)))
        for name, run in parts:
            if name == "copy_line" and args.skip_copy:
                continue
            entry[name] = run()
            path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
