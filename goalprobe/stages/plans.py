"""Stage ``plans``: the one-shot plan-decoder sweep (``RUN/plans/``: sweep table, models, and
the predicted plans the viewer shows)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from goalprobe.config import DemoConfig, PlansConfig
from goalprobe.probes.plan_decoder import PlanDecoder
from goalprobe.probes.plan_sweep import StorePlanLoader, run_plan_sweep
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.probes import training_device

TORCH_THREADS = 1
"""Torch threads this stage computes with, whatever ``--jobs`` and the cores (its numbers
must not depend on them; :func:`goalprobe.scheduler.fixed_torch_threads`)."""


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
    loader = StorePlanLoader(layout.store)  # stages: only those with rows in the store
    decoder = PlanDecoder(
        n_heads=p.decoder.n_heads,
        d_bottleneck=p.decoder.d_bottleneck,
        max_epochs=p.decoder.max_epochs,
        n_iter_no_change=p.decoder.n_iter_no_change,
        device=config.device,
        random_state=p.sweep.random_state,
    )
    result = run_plan_sweep(
        loader, p.sweep, decoder, out_dir=stage_dir, overwrite=True, log=context.say
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
