"""Stage ``distance``: goal-distance regressors on every stored stage x layer, with their
controls (``RUN/distance/``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from goalprobe.config import DemoConfig, DistanceConfig
from goalprobe.stages.context import StageContext
from goalprobe.stages.probes import estimator_params, sweep, targets, training_device

TORCH_THREADS = 1
"""Torch threads this stage computes with, whatever ``--jobs`` and the cores (its numbers
must not depend on them; :func:`goalprobe.scheduler.fixed_torch_threads`)."""


@dataclass(frozen=True)
class DistanceInput:
    """What the stage receives."""

    distance: DistanceConfig
    """Which regressors and how they train."""
    device: str
    """Training device (``cpu`` or ``cuda``)."""


def inputs(config: DemoConfig) -> DistanceInput:
    """The regressor settings and the training device."""
    return DistanceInput(config.distance, training_device(config))


def run(context: StageContext, config: DistanceInput, stage_dir: Path):
    """Fit every family on every stage x layer of the main store and of the probing set."""
    d, layout = config.distance, context.layout
    summary, outputs = {}, {}
    for family in d.families:
        params = dict(
            family=family, **estimator_params(d.training, config.device, d.seed, context.progress)
        )
        name = f"distance_{family}"
        for where, store, out, path in targets(
            ("main", layout.store, stage_dir, layout.distance_sweep(name)),
            ("probing", layout.probing_store, layout.probing_distance,
             layout.probing_distance_sweep(name)),
        ):  # fmt: skip
            result = sweep(
                context,
                store,
                "distance",
                params,
                out,
                path,
                test_fraction=d.test_fraction,
                n_bootstrap=d.n_bootstrap,
                seed=d.seed,
            )
            outputs[f"{where}_{family}"] = path
            summary[f"{where}_{family}"] = {
                r["name"]: r["metrics"]["models"]["probe"]["r2"]["value"] for r in result["runs"]
            }
    return outputs, summary
