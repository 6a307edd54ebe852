"""Stage ``report``: ``RUN/report.html``, every section from the run's files."""

from __future__ import annotations

from pathlib import Path

from goalprobe.report import write_report
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Stage, register


def run(context: StageContext, config: dict, stage_dir: Path):
    """Write the report."""
    return {"report": write_report(context.layout.root, config=config)}, {}


STAGE = register(
    Stage(
        name="report",
        run=run,
        writes=("report",),
        derived=lambda c: c.to_dict(),
        control=True,
        seconds=1,
        final=True,
    )
)
