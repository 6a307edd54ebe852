"""Stage ``patching``: activation patching between base steps of the main rollouts and their
counterfactual grids (``RUN/patching/``, schema ``goalprobe.patching/1``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from activations.agent.trajectories import read_run_header, read_steps
from goalprobe.agents import AgentConfig
from goalprobe.config import DemoConfig, PatchingConfig
from goalprobe.figure_files import write_patch_heatmap
from goalprobe.stages.context import StageContext, write_json
from probes.patching.counterfactuals import (
    CounterfactualConfig,
    base_from_step,
    build_counterfactuals,
)
from probes.patching.experiment import PatchConfig, PatchingContext, prepare_pairs, run_patching
from probes.patching.patch import make_backend
from probes.patching.results import SCHEMA, summarize, write_results


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
    """Draw bases, build counterfactual pairs, patch, and summarise with grid-bootstrap CIs."""
    p = config.patching
    trajectories = context.layout.trajectories
    header = read_run_header(trajectories)
    bases = [
        base_from_step(s, where=f"{trajectories}: step {s.grid_id}/{s.episode}/{s.step}")
        for s in read_steps(trajectories)
    ]
    if len(bases) > p.max_bases:
        rng = np.random.default_rng(p.seed)
        bases = [bases[i] for i in np.sort(rng.choice(len(bases), p.max_bases, False))]
    patch_config = PatchConfig(
        sites=p.sites,
        layers=p.layers,
        reasoning="recorded",
        require_optimal=p.require_optimal,
        max_new_tokens=p.max_new_tokens,
        reasoning_effort=header.config.get("reasoning_effort", "low"),
        template_dir=header.config.get("template_dir"),
    )
    cf_config = CounterfactualConfig(random_state=p.seed)
    pairs = build_counterfactuals(bases, cf_config)
    loaded = context.agent(config.agent).loaded()
    patcher = make_backend("nnsight", loaded.model, loaded.tokenizer)
    patching = PatchingContext(loaded.model, loaded.tokenizer, patcher, patch_config)
    prepared, report = prepare_pairs(pairs, patching)
    meta = {
        "model": loaded.model_id,
        "model_revision": loaded.revision,
        "backend": patcher.name,
        "n_layers": patcher.n_layers,
        "layer_sets": {label: list(ls) for label, ls in patching.layer_sets},
        "config": dataclasses.asdict(patch_config),
        "counterfactuals": dataclasses.asdict(cf_config),
        "input": context.layout.relative(trajectories),
        "n_bases": len(bases),
        "preparation": report.to_dict(),
    }
    if not prepared:
        path = write_json(
            context.layout.patch_results,
            {"schema": SCHEMA, **meta, "skipped_sites": {}, "summary": [], "records": []},
        )
        return {"results": path}, {"pairs": 0, "records": 0}
    records, skipped = run_patching(prepared, patching)
    summary = summarize(records, n_resamples=p.n_bootstrap, random_state=p.seed)
    meta["skipped_sites"] = dict(skipped)
    paths = write_results(stage_dir, records, summary, meta)
    write_patch_heatmap(stage_dir, summary)
    return {"results": paths["results_json"]}, {"pairs": report.n_kept, "records": len(records)}
