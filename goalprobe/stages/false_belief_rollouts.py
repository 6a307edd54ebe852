"""Stage ``false_belief_rollouts``: the false-belief grids and their matched controls
(``RUN/false_belief/grids.jsonl``) and the agent's episodes on them
(``RUN/false_belief/trajectories.jsonl``).

Split from the ``false_belief`` stage, which scores and decodes them, so that every stage that
generates runs before any stage that loads the model's weights: with ``--backend server`` the
server's generation is finished (and the server can be stopped) before extraction, probing and
patching load the model (:data:`goalprobe.stages.SERVER_STAGES`).
"""

from __future__ import annotations

from pathlib import Path

from goalprobe.gridworld.false_belief import generate_false_belief_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.rollouts import rollouts_into, section_rollout


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Generate the pairs and run the agent on them."""
    layout = context.layout
    grids = generate_false_belief_set(config.grids)
    write_grid_set(layout.false_belief_grids, grids)
    out = layout.false_belief_trajectories
    summary = rollouts_into(grids, context.agent(config.agent), config.rollout, out, context)
    return {"grids": layout.false_belief_grids, "trajectories": out}, summary


STAGE = register(
    Stage(
        name="false_belief_rollouts",
        run=run,
        writes=("false-belief grids", "false-belief trajectories"),
        uses=("agent",),
        derived=lambda c: {**section_rollout(c, "false_belief"), "grids": c.false_belief.grids},
        generates=True,
        control=True,
        seconds=14,
    )
)
