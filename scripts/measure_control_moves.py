"""Which map a map agent's moves follow, from its trajectories alone (issue 39, item 5).

For every valid step of a plain grid in a trajectory JSONL (``goalprobe rollout`` or a demo run's
``rollouts/trajectories.jsonl``), with the true A and G: is the action optimal on

* ``true``: the true walls;
* ``near``: the true walls within two steps of A (the copy line's cells, which the map agent's
  anchors hold), every other cell open: the belief of an agent that knows only those;
* ``prior``: the size-and-density prior's majority walls (``CellPrior(by="size_density")``
  fitted on fresh generator grids, ``--prior-seed``; the scoring stage fits it on the run's
  training grids instead);
* ``near_prior``: the true walls within two steps of A, the prior's elsewhere (what the
  decoded map holds where the anchors hold ring 1 and 2 and the conditional probe the rest).

Also: bumps (the action moves into a wall, so the agent stays), bumps where every move toward G
is blocked by a neighbouring wall, and how often the reasoning's ``A is at`` / ``G is at`` misreads
the true cells, per grid size. Each grid weighs the same (the mean of its steps' rates, as the
study's Fig. 4 and the demo's scoring), 95% percentile intervals over resampled grids.
docs/map_agent.md (seventh session) records the figures.

    python3 scripts/measure_control_moves.py RUN/control/rollouts/trajectories.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from goalprobe.gridworld.core import Action, CellType
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.probes.baselines import CellPrior, covariates
from goalprobe.probes.scoring.belief import optimal_mask_for_pair

from goalprobe.stats import GridBootstrap

MAPS = ("true", "near", "prior", "near_prior")
READ = re.compile(r"A is at \((\d+), (\d+)\)\. G is at \((\d+), (\d+)\)")


def fail(message: str) -> None:
    """One line on stderr and exit code 2, as the verbs do."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def fit_prior(seed: int, per_cell: int) -> CellPrior:
    """The size-and-density cell prior of ``per_cell`` fresh grids per study cell."""
    grids = generate_grid_set(GridSetConfig(n_per_cell=per_cell, seed=seed))
    labels = np.full((len(grids), 15, 15), int(CellType.PADDING))
    for i, g in enumerate(grids):
        labels[i, : g.size, : g.size] = np.where(g.walls, int(CellType.WALL), int(CellType.OPEN))
    sizes = np.asarray([g.size for g in grids])
    return CellPrior(by="size_density").fit(
        covariates(sizes, np.asarray([g.density for g in grids])), labels
    )


def prior_walls(prior: CellPrior, size: int, density: float) -> np.ndarray:
    """``(size, size)`` bool: the prior's majority walls of a grid of this size and density."""
    probs = prior.predict_proba(covariates(np.asarray([size]), np.asarray([density])))
    return prior.classes_[probs[0, :size, :size].argmax(-1)] == int(CellType.WALL)


def near_mask(size: int, agent: tuple[int, int]) -> np.ndarray:
    """``(size, size)`` bool: the cells within two steps of A (the copy line's 12 and A's own)."""
    rows, cols = np.mgrid[:size, :size]
    return (np.abs(rows - agent[0]) + np.abs(cols - agent[1])) <= 2


