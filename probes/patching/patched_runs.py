"""Patched runs of prepared counterfactual pairs: one :class:`PatchRecord` per patched run,
computed by :func:`run_patching` (every site x layer set x direction, the random-grid control,
the reasoning chunks and the identity patches).

:class:`StoreSource` reads base sources from the activation store (the residual stream at the two
anchors, per trajectory step, float16) for ``"base_to_cf"`` patches whose layers it holds, when
the source sequence equals the recorded ids up to the anchor (``post_reasoning`` needs the
recorded reasoning); stored positions differing from the patch's are an error."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from goalprobe.activations.capture.base import Patch
from goalprobe.activations.store.reader import ActivationStore
from goalprobe.gridworld.core import Action
from goalprobe.probes.patching.counterfactuals import BaseState, CounterfactualPair
from goalprobe.probes.patching.experiment import (
    PatchingContext,
    PreparedPair,
    Side,
)
from goalprobe.probes.patching.sites import (
    PROMPT_SITES,
    SequenceError,
    chunk_positions,
    chunk_site,
    site_positions,
)

from goalprobe.stats import wilson_interval

CHUNK_DIRECTION = "cf_to_base"
"""The one direction reasoning chunks are patched in: the counterfactual's into the base run."""


@dataclass(frozen=True)
class PatchRecord:
    """The outcome of one patched run (one row of the results table).

    Attributes:
        pair_id, base_id, grid_id: the pair, its base and grid.
        kind: ``"disjoint"``, ``"control"`` or ``"random_grid"`` (the disjoint pair's target patched
            with a random other grid of the same size, its source).
        moved, direction: ``"agent"`` or ``"goal"``; ``"base_to_cf"`` or ``"cf_to_base"``.
        site: the patch site (``reasoning_chunk_<i>of<n>`` for a reasoning chunk).
        layers: the layer-set label (``"7"``, ``"all"``, ``"7+15"``).
        n_positions: target positions overwritten.
        mode: ``"teacher_forced"`` or ``"regenerated"``.
        source_values: ``"live"`` (captured now) or ``"store"`` (read from the activation store).
        target_action, source_action, patched_action: the unpatched actions of the two runs and the
            patched one (None: the regenerated answer named none).
        target_optimal, source_optimal: optimal action names of the two states.
        reference_optimal: the set a moved action is scored against: the source's (for
            ``"random_grid"``, the pair's counterfactual side's).
        invalid: the patched answer named no action (regenerated only; never changed or moved).
        action_changed: a valid patched action that differs from the target's unpatched one.
        into_source_optimal, into_reference_optimal, in_target_optimal: the patched action lies in
            that optimal set.
        ld_target, ld_source, ld_patched: ``logsumexp(logits[reference_optimal]) -
            logsumexp(logits[target_optimal])`` over the action logits of the unpatched target, the
            unpatched source and the patched run (NaN for regenerated runs).
        recovered: ``(ld_patched - ld_target) / (ld_source - ld_target)``; NaN when the sets
            coincide, for regenerated and random-grid runs, or a denominator below 1e-6.
        patched_probs: ``(4,)`` softmax of the patched run's action logits (empty when
            regenerated)."""

    pair_id: str
    base_id: str
    grid_id: str
    kind: str
    moved: str
    direction: str
    site: str
    layers: str
    n_positions: int
    mode: str
    source_values: str
    target_action: str | None
    source_action: str | None
    patched_action: str | None
    target_optimal: list[str]
    source_optimal: list[str]
    reference_optimal: list[str]
    invalid: bool
    action_changed: bool
    into_source_optimal: bool
    into_reference_optimal: bool
    in_target_optimal: bool
    ld_target: float
    ld_source: float
    ld_patched: float
    recovered: float
    patched_probs: list[float]


RECOVERED_MIN_DENOMINATOR = 1e-6


def logit_difference(
    action_logits: np.ndarray, toward: frozenset[Action], away: frozenset[Action]
) -> float:
    """``logsumexp(logits[toward]) - logsumexp(logits[away])`` over ``(4,)`` action logits."""
    a = np.asarray(action_logits, dtype=np.float64)
    t = [int(x) for x in sorted(toward)]
    w = [int(x) for x in sorted(away)]
    if not t or not w:
        return math.nan
    return float(np.logaddexp.reduce(a[t]) - np.logaddexp.reduce(a[w]))


def recovered_fraction(ld_patched: float, ld_target: float, ld_source: float) -> float:
    """``(patched - target) / (source - target)``; NaN for a near-zero denominator."""
    denominator = ld_source - ld_target
    if not math.isfinite(denominator) or abs(denominator) < RECOVERED_MIN_DENOMINATOR:
        return math.nan
    return float((ld_patched - ld_target) / denominator)


