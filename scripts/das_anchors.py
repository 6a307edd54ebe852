"""Trained subspace interventions (DAS) at the control agent's pre-reasoning anchors (issue 41,
item 5; docs/benchmarks.md, "DAS at the control's anchors").

Pairs on training grids train a rank-k subspace at one block's anchors (``probes/steering.py``);
held-out grids' disjoint pairs are regenerated greedily under the interchange, under the full
anchor patch, and under a random subspace of the same rank. Position probes fitted on natural
states (other grids again) give the directions the subspace is compared with (principal angles)
and the natural-variation check. Writes ``--out``.json (figures: a DAS card,
``goalprobe.das_card/1``, docs/formats.md) and ``--out``.safetensors (the bases, ``basis.k<rank>``).
Copied to ``agents/<agent>/das.json``, the card is what the report shows for that agent (the
weights' digest tells the report whether it still describes the shipped weights).

    OMP_NUM_THREADS=1 python scripts/das_anchors.py --out /tmp/das
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _pairs(backend, context, size, density, n_grids, seed, prefix):
    from goalprobe.gridworld.generator import generate_grid
    from goalprobe.probes.patching.counterfactuals import (
        CounterfactualConfig,
        base_from_grid,
        build_counterfactuals,
    )
    from goalprobe.probes.patching.experiment import prepare_pairs

    rng = np.random.default_rng(seed)
    grids = [generate_grid(size, density, rng, grid_id=f"{prefix}{i}") for i in range(n_grids)]
    pairs = build_counterfactuals(
        [base_from_grid(g) for g in grids],
        CounterfactualConfig(control_per_move=0, random_state=seed),
    )
    kept, _ = prepare_pairs(pairs, context)
    return [p for p in kept if p.pair.kind == "disjoint"]


def _moved(backend, context, pairs, block, bases, max_new_tokens):
    """``{name: (G,) moved count per grid, (G,) pairs per grid}`` under each basis."""
    from collections import defaultdict

    from goalprobe.agents.harmony import HarmonyTokenIds
    from goalprobe.probes.steering import interchange_patch

    stops = HarmonyTokenIds.from_tokenizer(backend.tokenizer).stop_ids
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for pair in pairs:
        names = list(bases)
        patches = [interchange_patch(pair, block, bases[n]) for n in names]
        completions = backend.generate(
            pair.base.prompt_ids, patches, max_new_tokens=max_new_tokens, stop_ids=stops
        )
        for name, ids in zip(names, completions, strict=True):
            action = context.parse_generated(ids)
            cell = counts[name][pair.pair.base.grid_id]
            cell[0] += int(action is not None and action in pair.pair.cf_optimal)
            cell[1] += 1
    return {
        name: (np.array([v[0] for v in g.values()]), np.array([v[1] for v in g.values()]))
        for name, g in counts.items()
    }


def _natural(backend, context, block, size, density, n_grids, seed):
    """Natural anchor activations (mean of the three anchors) of start states of new grids and
    their labels (agent row, agent col, goal row, goal col)."""
    from goalprobe.agents.harmony import HarmonyTokenIds, find_anchors
    from goalprobe.gridworld.dynamics import settle
    from goalprobe.gridworld.generator import generate_grid

    special = HarmonyTokenIds.from_tokenizer(backend.tokenizer)
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for i in range(n_grids):
        grid = generate_grid(size, density, rng, grid_id=f"nat{i}")
        state = settle(grid, grid.initial_state)
        ids = context.prompt_ids(grid, state)
        where = np.asarray(find_anchors(ids, special).pre_reasoning, dtype=np.int64)
        run = backend.clean_run(ids, [block], where)
        xs.append(run.acts[0].mean(dim=0).numpy())
        ys.append([*state.agent, *grid.goal])
    return np.stack(xs), np.asarray(ys)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output stem (.json, .safetensors)")
    parser.add_argument("--agent", default="bundled:map")
    parser.add_argument("--block", type=int, default=2)
    parser.add_argument("--ranks", default="1,2,4,8,16")
    parser.add_argument("--size", type=int, default=7)
    parser.add_argument("--density", type=float, default=0.2)
    parser.add_argument("--train-grids", type=int, default=8)
    parser.add_argument("--test-grids", type=int, default=10)
    parser.add_argument("--natural-grids", type=int, default=150)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    import torch
    from goalprobe.activations.capture import make_backend
    from goalprobe.agents.bundled import load_bundled_agent
    from goalprobe.probes.patching.experiment import PatchConfig, PatchingContext
    from goalprobe.probes.steering import (
        DasConfig,
        natural_r2,
        principal_angles,
        random_basis,
        train_subspace,
    )
    from safetensors.torch import save_file
    from sklearn.linear_model import LogisticRegression

    from goalprobe.report.attribution import DAS_CARD_SCHEMA, weights_sha256
    from goalprobe.stats.rates import cluster_rate_interval

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    model, tokenizer = load_bundled_agent(directory=args.agent)
    backend = make_backend("hooks", model, tokenizer)
    context = PatchingContext(backend, PatchConfig(reasoning="greedy", max_new_tokens=160))
    train = _pairs(backend, context, args.size, args.density, args.train_grids, args.seed, "tr")
    test = _pairs(backend, context, args.size, args.density, args.test_grids, args.seed + 1, "te")
    x, y = _natural(backend, context, args.block, args.size, args.density, args.natural_grids,
                    args.seed + 2)  # fmt: skip
    split = int(0.7 * len(x))
    directions, probe_accuracy = [], []
    for column in range(y.shape[1]):
        probe = LogisticRegression(max_iter=2000).fit(x[:split], y[:split, column])
        directions.append(probe.coef_)
        probe_accuracy.append(float(probe.score(x[split:], y[split:, column])))
    directions = np.concatenate(directions)
    ranks = [int(r) for r in args.ranks.split(",")]
    bases: dict[str, torch.Tensor | None] = {"full": None}
    training = {}
    for rank in ranks:
        t0 = time.perf_counter()
        config = DasConfig(block=args.block, rank=rank, steps=args.steps, seed=args.seed)
        basis, losses = train_subspace(train, backend, config)
        bases[f"das_k{rank}"] = basis
        bases[f"random_k{rank}"] = random_basis(backend.d_model, rank, args.seed + rank)
        training[rank] = {"loss_first": losses[0], "loss_last": losses[-1],
                          "seconds": time.perf_counter() - t0}  # fmt: skip
    t0 = time.perf_counter()
    moved = _moved(backend, context, test, args.block, bases, 160)
    t_eval = time.perf_counter() - t0
    rates = {name: cluster_rate_interval(k, n) for name, (k, n) in moved.items()}
    full = rates["full"]["value"] or 0.0
    rows = []
    for rank in ranks:
        learned, rand = bases[f"das_k{rank}"], bases[f"random_k{rank}"]
        rows.append(
            {
                "rank": rank,
                "das": rates[f"das_k{rank}"],
                "random": rates[f"random_k{rank}"],
                "fraction_of_full": (rates[f"das_k{rank}"]["value"] or 0.0) / full
                if full
                else None,
                "angles_das_deg": principal_angles(learned, directions)[:3].tolist(),
                "angles_random_deg": principal_angles(rand, directions)[:3].tolist(),
                "natural_r2_das": natural_r2(x, y, learned),
                "natural_r2_random": natural_r2(x, y, rand),
                **training[rank],
            }
        )
    reach = [
        r["rank"]
        for r in rows
        if r["fraction_of_full"] is not None and r["fraction_of_full"] >= 0.9
    ]
    result = {
        "schema": DAS_CARD_SCHEMA, "command": "python scripts/das_anchors.py " + " ".join(argv_used),
        "weights_sha256": weights_sha256(args.agent), "seed": args.seed, "steps": args.steps,
        "agent": args.agent, "block": args.block, "size": args.size, "density": args.density,
        "train_pairs": len(train), "test_pairs": len(test),
        "test_grids": len({p.pair.base.grid_id for p in test}),
        "full_patch": rates["full"], "rows": rows,
        "smallest_rank_reaching_90pct_of_full": min(reach) if reach else None,
        "position_probe_accuracy": dict(zip(("agent_row", "agent_col", "goal_row", "goal_col"),
                                            probe_accuracy, strict=True)),
        "natural_states": len(x), "seconds": {"evaluation": t_eval,
                                              "total": time.perf_counter() - t_start},
    }  # fmt: skip
    with open(f"{args.out}.json", "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    save_file(
        {f"basis.k{r}": bases[f"das_k{r}"].contiguous() for r in ranks},
        f"{args.out}.safetensors",
        metadata={"agent": args.agent, "block": str(args.block)},
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
