"""Stage ``patching``: activation patching between base steps of the main rollouts and their
counterfactual grids (``RUN/patching/``, schema ``goalprobe.patching/2``), and along the
reasoning: chunks of the counterfactual's reasoning written into the base run at the block where
the ``decision`` stage's read-out peaks, the rest of the reasoning regenerated (issue 30)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from goalprobe.activations.capture import make_backend
from goalprobe.probes.patching.counterfactuals import CounterfactualConfig, build_counterfactuals
from goalprobe.probes.patching.experiment import PatchConfig, PatchingBudget
from goalprobe.probes.patching.run import draw_bases, read_trajectory_bases, run_experiment
from goalprobe.run_layout import ARTEFACTS, write_atomic
from goalprobe.sections import PatchingConfig
from goalprobe.stages.context import StageContext
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.viewer.figures.patching import patch_summary_figure


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Draw bases, build counterfactual pairs (disjoint ones on every base, controls on the
    first ``control_bases``), patch, and summarise with grid-clustered intervals and the
    anchors' verdicts (:func:`patch`, as ``goalprobe patch`` does)."""
    p = config.patching
    trajectories = context.layout.trajectories
    read = read_trajectory_bases(trajectories)
    loaded = context.agent(config.agent).loaded()
    outcome, paths = patch(
        read.bases,
        make_backend("nnsight", loaded.model, loaded.tokenizer),
        patch_config(p, read.reasoning_effort, read.template_dir),
        stage_dir,
        pairs=pair_settings(p),
        n_resamples=p.n_bootstrap,
        lens=context.layout.decision_lens,
        model_id=loaded.model_id,
        model_revision=loaded.revision,
        input_name=context.layout.relative(trajectories),
        budget=PatchingBudget.for_model(loaded.model, config.agent.device),
        batches=stage_dir / BATCHES_FILE,
    )
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
    write_atomic(path, json.dumps(limits, indent=1))


def patch_config(p: PatchingConfig, effort: Any, template_dir: str | None) -> PatchConfig:
    """The demo section's :class:`PatchConfig`, with the prompts' reasoning effort and
    templates (those of the trajectories)."""
    return dataclasses.replace(p.patch, reasoning_effort=effort, template_dir=template_dir)


@dataclass(frozen=True)
class PairSettings:
    """Which bases are drawn and which counterfactual pairs each gets."""

    max_bases: int = 100
    """Most bases, drawn at random (seeded)."""
    disjoint_per_move: int = 1
    """Disjoint pairs per base and move."""
    control_per_move: int = 1
    """Control pairs per control base and move."""
    control_bases: int | None = None
    """Bases (the first drawn) that get control pairs; None: every base."""
    moves: tuple[str, ...] = ("agent", "goal")
    """What moves between base and counterfactual."""
    sizes: tuple[int, ...] | None = None
    """Grid sizes kept (None: all)."""
    seed: int = 0
    """Seed of the base draw, the counterfactuals and the bootstrap."""


def pair_settings(p: PatchingConfig) -> PairSettings:
    """The demo section's base draw and pairs."""
    return PairSettings(
        max_bases=p.max_bases,
        disjoint_per_move=p.disjoint_per_move,
        control_bases=p.control_bases,
        seed=p.patch.seed,
    )


def patch(
    bases: list,
    patcher,
    config: PatchConfig,
    out: Path,
    *,
    pairs: PairSettings,
    n_resamples: int,
    lens: Path | None = None,
    store=None,
    model_id: str | None = None,
    model_revision: str | None = None,
    input_name: str | None = None,
    budget: PatchingBudget | None = None,
    batches: Path | None = None,
):
    """The patching analysis, the one path of ``goalprobe patch`` and of this stage: draw
    ``pairs.max_bases`` of ``bases``, build their counterfactual pairs, patch them through
    ``patcher`` (passes planned in ``budget``; ``batches``: where to record the batches an
    out-of-memory error halved) and write results, records, summary, pairs and heatmap into
    ``out``. The chunk layer ``"peak"`` is :func:`readout_peak` of ``lens``. Returns
    ``(PatchingOutcome, {name: written file})``."""
    peak = None
    if config.reasoning_chunks and lens is not None:
        peak = readout_peak(lens, int(patcher.n_layers))
        chunk_layers = (str(peak["layer"]) if s == "peak" else s for s in config.chunk_layers)
        config = dataclasses.replace(config, chunk_layers=tuple(chunk_layers))
    drawn = draw_bases(bases, pairs.max_bases, pairs.seed, sizes=pairs.sizes)
    recorded = CounterfactualConfig(
        moves=pairs.moves,
        disjoint_per_move=pairs.disjoint_per_move,
        control_per_move=pairs.control_per_move,
        random_state=pairs.seed,
    )
    disjoint = dataclasses.replace(recorded, control_per_move=0)
    controls = dataclasses.replace(recorded, disjoint_per_move=0)
    control_bases = drawn if pairs.control_bases is None else drawn[: pairs.control_bases]
    outcome = run_experiment(
        drawn,
        patcher,
        config,
        recorded,
        pairs=build_counterfactuals(drawn, disjoint)
        + build_counterfactuals(control_bases, controls),
        store=store,
        n_resamples=n_resamples,
        random_state=pairs.seed,
        model_id=model_id,
        model_revision=model_revision,
        input_name=input_name,
        budget=budget,
        batch_limits=(
            json.loads(batches.read_text(encoding="utf-8"))
            if batches is not None and batches.is_file()
            else None
        ),
        on_halve=None if batches is None else lambda halved: _record_batch(batches, halved),
    )
    if peak is not None:
        outcome.meta["reasoning_chunks"]["peak"] = peak
    paths = outcome.write(out)
    paths["heatmap_html"] = write_patch_heatmap(out, outcome.summary)
    return outcome, paths


def readout_peak(lens_path: Path, n_layers: int) -> dict:
    """The block where the decision stage's read-out of the answered action peaks (highest mean
    held-out accuracy over the reasoning-progress bins, earliest on ties; the middle block
    without a read-out): ``{"layer", "source", "accuracy"}``. The read-out is fitted on the
    decision stage's own steps, so the choice never looks at a patching outcome."""
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


def write_patch_heatmap(out_dir: Path, summary: Sequence) -> Path:
    """Write the site x layers heatmaps of a patching ``summary`` (``SummaryRow`` objects or
    their mappings) as self-contained HTML into ``out_dir`` (``patch_heatmap.html``)."""
    path = Path(out_dir) / Path(ARTEFACTS["patching heatmap"].relative).name
    rows = [asdict(r) if is_dataclass(r) and not isinstance(r, type) else r for r in summary]
    # a fixed div id: the same summary gives the same bytes (plotly draws a random one)
    patch_summary_figure(rows).write_html(path, include_plotlyjs=True, div_id="patch-heatmap")
    return path


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
