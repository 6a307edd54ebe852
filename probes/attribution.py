"""Attribution patching over every block x position (AtP*, Kramar et al. 2024).

For a prepared pair (:class:`~goalprobe.probes.patching.experiment.PreparedPair`: the prompts
align token for token) both runs are teacher-forced on the base's own reasoning. Patching the
counterfactual's residual stream into the base run at block ``L`` and position ``p`` changes a
metric ``M`` by, to first order, ``atp[L, p] = (a_cf[L, p] - a_base[L, p]) . dM/da_base[L,
p]``, from one gradient run of the base and one clean run of the counterfactual. Positions
before the first changed cell are exactly 0 (causal attention). **GradDrop** (against
cancellation): the estimate with block ``l``'s gradient branch dropped, for each ``l``,
``graddrop[L, p] = sum_l |atp_l[L, p]| / (n_layers - 1)``, a magnitude for ranking sites.

**Metrics** (:data:`METRICS`): ``"action"``, the logit of the counterfactual's action minus the
base's at the readout (none when the two agree); ``"coordinates"``, the summed log-probability
of the agent's and goal's coordinate tokens where the base reasoning writes them
(:func:`coordinate_positions`). A site's estimate at a block sums its positions
(:func:`site_estimates`).

**File** (:func:`write_attributions`, :func:`read_attributions`): ``<stem>.safetensors`` (the
arrays of each :class:`PairAttribution`, ``atp.i``, ``graddrop.i``, ...) + ``<stem>.json`` (the
card: schema, the caller's ``meta`` and one ``records`` entry per record), never pickle; the
layout is in docs/formats.md, "Attribution".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from goalprobe.activations.capture.base import Patch, ResidualBackend
from goalprobe.probes.patching.experiment import PreparedPair
from goalprobe.probes.patching.sites import (
    ActionTokens,
    TeacherForcedSequence,
    site_positions,
    token_char_spans,
)
from goalprobe.probes.serialization import check_schema, stem_paths

METRICS: tuple[str, ...] = ("action", "coordinates")
"""The attribution metrics; see the module docstring."""

POSITION_SETS: tuple[str, ...] = ("prompt", "all")
"""Which positions are attributed: the prompt's, or every position (the reasoning too)."""

ESTIMATE_SITES: tuple[str, ...] = ("grid", "changed_cells", "pre_reasoning")
"""Prompt sites whose summed estimate :func:`site_estimates` gives."""

_COORDINATES = re.compile(r"A is at \((\d+), (\d+)\)\. G is at \((\d+), (\d+)\)")


@dataclass(frozen=True)
class AttributionConfig:
    """What to attribute."""

    metrics: tuple[str, ...] = METRICS
    """A subset of :data:`METRICS`."""
    positions: str = "prompt"
    """``"prompt"`` (every prompt position) or ``"all"`` (the reasoning's too)."""
    grad_drop: bool = True
    """Also compute the GradDrop magnitude (a backward pass per block more; hooks backend)."""

    def __post_init__(self) -> None:
        if not self.metrics or any(m not in METRICS for m in self.metrics):
            raise ValueError(f"metrics must be a non-empty subset of {METRICS}, got {self.metrics}")
        if self.positions not in POSITION_SETS:
            raise ValueError(f"positions must be one of {POSITION_SETS}, got {self.positions!r}")


