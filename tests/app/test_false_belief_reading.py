"""The false-belief stage's reading of decoded start maps (goalprobe.stages.false_belief):
the differing cells and the goal are read on the decoded map's picture, whose one goal is the
goal read-out's top cell."""

from __future__ import annotations

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.gridworld.false_belief import (
    FALSE_BELIEF,
    STALE_GOAL,
    FalseBeliefSetConfig,
    generate_false_belief_set,
    pair_facts,
)
from goalprobe.probes.scoring.false_belief import Bootstrap

from goalprobe.stages.false_belief import probe_reading


def _maps(grids, goal_of):
    out = {}
    for g in grids:
        probs = np.zeros((15, 15, len(CellType)), np.float32)
        probs[..., CellType.OPEN] = 1.0
        probs[..., CellType.GOAL] = 0.5  # the cell probe says 'goal' nowhere in particular
        agent, goal = np.zeros((15, 15)), np.zeros((15, 15))
        agent[g.start] = 1.0
        goal[goal_of(g)] = 1.0
        out[g.grid_id] = (probs, agent, goal)
    return out


def test_a_goal_read_out_on_the_drawn_goal_follows_the_drawn_grid():
    grids = generate_false_belief_set(FalseBeliefSetConfig(size=7, pairs_per_kind=2, seed=1))
    by_id = {g.grid_id: g for g in grids}
    boot = Bootstrap(n_resamples=20)
    drawn = probe_reading(grids, by_id, _maps(grids, lambda g: g.prompt_grid.goal), boot)
    true = probe_reading(grids, by_id, _maps(grids, lambda g: g.goal), boot)
    stale = [g for g in grids if pair_facts(g)["kind"] == STALE_GOAL]
    for g in stale:
        expected = "shown" if pair_facts(g)["role"] == FALSE_BELIEF else "both"
        assert drawn["start_cells"][g.grid_id]["goal_follows"] == expected
        assert true["start_cells"][g.grid_id]["goal_follows"] in ("true", "both")
        picture = np.asarray(drawn["maps"][g.grid_id])
        assert (picture == CellType.GOAL).sum() == 1 and picture[
            g.prompt_grid.goal
        ] == CellType.GOAL
    cells = drawn["table"][STALE_GOAL][FALSE_BELIEF]
    assert cells["matches_shown"]["value"] == 1.0 and cells["matches_true"]["value"] == 0.0
    cells = true["table"][STALE_GOAL][FALSE_BELIEF]
    assert cells["matches_true"]["value"] == 1.0 and cells["matches_shown"]["value"] == 0.0
