"""Stage ``activations``: the residual streams at the anchors of every recorded step
(``RUN/activations/activations.h5``)."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path

from goalprobe.activations.capture import make_backend
from goalprobe.activations.extract import ExtractConfig, default_layers, extract
from goalprobe.activations.plan import (
    ModelShape,
    device_memory_bytes,
    loaded_weights_bytes,
    plan_extraction,
    planned_attention,
    replay_lengths,
    require_fits,
)
from goalprobe.agents.agent_config import AgentConfig
from goalprobe.agents.attention import register as register_attention
from goalprobe.config import ActivationsConfig
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Settings, Stage, register


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Replay the main rollouts teacher-forced and store the anchors' residual streams."""
    out = context.layout.store
    report, layers = extract_into(
        context,
        config.agent,
        config.activations,
        context.layout.trajectories,
        out,
        reasoning_every=config.activations.reasoning_every,
    )
    return {"store": out}, {"rows": report.rows, "layers": list(layers)}


def extract_into(
    context: StageContext,
    agent: AgentConfig,
    settings: ActivationsConfig,
    trajectories: Path,
    out: Path,
    stages: tuple[str, ...] = ("pre_reasoning", "post_reasoning"),
    reasoning_every: int = 0,
):
    """Extract ``trajectories`` into the store ``out`` with the demo's backend and layers (and
    reasoning rows every ``reasoning_every`` tokens when not 0); returns
    ``(ExtractReport, layers)``."""
    loaded = context.agent(agent).loaded()
    with attention(loaded.model, settings.attn_implementation):
        return _extract(
            context, agent, settings, trajectories, out, stages, loaded, reasoning_every
        )


@contextmanager
def attention(model, implementation: str):
    """``model`` run with the attention ``implementation`` inside the block (``agent``: the
    one it was loaded with), its own after (the loaded model is shared with the later
    stages)."""
    before = model.config._attn_implementation
    if implementation in ("agent", before):
        yield
        return
    register_attention(implementation)  # goalprobe's own kernels (sink_attention, flex_fp32_sinks)
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def _extract(context, agent, settings, trajectories, out, stages, loaded, reasoning_every):
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
    config = planned_config(
        ExtractConfig(
            layers=layers,
            stages=stages,
            batch_size=settings.batch_size,
            reasoning_every=reasoning_every,
        ),
        trajectories,
        loaded,
        agent.device,
    )
    report = extract(
        trajectories,
        out,
        capture,
        loaded.tokenizer,
        config,
        model_id=loaded.model_id,
        model_revision=loaded.revision,
        overwrite=True,
        progress=context.progress,
    )
    return report, layers


def planned_config(
    config: ExtractConfig,
    trajectories: Path,
    loaded,
    device: str,
    attention: str | None = None,
) -> ExtractConfig:
    """``config`` with the batches of :func:`goalprobe.activations.plan.plan_extraction`: at
    most ``config.batch_size`` sequences and a token budget that fits the device's memory at the
    longest replayed step (the same planner as ``scripts/extract_gptoss20b.py``). ``attention``:
    the kernel planned for; None: the one the model runs (the SDPA sinks kernel is eager's
    model on CPU and its own on CUDA: :func:`~goalprobe.activations.plan.planned_attention`).
    The weights are what the loaded model holds (:func:`~goalprobe.activations.plan.loaded_weights_bytes`:
    MXFP4 experts are Triton tensors, not parameters).

    Raises:
        ExtractionDoesNotFitError: the longest step does not fit one sequence at a time."""
    model = loaded.model
    if device in ("", "auto"):
        device = str(next(model.parameters()).device)
    attention = planned_attention(attention or str(model.config._attn_implementation), device)
    shape = ModelShape.from_config(model.config)
    dtype_bytes = next(model.parameters()).element_size()
    weights = loaded_weights_bytes(model, device)
    lengths = replay_lengths(trajectories, loaded.tokenizer, config)
    plan = plan_extraction(
        lengths,
        shape,
        memory_bytes=device_memory_bytes(device),
        weights_bytes=weights,
        dtype_bytes=dtype_bytes,
        max_batch=config.batch_size,
        attention=attention,
    )
    require_fits(plan, shape, dtype_bytes)
    return dataclasses.replace(config, max_batch_tokens=plan.max_batch_tokens)


STAGE = register(
    Stage(
        name="activations",
        run=run,
        reads=("rollouts",),
        writes=("activation store",),
        section="activations",
        uses=("agent",),
        weights=True,
        control=True,
        seconds=40,
        torch_threads=1,
    )
)
