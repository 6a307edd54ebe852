"""What the belief test on walls shows for an ideal near believer (issue 39, item 5).

The agent moves optimally on the true walls within two steps of A with every other cell open
(ties broken UP, DOWN, LEFT, RIGHT; true A and G; no sampling), on grids of the demo's sizes and
densities. Prints, each grid weighted as Fig. 4: how often its moves are optimal on the true walls,
on the decoded map an anchor read-out of rings 1 and 2 would give (those walls near A, the
size-and-density prior's majority walls beyond) and on the prior map, and the decoded minus prior
with its standard error: the effect the demo's test must detect for an agent that acts on the
walls its anchors hold. docs/map_agent.md (seventh session) records the figures.

    python3 scripts/simulate_near_believer.py --per-cell 4
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from goalprobe.gridworld.core import Action
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.probes.scoring.belief import optimal_mask_for_pair
from measure_control_moves import fit_prior, near_mask, prior_walls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-cell", type=int, default=4, help="grids per size x density")
    parser.add_argument("--seed", type=int, default=5, help="seed of the grids")
    args = parser.parse_args(argv)
    if args.per_cell < 1:
        print("error: --per-cell must be >= 1", file=sys.stderr)
        return 2
    prior = fit_prior(77, 20)
    rates: dict[str, list[float]] = {"true": [], "decoded": [], "prior": []}
    for grid in generate_grid_set(GridSetConfig(n_per_cell=args.per_cell, seed=args.seed)):
        n, goal, agent = grid.size, tuple(grid.goal), tuple(grid.start)
        prior_map = prior_walls(prior, n, grid.density)
        hits: dict[str, list[bool]] = {k: [] for k in rates}
        for _ in range(4 * n * n):
            if agent == goal:
                break
            near = near_mask(n, agent)
            action = int(
                np.flatnonzero(
                    optimal_mask_for_pair(np.where(near, grid.walls, False), agent, goal)
                )[0]
            )
            maps = {
                "true": np.asarray(grid.walls),
                "decoded": np.where(near, grid.walls, prior_map),
                "prior": prior_map,
            }
            for name, walls in maps.items():
                hits[name].append(bool(optimal_mask_for_pair(walls, agent, goal)[action]))
            d_row, d_col = Action(action).delta_row_col
            step = (agent[0] + d_row, agent[1] + d_col)
            agent = agent if grid.walls[step] else step
        for name in rates:
            rates[name].append(float(np.mean(hits[name])) if hits[name] else np.nan)
    for name, values in rates.items():
        print(f"{name}: {100 * np.nanmean(values):.1f}%")
    diff = np.asarray(rates["decoded"]) - np.asarray(rates["prior"])
    diff = diff[np.isfinite(diff)]
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    print(
        f"decoded - prior: {100 * diff.mean():+.1f} points (SE {100 * se:.1f}, {len(diff)} grids)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