@dataclass(frozen=True)
class MetricSpec:
    """A metric of one sequence's logits: ``sum(signs * value[readouts, token_ids])``, the values
    log-probabilities (``log_prob``) or raw logits; ``readouts`` ascending, all ``(R,)``."""

    name: str
    readouts: np.ndarray
    token_ids: np.ndarray
    signs: np.ndarray
    log_prob: bool

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The metric of ``(R, vocab)`` logits at :attr:`readouts`."""
        return self.batch(logits[None])[0]

    def batch(self, logits: torch.Tensor) -> torch.Tensor:
        """``(P,)`` the metric of ``(P, R, vocab)`` logits."""
        values = torch.log_softmax(logits, dim=-1) if self.log_prob else logits
        index = torch.as_tensor(self.token_ids, device=logits.device)
        rows = torch.arange(len(index), device=logits.device)
        picked = values[:, rows, index]
        signs = torch.as_tensor(self.signs, dtype=picked.dtype, device=logits.device)
        return (picked * signs).sum(dim=-1)


def coordinate_positions(sequence: TeacherForcedSequence, tokenizer) -> np.ndarray | None:
    """Positions of every token of the four numbers of ``A is at (r, c). G is at (r, c)`` in the
    reasoning, or None when it does not write them."""
    begin, end = sequence.reasoning_span
    ids = sequence.token_ids[begin:end]
    if len(ids) == 0:
        return None
    text, spans = token_char_spans(ids.tolist(), tokenizer)
    match = _COORDINATES.search(text)
    if match is None:
        return None
    positions: list[int] = []
    for group in range(1, 5):
        start, stop = match.span(group)
        covering = np.flatnonzero((spans[:, 0] < stop) & (spans[:, 1] > start))
        positions.extend(int(k) + begin for k in covering)
    return np.unique(np.asarray(positions, dtype=np.int64))


def action_metric(pair: PreparedPair, action_tokens: ActionTokens) -> MetricSpec | None:
    """Metric (a): counterfactual's action logit minus the base's at the base's readout; None
    when both sides act alike."""
    base, cf = pair.base.action, pair.cf.action
    if base == cf:
        return None
    ids = action_tokens.action_ids
    readout = pair.base.sequence.readout_position
    return MetricSpec(
        name="action",
        readouts=np.asarray([readout, readout], dtype=np.int64),
        token_ids=np.asarray([ids[int(cf)], ids[int(base)]], dtype=np.int64),
        signs=np.asarray([1.0, -1.0]),
        log_prob=False,
    )


def coordinate_metric(sequence: TeacherForcedSequence, tokenizer) -> MetricSpec | None:
    """Metric (b): summed log-probability of the coordinate tokens the base reasoning writes
    (each read at the position before it); None when it writes none."""
    positions = coordinate_positions(sequence, tokenizer)
    if positions is None or len(positions) == 0:
        return None
    return MetricSpec(
        name="coordinates",
        readouts=positions - 1,
        token_ids=sequence.token_ids[positions].astype(np.int64),
        signs=np.ones(len(positions)),
        log_prob=True,
    )


def metric_specs(
    pair: PreparedPair, tokenizer, action_tokens: ActionTokens, metrics: Sequence[str]
) -> dict[str, MetricSpec | None]:
    """The pair's metrics by name (None where a metric is not defined for it)."""
    out: dict[str, MetricSpec | None] = {}
    for name in metrics:
        if name == "action":
            out[name] = action_metric(pair, action_tokens)
        elif name == "coordinates":
            out[name] = coordinate_metric(pair.base.sequence, tokenizer)
        else:
            raise ValueError(f"unknown metric {name!r}; expected one of {METRICS}")
    return out


def counterfactual_ids(pair: PreparedPair) -> np.ndarray:
    """The counterfactual's prompt followed by the base's reasoning and answer prefix (the
    counterfactual teacher-forced on the base's own reasoning)."""
    base = pair.base.sequence
    ids = base.token_ids.copy()
    n = base.prompt_length
    ids[:n] = pair.cf.sequence.token_ids[:n]
    return ids


def noop_patch(d_model: int) -> Patch:
    """A patch that writes nothing (a clean run through the patched-logits path)."""
    return Patch((0,), torch.zeros(0, dtype=torch.long), torch.zeros(1, 0, d_model))


