"""Stage ``report``: ``RUN/report.html``, every section from the run's files."""

from __future__ import annotations

from pathlib import Path

from goalprobe.config import DemoConfig
from goalprobe.report import write_report
from goalprobe.stages.context import StageContext


def inputs(config: DemoConfig) -> dict:
    """The whole config (the report shows it)."""
    return config.to_dict()


def run(context: StageContext, config: dict, stage_dir: Path):
    """Write the report."""
    return {"report": write_report(context.layout.root, config=config)}, {}
