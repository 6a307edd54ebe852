"""Attribution checked against real patches.

:func:`patch_effects` runs the real patch of every block x position (the counterfactual's
residual stream, teacher-forced on the base's reasoning) and reads the metric's change;
:func:`site_effects` does it for whole sites at one block. :func:`compare` scores the
attribution of :mod:`goalprobe.probes.attribution` against them over the *affected* sites (from
the first changed grid cell on; before it both are exactly 0): Spearman's rho, and the hit rate
of the ``k`` first-ranked sites (a hit: real ``|effect|`` in the pair's top decile) beside the
exact expectation for ``k`` random sites (``k/10``). Disagreement comes from *saturation*
(large effects under-estimated) or *cancellation* (paths whose first-order terms cancel), told
apart by the estimate / effect ratio and the wrong-sign hits it reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.stats
import torch
from goalprobe.activations.capture.base import Patch, ResidualBackend
from goalprobe.probes.attribution import (
    ESTIMATE_SITES,
    MetricSpec,
    PairAttribution,
    counterfactual_ids,
    noop_patch,
)
from goalprobe.probes.patching.experiment import PreparedPair
from goalprobe.probes.patching.sites import site_positions

HIT_QUANTILE = 0.9
"""A real effect at or above this quantile of the pair's affected sites' ``|effect|`` is a hit."""


def first_affected(pair: PreparedPair) -> int:
    """The first position where the two runs can differ: the first prompt token that differs."""
    base = pair.base.sequence.token_ids
    cf = counterfactual_ids(pair)
    differ = np.flatnonzero(base != cf)
    if len(differ) == 0:
        raise ValueError(f"pair {pair.pair.pair_id}: base and counterfactual ids are equal")
    return int(differ[0])


def _patched_metric(backend, ids, patches, spec, batch_size) -> np.ndarray:
    out = []
    for start in range(0, len(patches), batch_size):
        logits = backend.patched_logits_at(ids, patches[start : start + batch_size], spec.readouts)
        out.append(spec.batch(logits).numpy())
    return np.concatenate(out).astype(np.float64)


def patch_effects(
    pair: PreparedPair,
    backend: ResidualBackend,
    spec: MetricSpec,
    attribution: PairAttribution,
    *,
    batch_size: int = 64,
) -> np.ndarray:
    """``(n_layers, k)`` the real change of ``spec`` when block ``L`` at position ``p`` of the
    base run takes the counterfactual's value (0, not run, before :func:`first_affected`)."""
    ids = pair.base.sequence.token_ids
    layers, positions = list(attribution.layers), attribution.positions
    cf = backend.clean_run(counterfactual_ids(pair), layers, positions).acts
    base_value = _patched_metric(backend, ids, [noop_patch(backend.d_model)], spec, 1)[0]
    first = first_affected(pair)
    effects = np.zeros((len(layers), len(positions)), dtype=np.float64)
    todo = [(i, j) for i in range(len(layers)) for j, p in enumerate(positions) if int(p) >= first]
    patches = [
        Patch((layers[i],), torch.as_tensor([int(positions[j])]), cf[i, j][None, None])
        for i, j in todo
    ]
    values = _patched_metric(backend, ids, patches, spec, batch_size)
    for (i, j), value in zip(todo, values, strict=True):
        effects[i, j] = value - base_value
    return effects


def site_effects(
    pair: PreparedPair,
    backend: ResidualBackend,
    spec: MetricSpec,
    layers: Sequence[int],
    sites: Sequence[str] = ESTIMATE_SITES,
) -> dict[str, np.ndarray]:
    """``{site: (n_layers,)}`` the real change of ``spec`` when a whole site of the base run
    takes the counterfactual's values at one block (the base's reasoning teacher-forced)."""
    base, cf = pair.base.sequence, pair.cf.sequence
    ids = base.token_ids
    wanted = {site: site_positions(cf, base, site, pair.pair.changed_cells)[1] for site in sites}
    every = np.unique(np.concatenate(list(wanted.values())))
    clean = backend.clean_run(counterfactual_ids(pair), list(layers), every)
    base_value = _patched_metric(backend, ids, [noop_patch(backend.d_model)], spec, 1)[0]
    out = {}
    for site, positions in wanted.items():
        where = np.searchsorted(every, positions)
        patches = [
            Patch((int(layer),), torch.as_tensor(positions), clean.acts[i, where][None])
            for i, layer in enumerate(layers)
        ]
        out[site] = _patched_metric(backend, ids, patches, spec, len(patches)) - base_value
    return out