@dataclass(frozen=True)
class PairAttribution:
    """One pair's attribution for one metric: ``atp`` (and ``graddrop``, None when not
    computed) ``(n_layers, k)`` over the ascending ``positions``; ``metric_base`` on the base
    run and ``metric_cf`` on the counterfactual teacher-forced on the base's reasoning; and
    where things are in the prompt (``cell_positions (n, n)``, the anchors, the changed cells,
    the metric's ``readouts`` and the grid text's ``grid_span``, header included).
    """

    pair_id: str
    grid_id: str
    kind: str
    moved: str
    metric: str
    layers: tuple[int, ...]
    positions: np.ndarray
    atp: np.ndarray
    graddrop: np.ndarray | None
    metric_base: float
    metric_cf: float
    prompt_length: int
    cell_positions: np.ndarray
    pre_reasoning: tuple[int, ...]
    changed_cells: tuple[tuple[int, int], ...]
    readouts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    grid_span: tuple[int, int] = (0, 0)

    @property
    def total_effect(self) -> float:
        """``metric_cf - metric_base``."""
        return self.metric_cf - self.metric_base

    def column(self, position: int) -> int:
        """Index of ``position`` in :attr:`positions` (KeyError if not attributed)."""
        where = int(np.searchsorted(self.positions, position))
        if where >= len(self.positions) or self.positions[where] != position:
            raise KeyError(f"position {position} was not attributed")
        return where


def attribute_pair(
    pair: PreparedPair,
    backend: ResidualBackend,
    specs: dict[str, MetricSpec | None],
    config: AttributionConfig = AttributionConfig(),
) -> list[PairAttribution]:
    """Attribution of every block x position of ``pair`` for each defined metric of ``specs``
    (one gradient run of the base per metric, one clean run of the counterfactual)."""
    base = pair.base.sequence
    ids = base.token_ids
    cf_ids = counterfactual_ids(pair)
    length = base.prompt_length if config.positions == "prompt" else len(base)
    positions = np.arange(length, dtype=np.int64)
    layers = list(range(backend.n_layers))
    drops: tuple[int | None, ...] = (None, *layers) if config.grad_drop else (None,)
    cf_clean = backend.clean_run(cf_ids, layers, positions)
    out = []
    for name, spec in specs.items():
        if spec is None:
            continue
        run = backend.gradient_run(ids, layers, positions, spec, spec.readouts, drops=drops)
        delta = cf_clean.acts.to(run.acts.dtype) - run.acts
        per_drop = (delta[None] * run.grads).sum(dim=-1).numpy().astype(np.float64)
        graddrop = None
        if config.grad_drop:
            graddrop = np.abs(per_drop[1:]).sum(axis=0) / max(len(layers) - 1, 1)
        cf_logits = backend.patched_logits_at(cf_ids, [noop_patch(backend.d_model)], spec.readouts)
        out.append(
            PairAttribution(
                pair_id=pair.pair.pair_id,
                grid_id=pair.pair.base.grid_id,
                kind=pair.pair.kind,
                moved=pair.pair.moved,
                metric=name,
                layers=tuple(layers),
                positions=positions,
                atp=per_drop[0],
                graddrop=graddrop,
                metric_base=run.metric,
                metric_cf=float(spec.batch(cf_logits)[0]),
                prompt_length=base.prompt_length,
                cell_positions=base.grid.cell_positions.copy(),
                pre_reasoning=tuple(int(p) for p in base.anchors.pre_reasoning),
                changed_cells=tuple((int(c[0]), int(c[1])) for c in pair.pair.changed_cells),
                readouts=spec.readouts.copy(),
                grid_span=(int(base.grid.span[0]), int(base.grid.span[1])),
            )
        )
    return out


def attribute_pairs(
    pairs: Sequence[PreparedPair],
    backend: ResidualBackend,
    config: AttributionConfig = AttributionConfig(),
    *,
    progress=None,
) -> list[PairAttribution]:
    """:func:`attribute_pair` over prepared pairs (``backend`` needs a tokenizer)."""
    if backend.tokenizer is None:
        raise ValueError(f"the {backend.name} backend needs the model's tokenizer to attribute")
    action_tokens = ActionTokens.from_tokenizer(backend.tokenizer)
    out: list[PairAttribution] = []
    for index, pair in enumerate(pairs):
        if progress is not None:
            progress(index, len(pairs))
        specs = metric_specs(pair, backend.tokenizer, action_tokens, config.metrics)
        out.extend(attribute_pair(pair, backend, specs, config))
    return out


