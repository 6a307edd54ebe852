"""Stage ``activations``: the residual streams at the anchors of every recorded step
(``RUN/activations/activations.h5``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from goalprobe.activations.capture import make_backend
from goalprobe.activations.extract import ExtractConfig, default_layers, extract
from goalprobe.agent_config import AgentConfig
from goalprobe.config import ActivationsConfig, DemoConfig
from goalprobe.stages.context import StageContext

TORCH_THREADS = 1
"""Torch threads this stage computes with, whatever ``--jobs`` and the cores (stored
activations must not depend on them; :func:`goalprobe.scheduler.fixed_torch_threads`)."""


@dataclass(frozen=True)
class ActivationsInput:
    """What the stage receives."""

    agent: AgentConfig
    """The agent replayed (its device sets the precision: fp32 on CPU, bf16 on CUDA)."""
    activations: ActivationsConfig
    """Layers and batch size."""


def inputs(config: DemoConfig) -> ActivationsInput:
    """The agent and the extraction settings."""
    return ActivationsInput(config.agent, config.activations)


def run(context: StageContext, config: ActivationsInput, stage_dir: Path):
    """Replay the main rollouts teacher-forced and store the anchors' residual streams."""
    out = context.layout.store
    report, layers = extract_into(
        context, config.agent, config.activations, context.layout.trajectories, out
    )
    return {"store": out}, {"rows": report.rows, "layers": list(layers)}


def extract_into(
    context: StageContext,
    agent: AgentConfig,
    settings: ActivationsConfig,
    trajectories: Path,
    out: Path,
    stages: tuple[str, ...] = ("pre_reasoning", "post_reasoning"),
):
    """Extract ``trajectories`` into the store ``out`` with the demo's backend and layers;
    returns ``(ExtractReport, layers)``."""
    loaded = context.agent(agent).loaded()
    capture = make_backend(
        "nnsight",
        loaded.model,
        loaded.tokenizer,
        remote=False,
        model_id=loaded.model_id,
        revision=loaded.revision or None,
        host=None,
    )
    layers = tuple(settings.layers or default_layers(capture.n_layers))
    report = extract(
        trajectories,
        out,
        capture,
        loaded.tokenizer,
        ExtractConfig(layers=layers, stages=stages, batch_size=settings.batch_size),
        model_id=loaded.model_id,
        model_revision=loaded.revision,
        overwrite=True,
        progress=context.progress,
    )
    return report, layers
