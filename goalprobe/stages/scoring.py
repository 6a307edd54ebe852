"""Stage ``scoring``: the agent's actions against its decoded beliefs, and MEG on the true and
the decoded grids (``RUN/scoring/``)."""

from __future__ import annotations

from pathlib import Path

from goalprobe.figure_files import write_scoring_figures
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.scoring import score_run
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Stage, register


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


STAGE = register(
    Stage(
        name="scoring",
        run=run,
        reads=("grids", "rollouts", "activations", "probes"),
        writes=("belief scoring", "MEG scoring", "scoring figures"),
        section="scoring",
        control=True,
        seconds=40,
        torch_threads=1,
    )
)
