"""Stage ``activations``: the residual streams at the anchors of every recorded step
(``RUN/activations/activations.h5``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from activations.capture import make_backend
from activations.extract import ExtractConfig, default_layers, extract
from goalprobe.agents import AgentConfig
from goalprobe.config import ActivationsConfig, DemoConfig
from goalprobe.stages.context import StageContext


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
    loaded = context.agent(config.agent).loaded()
    capture = make_backend(
        "nnsight",
        loaded.model,
        loaded.tokenizer,
        remote=False,
        model_id=loaded.model_id,
        revision=loaded.revision or None,
        host=None,
    )
    layers = config.activations.layers or default_layers(capture.n_layers)
    out = context.layout.store
    report = extract(
        context.layout.trajectories,
        out,
        capture,
        loaded.tokenizer,
        ExtractConfig(layers=tuple(layers), batch_size=config.activations.batch_size),
        model_id=loaded.model_id,
        model_revision=loaded.revision,
        overwrite=True,
        progress=context.progress,
    )
    return {"store": out}, {"rows": report.rows, "layers": list(layers)}
