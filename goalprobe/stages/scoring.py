"""Stage ``scoring``: the agent's actions against its decoded beliefs, and MEG on the true and
the decoded grids (``RUN/scoring/``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from goalprobe.activations.store import ActivationStore
from goalprobe.config import DemoConfig
from goalprobe.figure_files import write_scoring_figures
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.scoring import score_run
from goalprobe.stages import HEADLINE_PROBE, HEADLINE_STAGE, headline_layer
from goalprobe.stages.context import StageContext

TORCH_THREADS = 1
"""Torch threads this stage computes with, whatever ``--jobs`` and the cores (its numbers
must not depend on them; :func:`goalprobe.scheduler.fixed_torch_threads`)."""


def inputs(config: DemoConfig) -> ScoreConfig:
    """The scoring settings."""
    return config.scoring


def run(context: StageContext, config: ScoreConfig, stage_dir: Path):
    """Score every decoded-map file of the run; subjective MEG and the headline use the
    headline probe's maps (fixed in advance, not the best on test data) when they exist."""
    layout = context.layout
    if config.meg_probe is None:
        kind, family = HEADLINE_PROBE
        with ActivationStore(layout.store) as store:
            layer = headline_layer(store.layers)
        name = f"cell_type_{kind}_{family}_{HEADLINE_STAGE}_L{layer}"
        if layout.decoded_map(name).is_file():
            config = dataclasses.replace(config, meg_probe=name)
    summary = score_run(layout, config, progress=context.progress)
    write_scoring_figures(layout, summary.belief, summary.meg)
    outputs = {"belief": layout.belief, "meg": layout.meg}
    missing = [str(p) for p in outputs.values() if not p.is_file()]
    if missing:
        raise RuntimeError(f"scoring did not write {missing}")
    return outputs, {}
