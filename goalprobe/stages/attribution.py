"""Stage ``attribution``: attribution patching (AtP with AtP*'s GradDrop) over every block x
prompt position of the patching stage's pairs (``RUN/attribution/``, the file of
:mod:`goalprobe.probes.attribution`), checked against real patches on the first pairs.

:func:`attribute` is the task: ``goalprobe attribute`` and this stage both call it, so the same
pairs and config give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from goalprobe.sections import AttributionSection
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register

if TYPE_CHECKING:
    from goalprobe.probes.patching.counterfactuals import BaseState, CounterfactualPair

ATTRIBUTION_STEM = "attribution"
"""``OUT/attribution.safetensors`` + ``attribution.json`` (docs/formats.md)."""
CHECK_FILE = "attribution_check.json"
"""The check against real patches (absent when none ran)."""
CHECK_SCHEMA = "goalprobe.attribution_check"
"""``schema`` of :data:`CHECK_FILE`."""
CHECK_SCHEMA_VERSION = 1
"""Its layout version (per metric, one :class:`~goalprobe.probes.attribution_check.Agreement`
entry per checked pair)."""
HEATMAP_FILE = "attribution_heatmap.html"
"""The heat map of the first pair of each metric."""


class NoPairError(ValueError):
    """No pair was kept for attribution."""


class DoesNotFitError(ValueError):
    """The backward pass does not fit the device (or the weights are MXFP4)."""


@dataclass(frozen=True)
class AttributionOutcome:
    """What :func:`attribute` wrote and counted."""

    paths: dict[str, Path]
    counts: dict[str, Any]


def read_pairs(
    path: Path, bases: Sequence[BaseState], kinds: Sequence[str], max_pairs: int
) -> list[CounterfactualPair]:
    """The first ``max_pairs`` pairs of ``kinds`` in the pairs JSONL at ``path``, rebuilt from
    ``bases`` (``ValueError`` naming the line of a pair whose base or move is not among them)."""
    from goalprobe.probes.patching.counterfactuals import counterfactual_candidates

    by_id = {b.base_id: b for b in bases}
    out: list[CounterfactualPair] = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if len(out) >= max_pairs:
                break
            entry = json.loads(line)
            if entry["kind"] not in kinds:
                continue
            base = by_id.get(entry["base_id"])
            match = None
            if base is not None:
                candidates = counterfactual_candidates(base, moves=(entry["moved"],))
                match = next((p for p in candidates if p.pair_id == entry["pair_id"]), None)
            if match is None:
                raise ValueError(f"{path}: line {number}: pair {entry['pair_id']!r} is not a "
                                 "counterfactual of the trajectories' steps")  # fmt: skip
            out.append(match)
    return out


def attribute(
    out: Path, pairs: Sequence, loaded, section: AttributionSection, patch_config, *, source: dict
) -> AttributionOutcome:
    """Prepare ``pairs`` as ``patch_config`` says, refuse a backward pass the device cannot
    hold, attribute every block x position with the model ``loaded``, check the first
    ``section.check_pairs`` against real patches, and write the check, the heat map and the
    attribution file (its card last, with ``source``: where the pairs come from) into ``out``.

    Raises:
        NoPairError: no pair survived preparation.
        DoesNotFitError: the backward pass does not fit the device (one line, why).
    """
    from goalprobe.activations.capture import make_backend
    from goalprobe.probes.attribution import (
        attribute_pairs,
        top_region,
        where_read,
        write_attributions,
    )
    from goalprobe.probes.patching.experiment import PatchingContext, prepare_pairs

    runner = make_backend(section.backend, loaded.model, loaded.tokenizer)
    prepared, report = prepare_pairs(list(pairs), PatchingContext(runner, patch_config))
    if not prepared:
        raise NoPairError(
            f"no pair was kept for attribution ({report.n_pairs} offered; dropped "
            f"{dict(report.dropped)})"
        )
    require_fits(runner, [len(p.base.sequence) for p in prepared])
    records = attribute_pairs(prepared, runner, section.attribution)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": loaded.model_id,
        "model_revision": loaded.revision,
        "backend": runner.name,
        "n_layers": runner.n_layers,
        "config": asdict(section.attribution),
        "selection": {k: v for k, v in asdict(section).items() if k != "attribution"},
        **source,
        "reasoning": patch_config.reasoning,
        "preparation": report.to_dict(),
        "where": where_read(records),
        "top_region": {m: top_region(records, m) for m in section.attribution.metrics},
    }
    check = check_against_patches(prepared[: section.check_pairs], records, runner, section)
    paths: dict[str, Path] = {}
    if check is not None:
        paths["check"] = write_json(out / CHECK_FILE, check)
    paths["heatmap"] = write_heatmap(out / HEATMAP_FILE, records, section.attribution.metrics)
    # the card last: an attribution file without its card is incomplete
    paths["tensors"], paths["card"] = write_attributions(out / ATTRIBUTION_STEM, records, meta)
    counts = {
        "pairs": len(prepared),
        "records": len(records),
        "checked": len(prepared[: section.check_pairs]),
    }
    return AttributionOutcome(paths, counts)


def check_against_patches(prepared, records, runner, section: AttributionSection) -> dict | None:
    """Per metric, each checked pair's agreement with the real patch of every affected block x
    position (:func:`~goalprobe.probes.attribution_check.compare`) and where the real effects
    lie (region shares by block); None when no pair is checked."""
    if not prepared:
        return None
    import numpy as np

    from goalprobe.probes.attribution import REGIONS, metric_specs, region_shares, regions
    from goalprobe.probes.attribution_check import compare, first_affected, patch_effects
    from goalprobe.probes.patching.sites import ActionTokens

    action_tokens = ActionTokens.from_tokenizer(runner.tokenizer)
    by_key = {(r.pair_id, r.metric): r for r in records}
    out: dict = {
        "schema": CHECK_SCHEMA,
        "schema_version": CHECK_SCHEMA_VERSION,
        "top_k": section.top_k,
        "regions": list(REGIONS),
        "metrics": {},
    }
    for pair in prepared:
        specs = metric_specs(pair, runner.tokenizer, action_tokens, section.attribution.metrics)
        for metric, spec in specs.items():
            record = by_key.get((pair.pair.pair_id, metric))
            if spec is None or record is None:
                continue
            effects = patch_effects(pair, runner, spec, record)
            first = first_affected(pair)
            agreement = compare(record, effects, first, top_k=section.top_k)
            keep = record.positions >= first
            shares = region_shares(effects[:, keep], regions(record)[keep])
            entry = {**asdict(agreement), "hit_rate": agreement.hit_rate,
                     "real_share_by_block": np.round(shares, 6).tolist()}  # fmt: skip
            out["metrics"].setdefault(metric, []).append(entry)
    return out


def write_heatmap(path: Path, records, metrics: Sequence[str]) -> Path:
    """The heat map of the first pair of each metric (GradDrop when computed), one HTML file
    with plotly.js inlined once and fixed div ids (the same records give the same bytes)."""
    figures: list[str] = []
    for metric in metrics:
        first = next((r for r in records if r.metric == metric), None)
        if first is not None:
            figures.append(
                heatmap_figure(first).to_html(
                    full_html=False, include_plotlyjs=not figures, div_id=f"attribution-{metric}"
                )
            )
    path.write_text("<html><body>" + "\n".join(figures) + "</body></html>", encoding="utf-8")
    return path


def heatmap_figure(record):
    """One record's heat map over prompt positions x blocks (the grid cells laid out as the
    grid): its GradDrop magnitude when computed, else its signed estimate."""
    from goalprobe.viewer.figures.attribution import attribution_map_figure

    values = record.graddrop if record.graddrop is not None else record.atp
    kind = "GradDrop |AtP|" if record.graddrop is not None else "AtP"
    return attribution_map_figure(
        values, record.positions, record.cell_positions, anchors=record.pre_reasoning,
        changed_cells=record.changed_cells, layers=record.layers,
        title=f"{record.metric} ({kind}): {record.pair_id}",
    )  # fmt: skip


def require_fits(runner, lengths) -> None:
    """Refuse (:class:`DoesNotFitError`) gradient runs whose backward pass the device cannot
    hold, or MXFP4 weights (:mod:`goalprobe.activations.plan`), before the first."""
    from goalprobe.activations.capture.gradients import is_mxfp4
    from goalprobe.activations.plan import ModelShape, device_memory_bytes, plan_attribution

    device = str(runner.device)
    plan = plan_attribution(
        lengths,
        ModelShape.from_config(runner.config),
        memory_bytes=device_memory_bytes(device),
        mxfp4=is_mxfp4(runner.model),
        dtype_bytes=runner.dtype.itemsize,
        attention="flex_attention" if runner.attention == "flex_attention" else "eager",
    )
    if not plan.fits:
        raise DoesNotFitError(f"attribution does not fit on {device}: {plan.reason}")


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Attribute the first pairs the patching stage kept (``RUN/patching/patch_pairs.jsonl``)."""
    from goalprobe.probes.patching.experiment import PatchConfig
    from goalprobe.probes.patching.results import PAIRS_FILE
    from goalprobe.probes.patching.run import read_trajectory_bases

    section: AttributionSection = config.attribution
    trajectories = context.layout.trajectories
    pairs_file = context.layout.patching_dir / PAIRS_FILE
    read = read_trajectory_bases(trajectories)
    pairs = read_pairs(pairs_file, read.bases, section.kinds, section.max_pairs)
    if not pairs:  # the patching stage kept none (every step cut off, say): nothing to attribute
        note = {"pairs": 0, "reason": f"{context.layout.relative(pairs_file)} holds no pair of "
                f"the kinds {list(section.kinds)}: the patching stage kept none"}  # fmt: skip
        return {"no_pairs": write_json(stage_dir / "no_pairs.json", note)}, {"pairs": 0}
    patch = config.patching.patch  # prepared as the patching stage prepared them
    patch_config = PatchConfig(
        reasoning=patch.reasoning,
        require_optimal=patch.require_optimal,
        max_new_tokens=patch.max_new_tokens,
        reasoning_effort=read.reasoning_effort,
        template_dir=read.template_dir,
    )
    outcome = attribute(
        stage_dir,
        pairs,
        context.agent(config.agent).loaded(),
        section,
        patch_config,
        source=pair_source(
            context.layout.relative(pairs_file),
            context.layout.relative(trajectories),
            len(read.bases),
        ),
    )
    names = {"card": "attribution", "check": "check"}
    return {names[k]: p for k, p in outcome.paths.items() if k in names}, outcome.counts


def pair_source(pairs: str | None, input_name: str, n_bases: int, counterfactuals=None) -> dict:
    """The card's entries on where the pairs come from: the pairs file ``pairs``, else drawn
    with ``counterfactuals`` (a config as a dict) from the ``n_bases`` bases of ``input_name``."""
    return {
        "counterfactuals": counterfactuals,
        "input": input_name,
        "n_bases": n_bases,
        "pairs": pairs,
    }


def read_check(path: Path) -> dict | None:
    """The check file at ``path`` (None when absent; ``ValueError`` for another schema)."""
    if not Path(path).is_file():
        return None
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("schema") != CHECK_SCHEMA or data.get("schema_version") != CHECK_SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema {data.get('schema')!r} version {data.get('schema_version')!r}, "
            f"expected {CHECK_SCHEMA!r} version {CHECK_SCHEMA_VERSION}"
        )
    return data


STAGE = register(
    Stage(
        name="attribution",
        run=run,
        reads=("rollouts", "patching"),
        writes=("attribution file", "attribution heatmap"),
        section="attribution",
        uses=("agent", "patching"),
        weights=True,
        control=True,
        seconds=40,
        torch_threads=1,
    )
)
