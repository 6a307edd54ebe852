"""The patching experiment from base states to written results, in one call.

:func:`run_experiment` draws counterfactual pairs, prepares them, patches every site x layer set
x direction and summarises with grid-bootstrap intervals; :meth:`PatchingOutcome.write` writes
the files. ``goalprobe patch`` and the demo's ``patching`` stage both call it, with bases from
:func:`read_trajectory_bases` (or grid start states) thinned by :func:`draw_bases`."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from goalprobe.activations.capture.base import ResidualBackend
from goalprobe.agents.harmony import ReasoningEffort
from goalprobe.agents.oom import HalvingBatch
from goalprobe.agents.trajectories import read_run_header, read_steps
from goalprobe.probes.patching.counterfactuals import (
    BaseState,
    CounterfactualConfig,
    CounterfactualPair,
    base_from_step,
    build_counterfactuals,
)
from goalprobe.probes.patching.experiment import (
    PatchConfig,
    PatchingBudget,
    PatchingContext,
    PreparationReport,
    PreparedPair,
    prepare_pairs,
)
from goalprobe.probes.patching.patched_runs import (
    CHUNK_DIRECTION,
    PatchRecord,
    StoreSource,
    identity_floor,
    run_patching,
)
from goalprobe.probes.patching.results import (
    PAIRS_FILE,
    SummaryRow,
    anchor_verdicts,
    summarize,
    write_results,
)
from goalprobe.probes.patching.sites import chunk_site

CHUNK_ALIGNMENT = (
    "chunk i of n covers the fraction [(i-1)/n, i/n) of each side's reasoning tokens; each "
    "base position takes the counterfactual's value at the same relative place in its chunk "
    "(nearest below). The base is teacher-forced on its own reasoning up to the chunk's end, "
    "the rest of the reasoning and the answer are regenerated greedily."
)
"""How reasoning chunks of different lengths are aligned (recorded in the results)."""


@dataclass(frozen=True)
class TrajectoryBases:
    """One base per step of every finished episode of a trajectory file, in file order, with its
    run's reasoning effort (``"low"`` if not recorded) and templates directory (None: packaged)."""

    bases: list[BaseState]
    reasoning_effort: ReasoningEffort
    template_dir: str | None


def read_trajectory_bases(path: str | os.PathLike) -> TrajectoryBases:
    """Every step of the trajectory JSONL at ``path`` as a base; ValueError naming the file and step
    when a step does not describe a consistent state."""
    header = read_run_header(path)
    bases = [
        base_from_step(s, where=f"{path}: step {s.grid_id}/{s.episode}/{s.step}")
        for s in read_steps(path)
    ]
    return TrajectoryBases(
        bases=bases,
        reasoning_effort=header.config.get("reasoning_effort", "low"),
        template_dir=header.config.get("template_dir"),
    )


def draw_bases(
    bases: Sequence[BaseState],
    max_bases: int,
    random_state: int = 0,
    *,
    sizes: Iterable[int] | None = None,
) -> list[BaseState]:
    """Keep the bases on grids of ``sizes`` (None: all), then at most ``max_bases`` of them,
    drawn without replacement (seeded) and kept in their original order."""
    if sizes is not None:
        keep = {int(s) for s in sizes}
        bases = [b for b in bases if b.grid.size in keep]
    bases = list(bases)
    if len(bases) > max_bases:
        rng = np.random.default_rng(random_state)
        bases = [bases[i] for i in np.sort(rng.choice(len(bases), max_bases, replace=False))]
    return bases


@dataclass(frozen=True)
class PatchingOutcome:
    """What one patching experiment produced: the kept pairs, the preparation report, one record per
    patched run, the per-cell summary, and ``meta``, the JSON-ready facts written beside the
    tables (inputs, configs, counts, skipped sites, the anchors' verdicts and, with reasoning
    chunks, their verdicts with Bonferroni-adjusted intervals over the chunk x layer-set
    ``family``)."""

    prepared: list[PreparedPair]
    report: PreparationReport
    records: list[PatchRecord]
    summary: list[SummaryRow]
    meta: dict

    def write(self, directory: str | os.PathLike) -> dict[str, Path]:
        """Write the kept pairs (JSONL), records and summary (CSV) and the JSON bundle into
        ``directory``; returns name -> path of every file."""
        paths = write_results(directory, self.records, self.summary, self.meta)
        pairs = Path(directory) / PAIRS_FILE
        with pairs.open("w", encoding="utf-8") as handle:
            for item in self.prepared:
                handle.write(json.dumps(item.pair.to_dict()) + "\n")
        return {**paths, "pairs_jsonl": pairs}


