"""Stage ``patching``: activation patching between base steps of the main rollouts and their
counterfactual grids (``RUN/patching/``, schema ``goalprobe.patching/2``), and along the
reasoning: chunks of the counterfactual's reasoning written into the base run at the block where
the ``decision`` stage's read-out peaks, the rest of the reasoning regenerated (issue 30)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from goalprobe.activations.capture import make_backend
from goalprobe.figure_files import write_patch_heatmap
from goalprobe.probes.patching.counterfactuals import CounterfactualConfig, build_counterfactuals
from goalprobe.probes.patching.experiment import PatchConfig
from goalprobe.probes.patching.memory import PatchingBudget
from goalprobe.probes.patching.run import draw_bases, read_trajectory_bases, run_experiment
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Settings, Stage, register


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Draw bases, build counterfactual pairs (disjoint ones on every base, controls on the
    first ``control_bases``), patch, and summarise with grid-clustered intervals and the
    anchors' verdicts."""
    p = config.patching
    trajectories = context.layout.trajectories
    read = read_trajectory_bases(trajectories)
    loaded = context.agent(config.agent).loaded()
    n_layers = int(loaded.model.config.num_hidden_layers)
    peak = readout_peak(context.layout.decision_lens, n_layers) if p.reasoning_chunks else None
    chunk_layers = tuple(
        str(peak["layer"]) if spec == "peak" and peak is not None else spec
        for spec in p.chunk_layers
    )
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
        reasoning_chunks=p.reasoning_chunks,
        chunk_layers=chunk_layers,
        chunk_pairs=p.chunk_pairs,
    )
    bases = draw_bases(read.bases, p.max_bases, p.seed)
    disjoint = CounterfactualConfig(
        disjoint_per_move=p.disjoint_per_move, control_per_move=0, random_state=p.seed
    )
    controls = CounterfactualConfig(disjoint_per_move=0, control_per_move=1, random_state=p.seed)
    pairs = build_counterfactuals(bases, disjoint) + build_counterfactuals(
        bases[: p.control_bases], controls
    )
    batches = stage_dir / BATCHES_FILE  # what an out-of-memory error halved a batch to
    limits = json.loads(batches.read_text(encoding="utf-8")) if batches.is_file() else None
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
        budget=PatchingBudget.for_model(loaded.model, config.agent.device),
        batch_limits=limits,
        on_halve=lambda halved: _record_batch(batches, halved),
    )
    if peak is not None:
        outcome.meta["reasoning_chunks"]["peak"] = peak
    paths = outcome.write(stage_dir)
    write_patch_heatmap(stage_dir, outcome.summary)
    counts = {
        "pairs": outcome.report.n_kept,
        "records": len(outcome.records),
        "dropped_truncated": outcome.report.dropped_truncated,
    }
    return {"results": paths["results_json"]}, counts


BATCHES_FILE = "batches.json"
"""``RUN/patching/batches.json``: kind of forward pass -> the batch an out-of-memory error
halved it to, written at once, so that a rerun starts from it instead of the plan that failed."""


def _record_batch(path: Path, halved) -> None:
    limits = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    limits[halved.name] = halved.size
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(limits, indent=1), encoding="utf-8")
    tmp.replace(path)


def readout_peak(lens_path: Path, n_layers: int) -> dict:
    """The block where the decision stage's read-out of the answered action peaks: the highest
    mean held-out accuracy over the reasoning-progress bins (earliest block on ties), from
    ``RUN/decision/lens.json``; without a read-out there (too few grids), the middle block.

    The read-out is fitted and scored on the decision stage's own sample of rollout steps, so
    the choice never looks at a patching outcome.

    Returns:
        ``{"layer", "source", "accuracy"}`` (``accuracy``: the mean per block, None where the
        read-out is missing).
    """
    readout = json.loads(Path(lens_path).read_text(encoding="utf-8")).get("readout")
    means: list[float | None] = []
    for row in (readout or {}).get("by_layer", []):
        values = [b["value"] for b in row if b.get("value") is not None]
        means.append(float(np.mean(values)) if values else None)
    scored = [(m, -i) for i, m in enumerate(means) if m is not None]
    if not scored:
        return {
            "layer": n_layers // 2,
            "source": "middle block (the decision stage has no read-out)",
            "accuracy": None,
        }
    _, negative = max(scored)
    return {
        "layer": -negative,
        "source": "decision read-out peak (mean held-out accuracy over reasoning progress)",
        "accuracy": means,
    }


STAGE = register(
    Stage(
        name="patching",
        run=run,
        reads=("rollouts", "decision"),
        writes=("patching results", "patching records", "patching heatmap"),
        section="patching",
        uses=("agent",),
        weights=True,
        control=True,
        seconds=128,
    )
)
