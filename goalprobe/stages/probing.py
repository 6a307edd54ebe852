"""Stage ``probing``: the probing set (``RUN/probing/``): a grid set of its own, the agent's
prompt at sampled states of every grid (no generation: ``goalprobe states``), and the
pre-reasoning anchors of every state (``RUN/probing/activations.h5``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from goalprobe.config import DemoConfig
from goalprobe.gridworld.generator import generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.stages.activations import extract_into, write_agent_states
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Settings, Stage, register


def _received(config: DemoConfig) -> dict:
    """The probing set whose prompts use the rollouts' reasoning effort and templates (the
    prompts the agent reads in its episodes)."""
    states = dataclasses.replace(
        config.probing.states,
        reasoning_effort=config.rollouts.reasoning_effort,
        template_dir=config.rollouts.template_dir,
    )
    return {"probing": dataclasses.replace(config.probing, states=states)}


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Write the probing grids and prompts, then extract their pre-reasoning anchors."""
    layout = context.layout
    grids = generate_grid_set(config.probing.grids)
    write_grid_set(layout.probing_grids, grids)
    states = write_agent_states(
        context, config.agent, grids, config.probing.states, layout.probing_states
    )
    report, layers = extract_into(
        context,
        config.agent,
        config.activations,
        layout.probing_states,
        layout.probing_store,
        stages=("pre_reasoning",),
    )
    outputs = {
        "grids": layout.probing_grids,
        "states": layout.probing_states,
        "store": layout.probing_store,
    }
    return outputs, {"grids": len(grids), "states": states.states_written, "rows": report.rows}


STAGE = register(
    Stage(
        name="probing",
        run=run,
        # a served agent's prompts are rendered as its rollouts' served prompts were
        reads=("rollouts",),
        writes=("probing grid set", "probing states", "probing store"),
        section="probing",
        uses=("agent", "activations"),
        derived=_received,
        weights=True,
        control=True,
        seconds=33,
        torch_threads=1,
    )
)
