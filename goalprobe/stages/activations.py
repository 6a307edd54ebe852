"""Stage ``activations``: the residual streams at the anchors of every recorded step
(``RUN/activations/activations.h5``)."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path

from goalprobe.activations.capture import make_backend
from goalprobe.activations.extract import ExtractConfig, extract
from goalprobe.activations.extract import default_layers as layer_spread
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
from goalprobe.agents.prompt_states import write_prompt_states
from goalprobe.config import ActivationsConfig
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Settings, Stage, register


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Replay the main rollouts teacher-forced and store the anchors' residual streams."""
    out = context.layout.store
    settings = config.activations.extract
    report, layers = extract_into(
        context,
        config.agent,
        config.activations,
        context.layout.trajectories,
        out,
        stages=settings.stages,
        reasoning_every=settings.reasoning_every,
    )
    return {"store": out}, {"rows": report.rows, "layers": list(layers)}


def write_agent_states(context: StageContext, agent: AgentConfig, grids, prompts, path, **kw):
    """Write the agent's prompts at states of ``grids`` (``states=``: these; else sampled by
    ``prompts``) as prompt-only states at ``path``, replacing any; a served agent's prompts are
    rendered as its rollouts' were, and no weights load."""
    served = context.agent(agent)
    encode, rendering = served.prompt_encoder(context.layout.trajectories)
    path.unlink(missing_ok=True)
    rendered = {"rendering": rendering} if rendering else {}
    description = {**served.config.identity(), **rendered}
    return write_prompt_states(grids, encode, prompts, path, backend_description=description, **kw)


def extract_into(
    context: StageContext,
    agent: AgentConfig,
    settings: ActivationsConfig,
    trajectories: Path,
    out: Path,
    stages: tuple[str, ...] = ("pre_reasoning", "post_reasoning"),
    reasoning_every: int = 0,
    layers: tuple[int, ...] | None = None,
):
    """Extract ``trajectories`` into the store ``out`` with the demo's backend, batches and
    layers (``layers``: these instead), at the anchor ``stages`` (and reasoning rows every
    ``reasoning_every`` tokens when not 0); returns ``(ExtractReport, layers)``."""
    config = dataclasses.replace(
        settings.extract,
        stages=stages,
        reasoning_every=reasoning_every,
        layers=settings.extract.layers if layers is None else layers,
    )
    loaded = context.agent(agent).loaded()
    with attention(loaded.model, settings.attn_implementation):
        capture = make_backend(
            "nnsight",
            loaded.model,
            loaded.tokenizer,
            model_id=loaded.model_id,
            revision=loaded.revision or None,
        )
        report, config = extract_store(
            trajectories,
            out,
            loaded,
            capture,
            config,
            plan_device=agent.device,
            overwrite=True,
            progress=context.progress,
        )
    return report, config.layers


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


def extract_store(
    trajectories: Path,
    out: Path,
    loaded,
    capture,
    config: ExtractConfig,
    *,
    plan_device: str | None = None,
    overwrite: bool = False,
    progress: bool = False,
    work_dir: Path | None = None,
    keep_parts: bool = False,
):
    """The extraction, the one path of ``goalprobe extract`` and of this stage: replay
    ``trajectories`` teacher-forced through ``capture`` and store the residual stream at ``out``
    (resumable); ``plan_device`` plans the batches' token budget for that device's memory
    (:func:`planned_config`; None: as given). Returns ``(ExtractReport, the config used)``."""
    if not config.layers:
        config = dataclasses.replace(config, layers=layer_spread(capture.n_layers))
    if plan_device is not None:
        config = planned_config(config, trajectories, loaded, plan_device)
    report = extract(
        trajectories,
        out,
        capture,
        loaded.tokenizer,
        config,
        model_id=loaded.model_id,
        model_revision=loaded.revision,
        work_dir=work_dir,
        keep_parts=keep_parts,
        overwrite=overwrite,
        progress=progress,
    )
    return report, config


def planned_config(
    config: ExtractConfig, trajectories: Path, loaded, device: str, attention: str | None = None
) -> ExtractConfig:
    """``config`` with the batches of :func:`goalprobe.activations.plan.plan_extraction`: at
    most ``config.batch_size`` sequences and a token budget that fits the device's memory at the
    longest replayed step, for the kernel ``attention`` (None: the one the model runs) and the
    weights the loaded model holds. ``ExtractionDoesNotFitError`` when one sequence does not fit."""
    model = loaded.model
    if device in ("", "auto"):
        device = str(next(model.parameters()).device)
    attention = planned_attention(attention or str(model.config._attn_implementation), device)
    shape = ModelShape.from_config(model.config)
    dtype_bytes = next(model.parameters()).element_size()
    plan = plan_extraction(
        replay_lengths(trajectories, loaded.tokenizer, config),
        shape,
        memory_bytes=device_memory_bytes(device),
        weights_bytes=loaded_weights_bytes(model, device),
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
