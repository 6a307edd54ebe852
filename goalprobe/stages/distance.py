"""Stage ``distance``: goal-distance regressors on every stored stage x layer, with their
controls (``RUN/distance/``)."""

from __future__ import annotations

from pathlib import Path

from goalprobe.stages.context import StageContext
from goalprobe.stages.probes import estimator_params, sweep, targets, training_device
from goalprobe.stages.registry import Settings, Stage, register


def run(context: StageContext, config: Settings, stage_dir: Path):
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
            result = sweep(context, store, "distance", params, out, path, d)
            outputs[f"{where}_{family}"] = path
            summary[f"{where}_{family}"] = {
                r["name"]: r["metrics"]["models"]["probe"]["r2"]["value"] for r in result["runs"]
            }
    return outputs, summary


STAGE = register(
    Stage(
        name="distance",
        run=run,
        reads=("activations", "probing"),
        writes=("probing-set distance", "distance models", "distance sweeps"),
        section="distance",
        derived=lambda c: {"device": training_device(c)},
        control=True,
        seconds=6,
        torch_threads=1,
    )
)