def _names(actions) -> list[str]:
    return sorted(Action(a).name for a in actions)


@dataclass(frozen=True)
class _Job:
    pair: CounterfactualPair
    kind: str
    direction: str
    source: Side
    target: Side
    reference: frozenset[Action]
    site: str
    label: str
    patch: Patch
    source_values: str
    prefix: tuple[int, ...] = ()
    """Completion ids teacher-forced after the prompt before regenerating (a chunk's run)."""

    @property
    def prompt(self) -> list[int]:
        """The ids a regeneration starts from: the target's prompt, then :attr:`prefix`."""
        return [*self.target.prompt_ids, *self.prefix]


def _tiers(prepared: Sequence[PreparedPair], limit: int | None) -> list[bool]:
    """Per prepared pair: whether it is among the first ``limit`` of its kind (None: all)."""
    seen: Counter = Counter()
    out = []
    for item in prepared:
        seen[item.pair.kind] += 1
        out.append(limit is None or seen[item.pair.kind] <= limit)
    return out


def chunk_jobs(
    item: PreparedPair,
    context: PatchingContext,
    skipped: Counter,
    *,
    random_source: PreparedPair | None,
) -> list[_Job]:
    """The reasoning-chunk patches of one pair (cf -> base, every chunk x chunk layer set), plus,
    for a disjoint pair, the same chunks from a random other grid's base run."""
    n = context.config.reasoning_chunks
    source, target = item.sides(CHUNK_DIRECTION)
    sources: list[tuple[str, Side]] = [(item.pair.kind, source)]
    if item.pair.kind == "disjoint" and context.config.random_control:
        if random_source is None:
            skipped["random_grid reasoning chunks: no other grid of the same size"] += 1
        else:
            sources.append(("random_grid", random_source.base))
    # the sources' reasoning at the chunk blocks, captured now and kept for this pair only
    blocks = sorted({x for _, layer_set in context.chunk_layer_sets for x in layer_set})
    captured = {
        id(side): context.backend.clean_run(
            side.sequence.token_ids,
            blocks,
            np.arange(*side.sequence.reasoning_span, dtype=np.int64),
        )
        for _, side in sources
    }
    jobs = []
    for index in range(n):
        site = chunk_site(index, n)
        for kind, side in sources:
            try:
                src_pos, tgt_pos = chunk_positions(side.sequence, target.sequence, index, n)
            except SequenceError as err:
                skipped[f"{site}{' random_grid' if kind == 'random_grid' else ''}: {err}"] += 1
                continue
            stop = int(tgt_pos[-1]) + 1
            forced = tuple(
                int(i) for i in target.sequence.token_ids[target.sequence.prompt_length : stop]
            )
            for label, layer_set in context.chunk_layer_sets:
                values = captured[id(side)].values(layer_set, src_pos)
                patch = Patch(layer_set, torch.as_tensor(tgt_pos), values)
                jobs.append(
                    _Job(
                        item.pair, kind, CHUNK_DIRECTION, side, target, source.optimal, site,
                        label, patch, "live", forced,
                    )
                )  # fmt: skip
    return jobs


def random_sources(prepared: Sequence[PreparedPair], seed: int = 0) -> list[PreparedPair | None]:
    """Per prepared pair, a seeded random other pair whose base is on a *different* grid of the same
    size with a prompt of the same length (the random-grid control's source; None: none)."""
    out: list[PreparedPair | None] = []
    for index, item in enumerate(prepared):
        grid = item.pair.base.grid
        length = item.base.sequence.prompt_length
        candidates = [
            other
            for other in prepared
            if other.pair.base.grid.size == grid.size
            and other.pair.base.grid_id != item.pair.base.grid_id
            and other.base.sequence.prompt_length == length
        ]
        # one candidate per base (several pairs share a base side)
        unique = list({id(c.base): c for c in candidates}.values())
        if not unique:
            out.append(None)
            continue
        rng = np.random.default_rng([seed, index])
        out.append(unique[int(rng.integers(len(unique)))])
    return out


SANITY_SITE = "grid"
"""The site of the input sanity check (every block at the grid's tokens)."""


def sanity_jobs(item: PreparedPair, context: PatchingContext, skipped: Counter) -> list[_Job]:
    """The input sanity check of one disjoint pair outside the full tier: its whole grid patched at
    every block (layer set ``all``), each direction."""
    if SANITY_SITE not in context.config.sites:  # its positions were not captured
        return []
    layer_sets = dict(context.layer_sets + context.anchor_layer_sets)
    if "all" not in layer_sets:
        skipped["sanity check: no layer set 'all' among layers or anchor_layers"] += 1
        return []
    return [
        job
        for direction in context.config.directions
        for job in _site_jobs(
            item, direction, SANITY_SITE, [("all", layer_sets["all"])], skipped, " (sanity check)"
        )
    ]


