"""Attribution patching checked against exhaustive real patches on the bundled agents
(issue 41, item 3; the figures of docs/benchmarks.md, "Attribution patching vs real patches").

For each bundled agent: grids of the tiny scale, one disjoint agent-move and one disjoint
goal-move counterfactual per base (the patching module's pairs, greedy reasoning, optimal on
both sides), attribution of every block x prompt position (AtP with GradDrop, hooks backend),
then the real patch of every affected block x position and of each prompt site at each block.
Prints, per agent and metric, the Spearman rho per pair, the top-5 hit rate beside k random
sites with a paired interval over grids, the saturation/cancellation diagnostics, the site
sums against the site patches, and the time each part took; ``--json`` writes them.

    OMP_NUM_THREADS=1 python scripts/attribution_check.py --grids 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import numpy as np


def run_agent(name: str, n_grids: int, seed: int, size: int) -> dict:
    import torch
    from goalprobe.activations.capture import make_backend
    from goalprobe.agents.bundled import load_bundled_agent
    from goalprobe.gridworld.generator import generate_grid
    from goalprobe.probes.attribution import (
        REGIONS,
        AttributionConfig,
        attribute_pair,
        metric_specs,
        region_shares,
        regions,
        site_estimates,
    )
    from goalprobe.probes.attribution_check import (
        compare,
        first_affected,
        patch_effects,
        site_effects,
    )
    from goalprobe.probes.patching.counterfactuals import (
        CounterfactualConfig,
        base_from_grid,
        build_counterfactuals,
    )
    from goalprobe.probes.patching.experiment import PatchConfig, PatchingContext, prepare_pairs
    from goalprobe.probes.patching.sites import ActionTokens

    from goalprobe.stats.bootstrap import grid_mean

    torch.manual_seed(seed)
    model, tokenizer = load_bundled_agent(directory=name)
    backend = make_backend("hooks", model, tokenizer)
    rng = np.random.default_rng(seed)
    grids = [generate_grid(size, 0.5, rng, grid_id=f"attr-n{size}-i{i}") for i in range(n_grids)]
    bases = [base_from_grid(g) for g in grids]
    pairs = build_counterfactuals(
        bases, CounterfactualConfig(disjoint_per_move=1, control_per_move=0, random_state=seed)
    )
    context = PatchingContext(backend, PatchConfig(reasoning="greedy", max_new_tokens=160))
    t0 = time.perf_counter()
    prepared, report = prepare_pairs(pairs, context)
    t_prepare = time.perf_counter() - t0
    action_tokens = ActionTokens.from_tokenizer(tokenizer)
    config = AttributionConfig()
    rows: dict[str, list] = defaultdict(list)
    sites: dict[str, list] = defaultdict(list)
    shares: dict[str, list] = defaultdict(list)
    t_attr = t_patch = 0.0
    n_patches = 0
    for pair in prepared:
        specs = metric_specs(pair, tokenizer, action_tokens, config.metrics)
        t0 = time.perf_counter()
        attributions = attribute_pair(pair, backend, specs, config)
        t_attr += time.perf_counter() - t0
        for attribution in attributions:
            spec = specs[attribution.metric]
            t0 = time.perf_counter()
            effects = patch_effects(pair, backend, spec, attribution)
            real_sites = site_effects(pair, backend, spec, attribution.layers)
            t_patch += time.perf_counter() - t0
            first = first_affected(pair)
            n_patches += int((attribution.positions >= first).sum()) * len(attribution.layers)
            agreement = compare(attribution, effects, first)
            where = regions(attribution)
            shares[attribution.metric].append(
                (region_shares(effects, where), region_shares(attribution.graddrop, where))
            )
            rows[attribution.metric].append(agreement)
            estimates = site_estimates(attribution, pair)
            for site, real in real_sites.items():
                for layer, (e, r) in enumerate(zip(estimates[site], real, strict=True)):
                    sites[attribution.metric].append((site, layer, float(e), float(r)))
    out: dict = {
        "agent": name,
        "grids": n_grids,
        "size": size,
        "pairs_offered": len(pairs),
        "pairs_kept": len(prepared),
        "preparation": report.to_dict(),
        "seconds": {
            "prepare": t_prepare,
            "attribution": t_attr,
            "real_patches": t_patch,
            "n_real_patches": n_patches,
        },
        "metrics": {},
    }
    for metric, agreements in rows.items():
        by_grid: dict[str, list] = defaultdict(list)
        for a in agreements:
            by_grid[a.grid_id].append(a)
        top = [np.mean([a.hit_rate for a in g]) for g in by_grid.values()]
        rand = [np.mean([a.random_hit_rate for a in g]) for g in by_grid.values()]
        diff = [t - r for t, r in zip(top, rand, strict=True)]
        rhos = [a.spearman for a in agreements if a.spearman is not None]
        site_rows = sites[metric]
        est = np.array([s[2] for s in site_rows])
        real = np.array([s[3] for s in site_rows])
        site_rho = None
        if len(site_rows) > 2 and np.ptp(est) > 0 and np.ptp(real) > 0:
            import scipy.stats

            site_rho = float(scipy.stats.spearmanr(est, real).statistic)
        out["metrics"][metric] = {
            "n_pairs": len(agreements),
            "n_grids": len(by_grid),
            "spearman_median": float(np.median(rhos)) if rhos else None,
            "spearman_per_pair": [a.spearman for a in agreements],
            "spearman_graddrop_per_pair": [a.spearman_graddrop for a in agreements],
            "hit_rate_top5": grid_mean(top, rate=True),
            "hit_rate_random5": grid_mean(rand, rate=True),
            "hit_rate_difference": grid_mean(diff, random_state=0),
            "scale_top_decile_median": float(
                np.median([a.scale_top for a in agreements if a.scale_top is not None])
            )
            if any(a.scale_top is not None for a in agreements)
            else None,
            "wrong_sign_top_decile": int(sum(a.wrong_sign_top for a in agreements)),
            "sites_compared": len(site_rows),
            "site_sum_spearman": site_rho,
            "site_sum_rows": site_rows,
            "total_effect_median": float(np.median([a.total_effect for a in agreements])),
            "regions": list(REGIONS),
            "real_share_by_block": np.mean([x[0] for x in shares[metric]], axis=0).tolist(),
            "graddrop_share_by_block": np.mean([x[1] for x in shares[metric]], axis=0).tolist(),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", nargs="+", default=["bundled", "bundled:map"])
    parser.add_argument("--grids", type=int, default=4)
    parser.add_argument("--size", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results = []
    for agent in args.agents:
        t0 = time.perf_counter()
        result = run_agent(agent, args.grids, args.seed, args.size)
        result["seconds"]["total"] = time.perf_counter() - t0
        results.append(result)
        for metric, m in result["metrics"].items():
            d = m["hit_rate_difference"]
            print(
                f"{agent} {metric}: pairs {m['n_pairs']} on {m['n_grids']} grids; "
                f"rho median {m['spearman_median']}; top-5 hit "
                f"{m['hit_rate_top5']['value']} vs random {m['hit_rate_random5']['value']} "
                f"(difference {d['value']} [{d['ci_low']}, {d['ci_high']}]); scale "
                f"{m['scale_top_decile_median']}; wrong sign {m['wrong_sign_top_decile']}; "
                f"site sums rho {m['site_sum_spearman']}"
            )
            real = np.round(np.asarray(m["real_share_by_block"]), 3).tolist()
            est = np.round(np.asarray(m["graddrop_share_by_block"]), 3).tolist()
            print(f"  share of |real effect| by block x {m['regions']}: {real}")
            print(f"  share of GradDrop by block x {m['regions']}: {est}")
        print(f"{agent} seconds: {json.dumps(result['seconds'])}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1, default=str)


if __name__ == "__main__":
    main()
