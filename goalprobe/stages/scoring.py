"""Stage ``scoring``: the agent's actions against its decoded beliefs, and MEG on the true and
the decoded grids (``RUN/scoring/``)."""

from __future__ import annotations

from pathlib import Path

from goalprobe.config import DemoConfig
from goalprobe.figure_files import write_scoring_figures
from goalprobe.stages.context import StageContext
from probes.scoring.run_scoring import ScoreConfig, score_run


def inputs(config: DemoConfig) -> ScoreConfig:
    """The scoring settings."""
    return config.scoring


def run(context: StageContext, config: ScoreConfig, stage_dir: Path):
    """Score every decoded-map file of the run."""
    layout = context.layout
    summary = score_run(layout.root, config, progress=context.progress)
    write_scoring_figures(layout, summary.belief, summary.meg)
    outputs = {"belief": layout.belief, "meg": layout.meg}
    missing = [str(p) for p in outputs.values() if not p.is_file()]
    if missing:
        raise RuntimeError(f"scoring did not write {missing}")
    return outputs, {}
