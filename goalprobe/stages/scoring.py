"""Stage ``scoring``: the agent's actions against its decoded beliefs, and MEG on the true and
the decoded grids (``RUN/scoring/``)."""

from __future__ import annotations

from pathlib import Path

from goalprobe.config import DemoConfig
from goalprobe.figure_files import write_scoring_figures
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.scoring import score_run
from goalprobe.stages.context import StageContext

TORCH_THREADS = 1
"""Torch threads this stage computes with, whatever ``--jobs`` and the cores (its numbers
must not depend on them; :func:`goalprobe.scheduler.fixed_torch_threads`)."""


def inputs(config: DemoConfig) -> ScoreConfig:
    """The scoring settings."""
    return config.scoring


def run(context: StageContext, config: ScoreConfig, stage_dir: Path):
    """Score every decoded-map file of the run, as ``goalprobe score`` does
    (:func:`goalprobe.scoring.score_run`): subjective MEG and the headline use the headline
    maps (the probing-set probes' maps of the rollouts, fixed in advance, not the best on test
    data) when they exist."""
    layout = context.layout
    summary = score_run(layout, config, progress=context.progress)
    write_scoring_figures(layout, summary.belief, summary.meg)
    outputs = {"belief": layout.belief, "meg": layout.meg}
    missing = [str(p) for p in outputs.values() if not p.is_file()]
    if missing:
        raise RuntimeError(f"scoring did not write {missing}")
    return outputs, {}