def step_rows(path: Path, prior: CellPrior) -> tuple[dict[str, list], dict[int, list[int]]]:
    """Per step: grid id, the four maps' optimality, bump, blocked; misreads per size."""
    rows: dict[str, list] = defaultdict(list)
    misreads: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    priors: dict[tuple[int, float], np.ndarray] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") != "step" or r["variant"] != "plain" or not r["valid"]:
                continue
            text = r["grid_text"].split("\n")[1:]
            walls = np.array([[ch == "#" for ch in row.split()[1:]] for row in text])
            n = walls.shape[0]
            a, g = tuple(r["agent_row_col"]), tuple(r["goal_row_col"])
            act = Action[r["action"]]
            key = (n, float(r["density"]))
            if key not in priors:
                priors[key] = prior_walls(prior, *key)
            near = near_mask(n, a)
            maps = {
                "true": walls,
                "near": np.where(near, walls, False),
                "prior": priors[key],
                "near_prior": np.where(near, walls, priors[key]),
            }
            for name, m in maps.items():
                rows[name].append(bool(optimal_mask_for_pair(m, a, g)[int(act)]))
            d_row, d_col = act.delta_row_col
            rows["bump"].append(bool(walls[a[0] + d_row, a[1] + d_col]))
            towards = [
                x
                for x, closer in (
                    (Action.UP, g[0] < a[0]),
                    (Action.DOWN, g[0] > a[0]),
                    (Action.LEFT, g[1] < a[1]),
                    (Action.RIGHT, g[1] > a[1]),
                )
                if closer
            ]
            rows["blocked"].append(
                bool(towards)
                and all(
                    walls[a[0] + x.delta_row_col[0], a[1] + x.delta_row_col[1]] for x in towards
                )
            )
            rows["grid"].append(r["grid_id"])
            read = READ.search(r.get("reasoning") or "")
            counts = misreads[n]
            counts[0] += 1
            if read:
                cells = [int(x) for x in read.groups()]
                counts[1] += tuple(cells[:2]) != a
                counts[2] += tuple(cells[2:]) != g
    return rows, misreads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trajectories", type=Path, help="trajectory JSONL")
    parser.add_argument("--prior-seed", type=int, default=77, help="seed of the prior's grids")
    parser.add_argument("--prior-per-cell", type=int, default=20, help="prior grids per cell")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures (JSON)")
    args = parser.parse_args(argv)
    if not args.trajectories.is_file():
        fail(f"{args.trajectories}: no such trajectory file")
    if args.out is not None and args.out.exists():
        fail(f"{args.out}: exists (choose another --out)")
    try:
        rows, misreads = step_rows(
            args.trajectories, fit_prior(args.prior_seed, args.prior_per_cell)
        )
    except (KeyError, ValueError, IndexError) as e:  # json.JSONDecodeError is a ValueError
        fail(f"{args.trajectories}: not a trajectory JSONL ({type(e).__name__}: {e})")
    if not rows["grid"]:
        fail(f"{args.trajectories}: no valid plain-grid steps")
    ids = np.asarray(rows["grid"])
    grids, row_grid = np.unique(ids, return_inverse=True)
    boot = GridBootstrap.from_grid_ids(grids, n_resamples=1000, random_state=0)

    def per_grid(values: np.ndarray, den: np.ndarray | None = None) -> np.ndarray:
        den = np.ones(len(values)) if den is None else den
        num = np.bincount(row_grid, weights=values.astype(float), minlength=len(grids))
        trials = np.bincount(row_grid, weights=den.astype(float), minlength=len(grids))
        return np.divide(num, trials, out=np.full(len(grids), np.nan), where=trials > 0)

    def rate(values: np.ndarray, den: np.ndarray | None = None) -> dict:
        rates = per_grid(values, den)
        kept = np.isfinite(rates)  # grids with no trial (e.g. no blocked state) drop out
        return boot.summary(boot.ratio(np.where(kept, rates, 0.0), kept.astype(float)))

    hit = {name: np.asarray(rows[name]) for name in MAPS}
    blocked, bump = np.asarray(rows["blocked"]), np.asarray(rows["bump"])
    out = {name: rate(hit[name]) for name in MAPS}
    out["near_prior_minus_prior"] = rate(hit["near_prior"].astype(float) - hit["prior"])
    out["bumps"] = rate(bump)
    out["bumps_when_blocked"] = rate(bump & blocked, blocked)
    out["misreads_by_size"] = {
        str(n): {"steps": c[0], "agent": c[1] / c[0], "goal": c[2] / c[0]}
        for n, c in sorted(misreads.items())
    }
    out["steps"], out["grids"] = int(len(ids)), int(len(set(rows["grid"])))
    for key in (*MAPS, "near_prior_minus_prior", "bumps", "bumps_when_blocked"):
        e = out[key]
        print(f"{key}: {100 * e['value']:.1f}% [{100 * e['ci_low']:.1f}, {100 * e['ci_high']:.1f}]")
    print(f"steps {out['steps']}, grids {out['grids']}, blocked states {int(blocked.sum())}")
    for n, m in out["misreads_by_size"].items():
        print(
            f"size {n}: {m['steps']} steps, A misread {m['agent']:.3f}, G misread {m['goal']:.3f}"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
