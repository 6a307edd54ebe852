"""What the anchors hold under fog (goalprobe.probes.fog_map), on constructed data where the
answer is known: features that carry the revealed mask are read, random ones are not; a decoded
map that knows the hidden walls beats the prior, and the prior itself does not."""

from __future__ import annotations

import numpy as np
from goalprobe.gridworld.core import LABEL_CANVAS, CellType
from goalprobe.gridworld.fog import generate_fog_set, revealed_sets
from goalprobe.gridworld.generator import GridSetConfig
from goalprobe.gridworld.text import padded_cell_types
from goalprobe.probes.fog_map import hidden_wall_tracking, revealed_probe
from goalprobe.probes.splits import split_by_grid


def _rows(seed: int = 0):
    """Fogged grids walked at random: per row, the true cell types, the revealed mask, the
    agent cell, the grid's size, density and id."""
    rng = np.random.default_rng(seed)
    grids = generate_fog_set(GridSetConfig(sizes=(7, 9), densities=(0.4, 1.0), n_per_cell=4))
    types, revealed, agent, sizes, dens, ids = [], [], [], [], [], []
    for grid in grids:
        open_cells = [tuple(map(int, rc)) for rc in np.argwhere(~grid.walls)]
        path = [grid.start] + [open_cells[i] for i in rng.integers(0, len(open_cells), 5)]
        for cell, seen in zip(path, revealed_sets(grid, path), strict=True):
            mask = np.zeros((LABEL_CANVAS, LABEL_CANVAS), dtype=bool)
            for r, c in seen:
                mask[r, c] = True
            types.append(padded_cell_types(grid))
            revealed.append(mask)
            agent.append(cell)
            sizes.append(grid.size)
            dens.append(grid.density)
            ids.append(grid.grid_id)
    return (
        np.stack(types),
        np.stack(revealed),
        np.asarray(agent),
        np.asarray(sizes),
        np.asarray(dens),
        np.asarray(ids),
    )


def _train(ids):
    split = split_by_grid(ids, test_fraction=0.5, random_state=0)
    return np.isin(np.arange(len(ids)), split.train)


def test_revealed_probe_reads_a_planted_mask_and_not_noise():
    types, revealed, agent, sizes, _, ids = _rows()
    rng = np.random.default_rng(1)
    train = _train(ids)
    planted = revealed.reshape(len(ids), -1).astype(float) + rng.normal(0, 0.3, (len(ids), 225))
    found = revealed_probe(planted, revealed, sizes, agent, ids, train, n_resamples=200)
    assert found["verdict"] == "yes"
    assert found["probe"]["value"] > found[found["best_baseline"]]["value"]
    noise = rng.normal(size=(len(ids), 32))
    null = revealed_probe(noise, revealed, sizes, agent, ids, train, n_resamples=200)
    assert null["verdict"] == "no"


def test_hidden_walls_beyond_the_prior_only_when_the_map_knows_them():
    types, revealed, _, sizes, dens, ids = _rows()
    train = _train(ids)
    n = len(ids)
    oracle = np.zeros((n, LABEL_CANVAS, LABEL_CANVAS, len(CellType)))
    oracle[..., CellType.WALL] = types == CellType.WALL
    found = hidden_wall_tracking(oracle, types, revealed, sizes, dens, ids, train, n_resamples=100)
    assert found["beyond_prior_at_hidden"] == "yes"
    assert found["hidden"]["decoded_auc"] == 1.0
    # a map that knows only what is revealed and the prior elsewhere: nothing beyond the prior
    from goalprobe.probes.baselines import CellPrior, covariates

    X = covariates(sizes, dens)
    prior = CellPrior(by="size_density").fit(X[train], types[train]).predict_proba(X)
    wall = list(CellPrior(by="size_density").fit(X[train], types[train]).classes_).index(
        CellType.WALL
    )
    knowledge = np.zeros_like(oracle)
    knowledge[..., CellType.WALL] = np.where(revealed, types == CellType.WALL, prior[..., wall])
    null = hidden_wall_tracking(
        knowledge, types, revealed, sizes, dens, ids, train, n_resamples=100
    )
    assert null["beyond_prior_at_hidden"] == "no"
    assert abs(null["hidden"]["difference"]["value"]) < 1e-9
    assert null["revealed"]["decoded_auc"] == 1.0


def test_one_test_grid_gives_no_interval():
    types, revealed, _, sizes, dens, ids = _rows()
    keep = np.isin(ids, np.unique(ids)[:2])
    types, revealed, sizes, dens, ids = (a[keep] for a in (types, revealed, sizes, dens, ids))
    train = ids == ids[0]
    decoded = np.zeros((len(ids), LABEL_CANVAS, LABEL_CANVAS, len(CellType)))
    out = hidden_wall_tracking(decoded, types, revealed, sizes, dens, ids, train, n_resamples=50)
    assert out["test_grids"] == 1
    assert out["hidden"]["difference"]["ci_low"] is None
    assert out["beyond_prior_at_hidden"] == "undecided"  # no interval: not a "no"
