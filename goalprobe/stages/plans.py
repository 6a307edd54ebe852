"""Stage ``plans``: the one-shot plan-decoder sweep (``RUN/plans/``: sweep table, models, and
the predicted plans the viewer shows)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from goalprobe.config import DemoConfig, PlansConfig
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.probes import stages_with_rows, training_device
from probes.plan_decoder import PlanDecoder, PlanSweepConfig, StorePlanLoader, run_plan_sweep


@dataclass(frozen=True)
class PlansInput:
    """What the stage receives."""

    plans: PlansConfig
    """Decoder capacities, widths and training."""
    device: str
    """Training device (``cpu`` or ``cuda``)."""


def inputs(config: DemoConfig) -> PlansInput:
    """The decoder settings and the training device."""
    return PlansInput(config.plans, training_device(config))


def run(context: StageContext, config: PlansInput, stage_dir: Path):
    """Sweep decoder capacity x stage x layer, with the shuffled-activation control."""
    layout, p = context.layout, config.plans
    loader = StorePlanLoader(layout.store)
    sweep_config = PlanSweepConfig(
        stages=stages_with_rows(context, tuple(loader.stages)),
        layers=tuple(loader.layers),
        decoder_layers=p.decoder_layers,
        control_decoder_layers=p.control_layers,
        test_fraction=p.test_fraction,
        validation_fraction=p.validation_fraction,
        n_bootstrap=p.n_bootstrap,
        random_state=p.seed,
    )
    decoder = PlanDecoder(
        n_heads=p.heads,
        d_bottleneck=p.bottleneck,
        max_epochs=p.max_epochs,
        patience=p.patience,
        device=config.device,
        random_state=p.seed,
    )
    result = run_plan_sweep(
        loader, sweep_config, decoder, out_dir=stage_dir, overwrite=True, progress=context.say
    )
    layout.predicted_plans.parent.mkdir(parents=True, exist_ok=True)
    os.replace(stage_dir / "predicted_plans.h5", layout.predicted_plans)
    write_json(layout.plan_sweep, result.to_dict())
    best = max(
        (r for r in result.runs if r.kind == "decoder"),
        key=lambda r: float(r.metrics.prefix_accuracy[0]),
    )
    return {"sweep": layout.plan_sweep, "predicted": layout.predicted_plans}, {
        "best": best.name,
        "prefix_accuracy_n1": float(best.metrics.prefix_accuracy[0]),
    }
