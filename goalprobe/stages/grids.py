"""Stage ``grids``: the main grid set (``RUN/grids/grids.jsonl``)."""

from __future__ import annotations

from pathlib import Path

from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Stage, register


def run(context: StageContext, config: GridSetConfig, stage_dir: Path):
    """Generate and write the grids."""
    out = context.layout.grids
    count = write_grid_set(out, generate_grid_set(config))
    return {"grids": out}, {"grids": count}


STAGE = register(
    Stage(name="grids", run=run, writes=("grid set",), section="grids", control=True, seconds=0)
)