def _site_jobs(
    item, direction, site, layer_sets, skipped, note="", store=None, other: Side | None = None
) -> list[_Job]:
    """The patches of ``site`` in one direction, one per layer set (``store``: recorded values;
    ``other``: a random other grid's base run as the source, the ``"random_grid"`` control)."""
    source, target = item.sides(direction)
    sender, cells = (source, item.pair.changed_cells) if other is None else (other, ())
    what = f"{site}{note}" if other is None else f"random_grid {site}"
    try:
        src_pos, tgt_pos = site_positions(sender.sequence, target.sequence, site, cells)
    except SequenceError as err:
        skipped[f"{what}: {err}"] += 1
        return []
    if len(src_pos) != len(tgt_pos):
        skipped[f"{what}: positions differ in number"] += 1
        return []
    jobs = []
    for label, layers in layer_sets:
        values, origin = None, "live"
        if store is not None and direction == "base_to_cf":
            values = store.values(item.pair.base, site, layers, src_pos, source.sequence.token_ids)
            origin = "live" if values is None else "store"
        if values is None:
            values = sender.clean.values(layers, src_pos)
        patch = Patch(layers, torch.as_tensor(tgt_pos), values)
        kind = item.pair.kind if other is None else "random_grid"
        jobs.append(
            _Job(
                item.pair, kind, direction, sender, target, source.optimal, site, label, patch,
                origin,
            )
        )  # fmt: skip
    return jobs


def _jobs(
    item: PreparedPair,
    context: PatchingContext,
    store,
    skipped: Counter,
    *,
    full: bool,
    random_source: PreparedPair | None,
) -> list[_Job]:
    config = context.config
    sites = config.sites if full else [x for x in config.anchor_sites if x in config.sites]
    layer_sets = context.layer_sets if full else context.anchor_layer_sets
    jobs = []
    for direction in config.directions:
        for site in sites:
            jobs.extend(_site_jobs(item, direction, site, layer_sets, skipped, store=store))
        if item.pair.kind != "disjoint" or not config.random_control:
            continue
        if random_source is None:
            skipped["random_grid: no other grid of the same size and prompt length"] += 1
            continue
        other, anchors = random_source.base, context.anchor_layer_sets
        for site in sites:
            if site != "changed_cells":  # the pair's moved cells mean nothing on another grid
                jobs += _site_jobs(item, direction, site, anchors, skipped, other=other)
    return jobs


def _record(job: _Job, mode: str, patched_action, patched_logits) -> PatchRecord:
    source, target = job.source, job.target
    src_opt, tgt_opt, ref_opt = source.optimal, target.optimal, job.reference
    if mode != "teacher_forced":  # regenerated: the parsed answers, no logits
        target_action, source_action = target.generated_action, source.generated_action
        ld_target = ld_source = ld_patched = recovered = math.nan
        probs: list[float] = []
    else:
        target_action, source_action = target.action, source.action
        ld_target = logit_difference(target.action_logits, ref_opt, tgt_opt)
        ld_source = logit_difference(source.action_logits, ref_opt, tgt_opt)
        ld_patched = logit_difference(patched_logits, ref_opt, tgt_opt)
        recovered = (
            math.nan
            if ref_opt == tgt_opt or job.kind == "random_grid"
            else recovered_fraction(ld_patched, ld_target, ld_source)
        )
        shifted = patched_logits - patched_logits.max()
        probs = (np.exp(shifted) / np.exp(shifted).sum()).tolist()
    pair = job.pair
    valid = patched_action is not None
    return PatchRecord(
        pair_id=pair.pair_id,
        base_id=pair.base.base_id,
        grid_id=pair.base.grid_id,
        kind=job.kind,
        moved=pair.moved,
        direction=job.direction,
        site=job.site,
        layers=job.label,
        n_positions=int(len(job.patch.positions)),
        mode=mode,
        source_values=job.source_values,
        target_action=None if target_action is None else target_action.name,
        source_action=None if source_action is None else source_action.name,
        patched_action=None if patched_action is None else patched_action.name,
        target_optimal=_names(tgt_opt),
        source_optimal=_names(src_opt),
        reference_optimal=_names(ref_opt),
        invalid=not valid,
        action_changed=valid and patched_action != target_action,
        into_source_optimal=valid and patched_action in src_opt,
        into_reference_optimal=valid and patched_action in ref_opt,
        in_target_optimal=valid and patched_action in tgt_opt,
        ld_target=ld_target,
        ld_source=ld_source,
        ld_patched=ld_patched,
        recovered=recovered,
        patched_probs=probs,
    )