def run_experiment(
    bases: Sequence[BaseState],
    backend: ResidualBackend,
    config: PatchConfig,
    counterfactuals: CounterfactualConfig = CounterfactualConfig(),
    *,
    pairs: Sequence[CounterfactualPair] | None = None,
    store: StoreSource | None = None,
    n_resamples: int = 2000,
    random_state: int | None = 0,
    model_id: str | None = None,
    model_revision: str | None = None,
    input_name: str | None = None,
    budget: PatchingBudget | None = None,
    batch_limits: Mapping[str, int] | None = None,
    on_halve: Callable[[HalvingBatch], None] | None = None,
) -> PatchingOutcome:
    """Draw pairs for ``bases`` (unless ``pairs`` are given), prepare them, patch every site x layer
    set x direction, and summarise.

    ``store`` supplies recorded anchor values; ``model_id``, ``model_revision`` and
    ``input_name`` are recorded; ``budget`` plans the run (and refuses it) before any greedy
    completion and sizes each forward pass (None: the config's batches); ``batch_limits`` are
    batches an earlier run was halved to; ``on_halve`` is called after each halving.

    Raises:
        ValueError: a layer-set spec the model cannot resolve.
        goalprobe.probes.patching.sites.SequenceError: the inputs do not fit the tokenizer or
            template."""
    if pairs is None:
        pairs = build_counterfactuals(bases, counterfactuals)
    context = PatchingContext(
        backend, config, budget=budget, batch_limits=batch_limits, on_halve=on_halve
    )
    prepared, report = prepare_pairs(pairs, context)
    records, skipped = run_patching(prepared, context, store=store)
    summary = summarize(records, n_resamples=n_resamples, random_state=random_state)
    verdicts = anchor_verdicts(records, n_resamples=n_resamples, random_state=random_state)
    chunks = [chunk_site(i, config.reasoning_chunks) for i in range(config.reasoning_chunks)]
    meta = {
        "model": model_id,
        "model_revision": model_revision,
        "backend": backend.name,
        "n_layers": backend.n_layers,
        "layer_sets": {label: list(layers) for label, layers in context.layer_sets},
        "config": asdict(config),
        "counterfactuals": asdict(counterfactuals),
        "input": input_name,
        "n_bases": len(bases),
        "preparation": report.to_dict(),
        "skipped_sites": dict(skipped),
        "n_pairs": dict(Counter(p.pair.kind for p in prepared)),
        "verdicts": verdicts,
        "identity_floor": identity_floor(context.identity_records),
        "memory": {
            "plan": None if context.plan is None else asdict(context.plan),
            "batches": {name: b.to_dict() for name, b in context.batches.items()},
        },
    }
    if chunks:
        # the chunk x layer-set verdicts are one family: Bonferroni-adjusted intervals
        confidence = 1 - 0.05 / (len(chunks) * len(context.chunk_layer_sets))
        meta["reasoning_chunks"] = {
            "n_chunks": config.reasoning_chunks,
            "sites": chunks,
            "direction": CHUNK_DIRECTION,
            "layer_sets": {label: list(layers) for label, layers in context.chunk_layer_sets},
            "alignment": CHUNK_ALIGNMENT,
            "family": len(chunks) * len(context.chunk_layer_sets),
            "confidence": confidence,
            "verdicts": [
                v
                for label, _ in context.chunk_layer_sets
                for v in anchor_verdicts(
                    records,
                    layers=label,
                    sites=chunks,
                    n_resamples=n_resamples,
                    confidence=confidence,
                    random_state=random_state,
                )
            ],
        }
    return PatchingOutcome(prepared, report, records, summary, meta)