@dataclass(frozen=True)
class Agreement:
    """How one pair's attribution agrees with its real patches over ``n_sites`` affected sites:
    Spearman's rho of ``atp`` and the effect (and of GradDrop and ``|effect|``; None when
    constant or not computed), the hits among the ``top_k`` first-ranked sites beside the
    random rate, the median estimate / effect over the top-decile sites (``scale_top``, 1:
    exact) and how many of them have the wrong sign, and the whole prompt's effect.
    """

    pair_id: str
    grid_id: str
    metric: str
    n_sites: int
    spearman: float | None
    spearman_graddrop: float | None
    top_k: int
    hits_top: int
    random_hit_rate: float
    scale_top: float | None
    wrong_sign_top: int
    total_effect: float

    @property
    def hit_rate(self) -> float:
        """``hits_top / top_k``."""
        return self.hits_top / self.top_k


AGREE_RHO = 0.8
"""Rank agreement at or above which attribution and real patches are said to agree (issue 41)."""

SATURATED_SCALE = 0.5
"""``scale_top`` below this: the largest real effects are under-estimated (saturation)."""


def diagnose(spearman: float | None, scale_top: float | None, wrong_sign_top: int) -> str:
    """Where and why a pair's attribution disagrees with its real patches, in words:
    ``"agrees"`` (rho >= :data:`AGREE_RHO`), else *saturation* (``scale_top`` below
    :data:`SATURATED_SCALE`), *cancellation* (wrong-sign top-decile sites), or rank noise
    among the small effects."""
    if spearman is not None and spearman >= AGREE_RHO:
        return "agrees"
    causes = []
    if scale_top is not None and scale_top < SATURATED_SCALE:
        causes.append(f"saturation (top-decile estimate/effect {scale_top:.2f})")
    if wrong_sign_top > 0:
        causes.append(f"cancellation ({wrong_sign_top} top-decile sites of the wrong sign)")
    if spearman is None:
        return "constant estimate or effect: rank agreement undefined"
    return "; ".join(causes) or "ranks differ among the small effects (top decile consistent)"


def _rho(x: np.ndarray, y: np.ndarray) -> float | None:
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(scipy.stats.spearmanr(x, y).statistic)


def compare(
    attribution: PairAttribution, effects: np.ndarray, first: int, *, top_k: int = 5
) -> Agreement:
    """Score ``attribution`` against the real ``effects`` of :func:`patch_effects` over the
    sites at or after position ``first`` (the module docstring)."""
    keep = attribution.positions >= first
    est = attribution.atp[:, keep].ravel()
    real = effects[:, keep].ravel()
    if len(real) < top_k:
        raise ValueError(f"only {len(real)} affected sites, fewer than top_k={top_k}")
    magnitude = np.abs(real)
    threshold = np.quantile(magnitude, HIT_QUANTILE)
    hit = magnitude >= threshold
    score = np.abs(est) if attribution.graddrop is None else attribution.graddrop[:, keep].ravel()
    order = np.lexsort((np.arange(len(score)), -score))  # ties: the earlier site first
    top = order[:top_k]
    ratio = est[hit] / np.where(real[hit] == 0, np.nan, real[hit])
    ratio = ratio[np.isfinite(ratio)]
    return Agreement(
        pair_id=attribution.pair_id,
        grid_id=attribution.grid_id,
        metric=attribution.metric,
        n_sites=int(len(real)),
        spearman=_rho(est, real),
        spearman_graddrop=None if attribution.graddrop is None else _rho(score, magnitude),
        top_k=top_k,
        hits_top=int(hit[top].sum()),
        random_hit_rate=float(hit.mean()),
        scale_top=float(np.median(ratio)) if len(ratio) else None,
        wrong_sign_top=int(np.sum(np.sign(est[hit]) == -np.sign(real[hit]))),
        total_effect=attribution.total_effect,
    )
