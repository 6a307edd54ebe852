"""Stage ``plans``: the one-shot plan-decoder sweep (``RUN/plans/``: sweep table, models, and
the predicted plans the viewer shows)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from goalprobe.probes.plan_decoder import PlanDecoder
from goalprobe.probes.plan_sweep import StorePlanLoader, run_plan_sweep
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.probes import training_device
from goalprobe.stages.registry import Settings, Stage, register


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Sweep decoder capacity x stage x layer, with the shuffled-activation control."""
    layout, p = context.layout, config.plans
    loader = StorePlanLoader(layout.store)  # stages: only those with rows in the store
    decoder = PlanDecoder(
        **dataclasses.asdict(p.decoder), device=config.device, random_state=p.sweep.random_state
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


STAGE = register(
    Stage(
        name="plans",
        run=run,
        reads=("activations",),
        writes=("plan sweep", "plan models", "predicted plans"),
        section="plans",
        derived=lambda c: {"device": training_device(c)},
        control=True,
        seconds=65,
        torch_threads=1,
    )
)
