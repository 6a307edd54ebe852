"""Stage ``patching``: activation patching between base steps of the main rollouts and their
counterfactual grids (``RUN/patching/``, schema ``goalprobe.patching/2``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from goalprobe.activations.capture import make_backend
from goalprobe.agent_config import AgentConfig
from goalprobe.config import DemoConfig, PatchingConfig
from goalprobe.figure_files import write_patch_heatmap
from goalprobe.probes.patching.counterfactuals import CounterfactualConfig, build_counterfactuals
from goalprobe.probes.patching.experiment import PatchConfig
from goalprobe.probes.patching.run import draw_bases, read_trajectory_bases, run_experiment
from goalprobe.stages.context import StageContext


@dataclass(frozen=True)
class PatchingInput:
    """What the stage receives."""

    agent: AgentConfig
    """The agent patched (its device sets the precision)."""
    patching: PatchingConfig
    """Sites, layers, pairs and the bootstrap."""


def inputs(config: DemoConfig) -> PatchingInput:
    """The agent and the patching settings."""
    return PatchingInput(config.agent, config.patching)


def run(context: StageContext, config: PatchingInput, stage_dir: Path):
    """Draw bases, build counterfactual pairs (disjoint ones on every base, controls on the
    first ``control_bases``), patch, and summarise with grid-clustered intervals and the
    anchors' verdicts."""
    p = config.patching
    trajectories = context.layout.trajectories
    read = read_trajectory_bases(trajectories)
    patch_config = PatchConfig(
        sites=p.sites,
        layers=p.layers,
        reasoning=p.reasoning,
        regenerate=p.regenerate,
        require_optimal=p.require_optimal,
        max_new_tokens=p.max_new_tokens,
        batch_size=p.batch_size,
        regenerate_batch_size=p.regenerate_batch_size,
        anchor_sites=p.anchor_sites,
        anchor_layers=p.anchor_layers,
        full_pairs=p.full_pairs,
        random_control=p.random_control,
        seed=p.seed,
        reasoning_effort=read.reasoning_effort,
        template_dir=read.template_dir,
    )
    bases = draw_bases(read.bases, p.max_bases, p.seed)
    disjoint = CounterfactualConfig(
        disjoint_per_move=p.disjoint_per_move, control_per_move=0, random_state=p.seed
    )
    controls = CounterfactualConfig(disjoint_per_move=0, control_per_move=1, random_state=p.seed)
    pairs = build_counterfactuals(bases, disjoint) + build_counterfactuals(
        bases[: p.control_bases], controls
    )
    loaded = context.agent(config.agent).loaded()
    outcome = run_experiment(
        bases,
        make_backend("nnsight", loaded.model, loaded.tokenizer),
        patch_config,
        pairs=pairs,
        n_resamples=p.n_bootstrap,
        random_state=p.seed,
        model_id=loaded.model_id,
        model_revision=loaded.revision,
        input_name=context.layout.relative(trajectories),
    )
    paths = outcome.write(stage_dir)
    write_patch_heatmap(stage_dir, outcome.summary)
    counts = {
        "pairs": outcome.report.n_kept,
        "records": len(outcome.records),
        "dropped_truncated": outcome.report.dropped_truncated,
    }
    return {"results": paths["results_json"]}, counts