def run_patching(
    prepared: Sequence[PreparedPair],
    context: PatchingContext,
    *,
    store=None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[PatchRecord], Counter]:
    """Patch the prepared pairs: the first ``config.full_pairs`` of each kind at every site x layer
    set x direction, the others at the anchors (the first ``config.sanity_pairs`` disjoint ones
    also at :func:`sanity_jobs`), with the random-grid control (:class:`PatchConfig`).

    Teacher-forced runs are batched per target (sharing the unpatched prefix's KV cache);
    regenerations (prompt sites, and reasoning chunks) are pooled across pairs, one decoding loop
    per prompt length. ``store`` (:class:`StoreSource`)
    supplies base sources' anchor values where it holds them; ``progress(done, pairs)``.

    Returns:
        ``(records, skipped)``: one :class:`PatchRecord` per patched run (teacher-forced, then
        regenerated), and reason -> count of pairs where a site could not be patched."""
    config = context.config
    action_ids = list(context.action_tokens.action_ids)
    stop_ids = list(context.chat_format.stop_ids)
    records: list[PatchRecord] = []
    skipped: Counter = Counter()
    regenerate: list[_Job] = []
    tiers = _tiers(prepared, config.full_pairs)
    chunk_tiers = _tiers(prepared, config.chunk_pairs if config.reasoning_chunks else 0)
    sanity_tiers = _tiers(prepared, config.sanity_pairs)
    randoms = (
        random_sources(prepared, config.seed) if config.random_control else [None] * len(prepared)
    )
    produced: list[PatchRecord] = []
    for index, item in enumerate(prepared):
        if progress is not None:
            progress(index, len(prepared))
        jobs = _jobs(item, context, store, skipped, full=tiers[index], random_source=randoms[index])
        if sanity_tiers[index] and not tiers[index] and item.pair.kind == "disjoint":
            jobs += sanity_jobs(item, context, skipped)
        by_target: dict[str, list[_Job]] = {}
        for job in jobs:
            by_target.setdefault(job.direction, []).append(job)
        for direction, group in by_target.items():
            identity = identity_job(item, direction, context)
            group += [] if identity is None else [identity]
            target = group[0].target
            # patches that start late share a long unpatched prefix (the backends' prefix_cache)
            group.sort(key=lambda j: int(j.patch.positions.min()))

            def forced(chunk, target=target):
                logits = context.backend.patched_logits(
                    target.sequence.token_ids, [j.patch for j in chunk]
                )
                return [
                    _record(job, "teacher_forced", Action(int(np.argmax(row))), row.astype(float))
                    for job, row in zip(chunk, logits[:, action_ids].numpy(), strict=True)
                ]

            produced += context.batches["teacher_forced"].run(
                group, forced, cap=_forced_cap(context, target, group)
            )
            if config.regenerate:
                regenerate += [j for j in group if j.site in PROMPT_SITES]
        if chunk_tiers[index]:
            regenerate += chunk_jobs(item, context, skipped, random_source=randoms[index])

    def regenerated(chunk):
        completions = context.backend.generate(
            np.asarray([j.prompt for j in chunk], dtype=np.int64),
            [j.patch for j in chunk],
            max_new_tokens=config.max_new_tokens,
            stop_ids=stop_ids,
        )
        return [
            _record(job, "regenerated", context.parse_generated(ids, job.prefix), None)
            for job, ids in zip(chunk, completions, strict=True)
        ]

    # one decoding loop per prompt length (prompt, then any teacher-forced reasoning prefix)
    by_length: dict[int, list[_Job]] = {}
    for job in regenerate:
        by_length.setdefault(len(job.prompt), []).append(job)
    for length, group in sorted(by_length.items()):
        cap = None
        if context.budget is not None:
            cap = context.budget.generation_batch(
                length, config.max_new_tokens, config.regenerate_batch_size
            )
        produced += context.batches["regenerate"].run(group, regenerated, cap=cap)
    records += [r for r in produced if r.kind != IDENTITY]
    context.identity_records.extend(r for r in produced if r.kind == IDENTITY)
    return records, skipped


IDENTITY = "identity"
"""Kind of the identity patch: the target's own clean values written back, in the same batches
as the real patches; it changes the action only through the batch itself (kernels, reductions),
so its rate is the floor of the real patches' rates (:func:`identity_floor`)."""


