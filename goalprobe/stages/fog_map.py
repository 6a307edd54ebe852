"""Stage ``fog_map``: what the pre-reasoning anchors hold under fog (``RUN/fog/activations.h5``,
``RUN/fog/map.json``, schema ``goalprobe.demo.fog_map/1``).

The fogged rollouts' anchors are extracted at the headline layer; the agent's knowledge at each
step (the revealed set) is exact. Two read-outs on held-out grids (half the fogged grids,
split by grid): a per-cell probe of which cells are revealed, against the per-cell majority and
the distance to the agent; and the headline cell probe's walls at hidden cells, against the
size-and-density prior (:mod:`goalprobe.probes.fog_map`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.core import LABEL_CANVAS, CellType
from goalprobe.gridworld.fog import revealed_mask, revealed_sets
from goalprobe.gridworld.io import read_grid_set
from goalprobe.probes.decoded_maps import full_class_probs
from goalprobe.probes.fog_map import hidden_wall_tracking, revealed_probe
from goalprobe.probes.serialization import load_probe
from goalprobe.probes.splits import split_by_grid
from goalprobe.stages import HEADLINE_STAGE
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.decode import extract_headline, headline_probe
from goalprobe.stages.registry import Settings, Stage, register

SCHEMA = "goalprobe.demo.fog_map/1"


def _revealed(layout, grid_ids, episodes, steps) -> np.ndarray:
    """``(N, S, S)`` the revealed set of each store row's step."""
    grids = {g.grid_id: g for g in read_grid_set(layout.fog_grids)}
    cumulative: dict[tuple[str, int], list] = {}
    for episode in read_trajectories(layout.fog_trajectories):
        grid = grids[episode.summary.grid_id]
        cells = [grid.start, *(s.next_agent_row_col for s in episode.steps)]
        cumulative[grid.grid_id, episode.summary.episode] = revealed_sets(grid, cells)
    out = np.zeros((len(grid_ids), LABEL_CANVAS, LABEL_CANVAS), dtype=bool)
    for row, key in enumerate(zip(grid_ids, episodes, steps, strict=True)):
        grid = grids[str(key[0])]
        seen = cumulative[str(key[0]), int(key[1])][int(key[2])]
        out[row, : grid.size, : grid.size] = revealed_mask(grid, seen)
    return out


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Extract the fogged rollouts' anchors and read the knowledge and the true grid off them."""
    layout = context.layout
    probe = headline_probe(layout)
    if probe is None:
        raise RuntimeError("the probes stage left no headline cell probe to decode fog with")
    fields = ["grid_id", "episode", "step", "cell_types", "grid_size", "density", "agent_row_col"]
    acts, labels = extract_headline(
        context,
        config.agent,
        config.activations,
        layout.fog_trajectories,
        layout.fog_store,
        probe.layer,
        fields,
    )
    ids = np.asarray(labels["grid_id"]).astype(str)
    revealed = _revealed(layout, ids, labels["episode"], labels["step"])
    split = split_by_grid(ids, test_fraction=0.5, random_state=config.fog.seed)
    train = np.isin(np.arange(len(ids)), split.train)
    model = load_probe(probe.card)
    decoded = full_class_probs(model.predict_proba(acts), [int(c) for c in model.classes_])
    f = config.fog
    knowledge = revealed_probe(
        acts,
        revealed,
        labels["grid_size"],
        labels["agent_row_col"],
        ids,
        train,
        n_resamples=f.n_bootstrap,
        random_state=f.seed,
    )
    tracking = hidden_wall_tracking(
        decoded,
        labels["cell_types"],
        revealed,
        labels["grid_size"],
        labels["density"],
        ids,
        train,
        n_resamples=min(f.n_bootstrap, 200),
        random_state=f.seed,
    )
    payload = {
        "schema": SCHEMA,
        "agent": config.agent.model,
        "layer": probe.layer,
        "stage": HEADLINE_STAGE,
        "headline_probe": {"name": probe.name, "trained_on": probe.trained_on},
        "rows": int(len(ids)),
        "grids": int(len(set(ids.tolist()))),
        "revealed_fraction": float(
            revealed.sum() / max(1, (labels["cell_types"] != CellType.PADDING).sum())
        ),
        "revealed_probe": knowledge,
        "hidden_walls": tracking,
    }
    results = write_json(layout.fog_map_results, payload)
    return {"store": layout.fog_store, "results": results}, {
        "rows": int(len(ids)),
        "revealed_probe_verdict": knowledge["verdict"],
        "beyond_prior_at_hidden": tracking["beyond_prior_at_hidden"],
    }


STAGE = register(
    Stage(
        name="fog_map",
        run=run,
        reads=("fog", "probes"),
        writes=("fog store", "fog map results"),
        section="fog",
        uses=("agent", "activations"),
        weights=True,
        control=True,
        seconds=8,
        torch_threads=1,
    )
)
