"""Stage ``steering``: do the wall probe's directions matter? (``RUN/steering/results.json``,
schema ``goalprobe.steering/1``).

On the probing set (its store at the headline stage and layer, split by grid as the probes
stage splits it: the probes section's test fraction and seed, stratified by size), the
agent-centred wall probe is fitted on the training grids; test-grid states are then steered
along its direction for one neighbour of the agent, along a random direction of the same norm,
and along its direction for an irrelevant cell, and regenerated
(:func:`goalprobe.probes.steering.steering_test`, whose docstring states the design).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from goalprobe.activations.capture import make_backend
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.trajectories import read_steps
from goalprobe.probes.patching.counterfactuals import base_from_step
from goalprobe.probes.probe_sweep import StoreProbeLoader
from goalprobe.probes.steering import SteeringConfig, SteerState, draw_states, steering_test
from goalprobe.stages import HEADLINE_STAGE, headline_layer
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.wall_readouts import store_split


def read_states(path: Path, grids: set[str] | None = None) -> list[SteerState]:
    """The prompt-only states of a probing states file (``goalprobe states``), of ``grids``
    only where given."""
    out = []
    for step in read_steps(path):
        if grids is not None and step.grid_id not in grids:
            continue
        base = base_from_step(step, where=f"{path}: step {step.grid_id}/{step.episode}")
        if base.prompt_token_ids is None:
            raise ValueError(f"{path}: state {base.base_id} records no prompt ids")
        out.append(SteerState(base.base_id, base.grid, base.state, base.prompt_token_ids))
    return out


def steer(
    store: Path,
    states_path: Path,
    model,
    tokenizer,
    config: SteeringConfig,
    *,
    test_fraction: float,
    seed: int,
    log=None,
) -> tuple[dict, list[dict]]:
    """The steering test on one probing set (store and states file) with a loaded model: the
    one path of this stage and of ``scripts/measure_steering.py``."""
    loader = StoreProbeLoader(store)
    layer = headline_layer(loader.layers)
    test_grids = store_split(loader, test_fraction, seed)
    data = loader(HEADLINE_STAGE, layer)
    rows = np.flatnonzero(~np.isin(data.grid_ids, test_grids))
    fields = ("cell_types", "grid_sizes", "densities", "agent_row_col", "grid_ids")
    train = {"acts": data.acts[rows].astype(np.float64)}
    train.update({name: getattr(data, name)[rows] for name in fields})
    grids = test_grids.tolist()
    states = draw_states(read_states(states_path, set(grids)), grids, config.seed)
    result, records = steering_test(
        train,
        states,
        make_backend("hooks", model, tokenizer),
        chat_format_for(tokenizer),
        layer,
        config,
        progress=log,
    )
    result["stage"] = HEADLINE_STAGE
    result["n_test_grids"] = int(len(test_grids))
    return result, records


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Steer the probing set's test states and write the results with their records."""
    layout = context.layout
    loaded = context.agent(config.agent).loaded()
    test_fraction, seed = config.split
    result, records = steer(
        layout.probing_store,
        layout.probing_states,
        loaded.model,
        loaded.tokenizer,
        config.steering,
        test_fraction=test_fraction,
        seed=seed,
        log=context.say,
    )
    result["role"] = "verdict"
    path = write_json(layout.steering_results, {**result, "records": records})
    summary = {
        "states": result["n_states"],
        "verdict": result["verdict"],
        **{f"success_{c}": result["rates"].get(c, {}).get("value") for c in ("probe", "random")},
    }
    return {"results": path}, summary


STAGE = register(
    Stage(
        name="steering",
        run=run,
        reads=("probing",),
        writes=("steering results",),
        section="steering",
        uses=("agent",),
        derived=lambda c: {"split": (c.probes.test_fraction, c.probes.seed)},
        weights=True,
        control=True,
        seconds=35,
        torch_threads=1,
    )
)