def identity_job(item: PreparedPair, direction: str, context: PatchingContext) -> _Job | None:
    """The identity patch of ``item``'s target: its own clean values at its first anchor site (else
    first site) and first anchor layer set; None when it has no positions there."""
    config = context.config
    sites = [s for s in config.anchor_sites if s in config.sites] + list(config.sites)
    _, target = item.sides(direction)
    label, layers = context.anchor_layer_sets[0]
    for site in sites:
        try:
            _, positions = site_positions(
                target.sequence, target.sequence, site, item.pair.changed_cells
            )
        except SequenceError:
            continue
        patch = Patch(layers, torch.as_tensor(positions), target.clean.values(layers, positions))
        return _Job(
            item.pair, IDENTITY, direction, target, target, target.optimal, site, label, patch,
            "live",
        )  # fmt: skip
    return None


def identity_floor(records: Sequence[PatchRecord]) -> dict:
    """Per mode: identity patches run, how many changed the action, the rate and its Wilson 95%
    interval (honest at 0%), the floor of the real patches' action-change rates."""
    out = {}
    for mode in ("teacher_forced", "regenerated"):
        rows = [r for r in records if r.mode == mode]
        changed = sum(r.action_changed for r in rows)
        low, high = wilson_interval(changed, len(rows))
        out[mode] = {
            "n": len(rows),
            "action_changed": int(changed),
            "invalid": int(sum(r.invalid for r in rows)),
            "rate": changed / len(rows) if rows else None,
            "interval": [low, high],
        }
    return out


def _forced_cap(context: PatchingContext, target: Side, group: Sequence[_Job]) -> int | None:
    """The most patched copies of ``target`` the memory budget allows (None: no budget), counting
    the tokens after the group's earliest patch when the backend caches the prefix."""
    if context.budget is None:
        return None
    n = len(target.sequence.token_ids)
    start = 0
    if context.backend.prefix_cache:
        start = min(min(int(j.patch.positions.min()) for j in group), n - 1)
    return context.budget.patched_batch(start, n - start, context.config.batch_size)


STORE_SITES: tuple[str, ...] = ("pre_reasoning", "post_reasoning")
"""Sites whose source values a store can provide."""


class StoreSource:
    """Look up base runs in an open activation store by ``(run_id, grid_id, episode, step)``."""

    def __init__(self, store: ActivationStore) -> None:
        self.store = store
        labels = store.labels(["run_id", "grid_id", "episode", "step"])
        keys = zip(*labels.values(), strict=True)  # in the order asked for
        self._rows = {(str(r), str(g), int(e), int(s)): i for i, (r, g, e, s) in enumerate(keys)}

    def row_of(self, base: BaseState) -> int | None:
        """The store row of ``base``'s trajectory step, or None."""
        if base.run_id is None or base.episode is None or base.step is None:
            return None
        return self._rows.get((base.run_id, base.grid_id, base.episode, base.step))

    def values(
        self,
        base: BaseState,
        site: str,
        layers: Sequence[int],
        positions: np.ndarray,
        token_ids: np.ndarray,
    ) -> torch.Tensor | None:
        """``(len(layers), 3, d_model)`` float32 stored values of ``base`` at ``site`` for a source
        sequence ``token_ids`` read at ``positions``; None when the site is not a stored anchor,
        the base has no recorded ids or row, the sequence differs from them up to the anchor, or
        a layer or the stage is not stored. ValueError when the stored positions differ from
        ``positions``."""
        if site not in STORE_SITES or site not in self.store.stages:
            return None
        if base.prompt_token_ids is None or base.generated_token_ids is None:
            return None
        recorded = np.asarray(base.prompt_token_ids + base.generated_token_ids, dtype=np.int64)
        n = int(np.max(positions)) + 1
        if len(recorded) < n or not np.array_equal(recorded[:n], np.asarray(token_ids)[:n]):
            return None
        if any(int(x) not in self.store.layers for x in layers):
            return None
        row = self.row_of(base)
        if row is None or not self.store.present(site)[row]:
            return None
        stored = self.store.positions(site, [row])[0]
        if not np.array_equal(stored.astype(np.int64), np.asarray(positions, dtype=np.int64)):
            raise ValueError(
                f"{self.store.path}: row {row} ({base.base_id}) stores {site} at positions "
                f"{stored.tolist()}, but the patch reads {np.asarray(positions).tolist()}; the "
                "store was extracted from other token ids"
            )
        acts = [self.store.read(site, int(x), [row], dtype=np.float32)[0] for x in layers]
        return torch.from_numpy(np.stack(acts))