def site_estimates(
    attribution: PairAttribution, pair: PreparedPair, sites: Sequence[str] = ESTIMATE_SITES
) -> dict[str, np.ndarray]:
    """``{site: (n_layers,)}`` the estimate of patching each site's positions at one block:
    the sum of :attr:`PairAttribution.atp` over them."""
    base, cf = pair.base.sequence, pair.cf.sequence
    out = {}
    for site in sites:
        _, target = site_positions(cf, base, site, pair.pair.changed_cells)
        columns = [attribution.column(int(p)) for p in target]
        out[site] = attribution.atp[:, columns].sum(axis=1)
    return out


REGIONS: tuple[str, ...] = ("changed_cells", "other_grid", "instructions", "pre_reasoning")
"""Where in the prompt (:func:`regions`): the changed cells' tokens, the rest of the grid's,
every other token (system, developer and user text) and the pre-reasoning anchors."""


def regions(attribution: PairAttribution) -> np.ndarray:
    """``(k,)`` the index in :data:`REGIONS` of every attributed position (positions after the
    prompt count as instructions' neighbours: index 2)."""
    changed = [int(attribution.cell_positions[r, c]) for r, c in attribution.changed_cells]
    start, stop = attribution.grid_span
    p = attribution.positions
    out = np.full(len(p), 2, dtype=np.int64)
    out[np.isin(p, attribution.pre_reasoning)] = 3  # later rules take precedence
    out[(p >= start) & (p < stop)] = 1
    out[np.isin(p, changed)] = 0
    return out


def region_shares(values: np.ndarray, region: np.ndarray) -> np.ndarray:
    """``(n_layers, len(REGIONS))`` each region's share of the total ``|values|`` (an
    ``(n_layers, k)`` attribution or real effect; all zero when ``values`` is)."""
    magnitude = np.abs(np.asarray(values, dtype=np.float64))
    total = magnitude.sum() or 1.0
    return np.stack(
        [magnitude[:, region == r].sum(axis=1) / total for r in range(len(REGIONS))], axis=1
    )


def where_read(records: Sequence[PairAttribution]) -> dict:
    """Per metric, where the attribution lies: the mean over pairs of each region's share of the
    pair's GradDrop magnitude (``|atp|`` without GradDrop) by block, and the pairs behind it."""
    out: dict = {}
    for metric in dict.fromkeys(r.metric for r in records):
        mine = [r for r in records if r.metric == metric]
        shares = [
            region_shares(r.atp if r.graddrop is None else r.graddrop, regions(r)) for r in mine
        ]
        out[metric] = {
            "regions": list(REGIONS),
            "share_by_block": np.mean(shares, axis=0).tolist(),
            "source": "graddrop" if all(r.graddrop is not None for r in mine) else "abs_atp",
            "n_pairs": len(mine),
            "n_grids": len({r.grid_id for r in mine}),
        }
    return out


def top_region(records: Sequence[PairAttribution], metric: str) -> dict | None:
    """Where ``metric``'s attribution lies most (a description, not a test: chosen on the same
    pairs), or None: the region with the largest mean share of the GradDrop magnitude
    (``|atp|`` without), its share with an interval over grids (:func:`grid_mean`), and the
    share a uniform attribution would give it (of the positions from the first changed cell on).

    Returns ``{region, share, uniform_share, shares: {region: mean}, n_pairs, n_grids}``.
    """
    from goalprobe.stats.bootstrap import grid_mean

    mine = [r for r in records if r.metric == metric]
    if not mine:
        return None
    per_pair, uniform = [], []
    for r in mine:
        region = regions(r)
        values = r.atp if r.graddrop is None else r.graddrop
        per_pair.append(region_shares(values, region).sum(axis=0))
        first = min(int(r.cell_positions[c]) for c in r.changed_cells)
        affected = region[r.positions >= first]
        uniform.append(np.bincount(affected, minlength=len(REGIONS)) / max(len(affected), 1))
    shares = np.mean(per_pair, axis=0)
    top = int(np.argmax(shares))
    by_grid: dict[str, list[float]] = {}
    for r, s in zip(mine, per_pair, strict=True):
        by_grid.setdefault(r.grid_id, []).append(float(s[top]))
    share = grid_mean([float(np.mean(v)) for v in by_grid.values()], rate=True)
    return {
        "region": REGIONS[top],
        "share": share,
        "uniform_share": float(np.mean(uniform, axis=0)[top]),
        "shares": {name: float(v) for name, v in zip(REGIONS, shares, strict=True)},
        "n_pairs": len(mine),
        "n_grids": len(by_grid),
    }


