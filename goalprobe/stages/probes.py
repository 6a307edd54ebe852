"""Stage ``probes``: cell-type probes on every stored stage x layer, with their controls
(``RUN/probes/``: models, decoded maps of the test grids, sweep tables)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from goalprobe.config import DemoConfig, ProbesConfig, ProbeTraining
from goalprobe.stages.context import StageContext
from probes.cell_probes import CoordinateCellProbe
from probes.per_cell import PerCellProbe
from probes.probe_sweep import ProbeSweepConfig, StoreProbeLoader, run_probe_sweep

PROBE_CLASSES = {"coordinate": CoordinateCellProbe, "per_cell": PerCellProbe}
"""Probe kind -> estimator class."""


@dataclass(frozen=True)
class ProbesInput:
    """What the stage receives."""

    probes: ProbesConfig
    """Which probes and how they train."""
    device: str
    """Training device (``cpu`` or ``cuda``)."""


def inputs(config: DemoConfig) -> ProbesInput:
    """The probe settings and the training device."""
    return ProbesInput(config.probes, training_device(config))


def training_device(config: DemoConfig) -> str:
    """``cuda`` when the agent runs on a CUDA device, else ``cpu``."""
    return "cuda" if config.agent.device.startswith("cuda") else "cpu"


def estimator_params(training: ProbeTraining, device: str, seed: int, progress: bool) -> dict:
    """Keyword arguments every probe and regressor estimator of the demo shares."""
    return dict(
        hidden_size=training.hidden_size,
        max_epochs=training.max_epochs,
        batch_size=training.batch_size,
        device=device,
        progress=progress,
        random_state=seed,
    )


def stages_with_rows(context: StageContext, stages: tuple[str, ...]) -> tuple[str, ...]:
    """The stored stages that some row holds: an agent that never closes a reasoning message
    (a random model) has no post-reasoning rows, and that stage is then left out, saying so."""
    from activations.store import ActivationStore

    with ActivationStore(context.layout.store) as store:
        kept = tuple(s for s in stages if store.present(s).any())
    for stage in sorted(set(stages) - set(kept)):
        if context.say is not None:
            context.say(f"no step holds the {stage} anchor (no reasoning was written); skipped")
    if not kept:
        raise ValueError(f"{context.layout.store}: no row holds any stage of {stages}")
    return kept


def sweep(
    context: StageContext,
    target: str,
    estimator,
    out: Path,
    sweep_path: Path,
    *,
    test_fraction: float,
    n_bootstrap: int,
    seed: int,
) -> dict:
    """Run one probe sweep over every stored stage x layer; its table lands at ``sweep_path``."""
    loader = StoreProbeLoader(context.layout.store)
    config = ProbeSweepConfig(
        target=target,
        stages=stages_with_rows(context, tuple(loader.stages)),
        layers=tuple(loader.layers),
        test_fraction=test_fraction,
        controls=True,
        n_bootstrap=n_bootstrap,
        random_state=seed,
    )
    result = run_probe_sweep(loader, config, estimator, out_dir=out, log=context.say)
    sweep_path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(out / "sweep.json", sweep_path)
    return result


def run(context: StageContext, config: ProbesInput, stage_dir: Path):
    """Fit every probe kind x family on every stage x layer; keep the test grids' maps."""
    layout, p = context.layout, config.probes
    for folder in (layout.decoded_dir, layout.probe_sweeps):
        for file in folder.glob("cell_type_*") if folder.is_dir() else []:
            file.unlink()
    summary, outputs = {}, {"decoded": layout.decoded_dir}
    for kind in p.types:
        for family in p.families:
            estimator = PROBE_CLASSES[kind](
                family=family,
                **estimator_params(p.training, config.device, p.seed, context.progress),
            )
            name = f"cell_{kind}_{family}"
            result = sweep(
                context,
                "cell_type",
                estimator,
                stage_dir,
                layout.probe_sweep(name),
                test_fraction=p.test_fraction,
                n_bootstrap=p.n_bootstrap,
                seed=p.seed,
            )
            best = max(
                result["runs"],
                key=lambda r: r["metrics"]["models"]["probe"]["accuracy_no_padding"]["value"],
            )
            summary[f"{kind}_{family}"] = {
                "best_run": best["name"],
                "accuracy_no_padding": best["metrics"]["models"]["probe"]["accuracy_no_padding"][
                    "value"
                ],
            }
            outputs[f"sweep_{kind}_{family}"] = layout.probe_sweep(name)
    return outputs, summary