SCHEMA = "goalprobe.attribution"
"""``schema`` of the card and the safetensors metadata."""
SCHEMA_VERSION = 1
"""Layout version; bumped on any incompatible change."""

_ARRAYS = {
    "atp": np.float32,
    "graddrop": np.float32,
    "positions": np.int64,
    "cell_positions": np.int64,
    "readouts": np.int64,
}
"""The arrays of a record (``<name>.<index>`` in the safetensors file), in writing order."""
_CARD_FIELDS = (
    "pair_id", "grid_id", "kind", "moved", "metric", "layers", "metric_base", "metric_cf",
    "prompt_length", "pre_reasoning", "changed_cells",
)  # fmt: skip
"""The fields of a record in its card entry (then ``graddrop`` and ``grid_span``)."""


def write_attributions(
    path: str | os.PathLike, records: Sequence[PairAttribution], meta: dict
) -> tuple[Path, Path]:
    """Write ``records`` and ``meta``; returns both paths. The card is written last, so a file
    pair without its card is incomplete."""
    from safetensors.numpy import save

    tensors_path, card_path = stem_paths(path)
    tensors: dict[str, np.ndarray] = {}
    entries = []
    for i, r in enumerate(records):
        for name, dtype in _ARRAYS.items():
            value = getattr(r, name)
            if value is not None:
                tensors[f"{name}.{i}"] = np.ascontiguousarray(value, dtype=dtype)
        entry = {name: getattr(r, name) for name in _CARD_FIELDS}  # json writes tuples as lists
        entries.append(entry | {"graddrop": r.graddrop is not None, "grid_span": r.grid_span})
    tensors_path.parent.mkdir(parents=True, exist_ok=True)
    data = save(tensors, metadata={"schema": SCHEMA, "schema_version": str(SCHEMA_VERSION)})
    tensors_path.write_bytes(_sorted_metadata(data))
    card = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **meta, "records": entries}
    card_path.write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    return tensors_path, card_path


def _sorted_metadata(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its header's ``__metadata__`` keys in sorted order:
    safetensors writes them in hash-map order, which differs between processes, so the same
    records would not give the same bytes. Same length (the header is re-padded with spaces, as
    the format allows)."""
    import struct

    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(text) > length:
        raise ValueError("the sorted safetensors header is longer than the original")
    return data[:8] + text.ljust(length, b" ") + data[8 + length :]


def read_attributions(path: str | os.PathLike) -> tuple[list[PairAttribution], dict]:
    """``(records, card)`` of an attribution file written by :func:`write_attributions`
    (ValueError naming the file on a bad schema or when card and arrays disagree)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    tensors_path, card_path = stem_paths(path)
    card = json.loads(card_path.read_text(encoding="utf-8"))
    check_schema(card, SCHEMA, (SCHEMA_VERSION,), card_path)
    with safe_open(str(tensors_path), framework="numpy") as handle:
        check_schema(handle.metadata() or {}, SCHEMA, (SCHEMA_VERSION,), tensors_path)
    arrays = load_file(str(tensors_path))
    records = []
    for i, e in enumerate(card["records"]):
        try:
            fields = {name: e[name] for name in _CARD_FIELDS}
            fields.update({name: arrays[f"{name}.{i}"] for name in _ARRAYS if name != "graddrop"})
            fields["graddrop"] = arrays[f"graddrop.{i}"] if e["graddrop"] else None
            for name in ("atp", "graddrop"):
                if fields[name] is not None:
                    fields[name] = fields[name].astype(np.float64)
            fields["grid_span"] = e.get("grid_span", (0, 0))
            for name in ("layers", "pre_reasoning", "grid_span"):
                fields[name] = tuple(fields[name])
            fields["changed_cells"] = tuple(tuple(c) for c in e["changed_cells"])
            records.append(PairAttribution(**fields))
        except KeyError as err:
            raise ValueError(f"{tensors_path}: record {i} lacks {err}") from err
    return records, {k: v for k, v in card.items() if k != "records"}
