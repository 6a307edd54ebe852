"""The headline probe under several training seeds: the same data and split, the seed of the
probe's initialisation and minibatch order varied, every seed's metrics and the seed-pooled
intervals (:func:`goalprobe.stats.seed_pooled`) of the headline metrics and of their
selectivity over the strongest control. A verdict that holds for one seed but not across seeds
is not reported as holding: where the seeds disagree by more than their own intervals, or
some seed says yes and the pool does not, the verdict is ``"unstable"``, not ``"no"``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from goalprobe.probes.probe_sweep import ProbeData, ProbeSweepConfig, fit_and_score
from sklearn.base import clone

from goalprobe.stats import Estimate, seed_pooled

HEADLINE_METRICS: tuple[str, ...] = ("accuracy_no_padding", "auc/wall", "agent_top1", "goal_top1")
"""The headline rows' metrics."""


def seed_runs(
    estimator,
    data: ProbeData,
    train: np.ndarray,
    test: np.ndarray,
    config: ProbeSweepConfig,
    seeds: Sequence[int],
    metrics: Sequence[str] = HEADLINE_METRICS,
) -> dict:
    """Fit ``estimator`` once per seed (``random_state``) on ``train``, score on ``test``.

    Returns ``{seeds, per_seed: [{seed, metric: {probe, selectivity}}], pooled: {metric:
    {probe, selectivity}}}``, pooled by :func:`~goalprobe.stats.seed_pooled`, with
    ``seeds_disagree`` (:func:`intervals_disjoint`) and, on the selectivity, ``baseline``,
    ``above_baseline`` and :func:`seed_verdict`.
    """
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        seeded = clone(estimator).set_params(random_state=seed)
        _, m, _, _ = fit_and_score(config, seeded, data, train, test)
        scores = {"probe": m["models"]["probe"], "selectivity": m.get("selectivity", {})}
        by_metric = {k: {name: s.get(k) for name, s in scores.items()} for k in metrics}
        per_seed.append({"seed": int(seed), **by_metric})
    pooled = {}
    for k in metrics:
        probe = [s[k]["probe"] for s in per_seed if s[k]["probe"]]
        sel = [s[k]["selectivity"] for s in per_seed if s[k]["selectivity"]]
        if not probe:
            continue
        # every pooled probe metric is a rate or an AUC in [0, 1]; selectivity their difference
        pooled_probe = seed_pooled(probe, config.confidence_level, bounds=(0.0, 1.0))
        pooled_probe["seeds_disagree"] = intervals_disjoint(probe)
        entry: dict[str, Any] = {"probe": pooled_probe, "selectivity": None}
        if sel:
            stat = seed_pooled(sel, config.confidence_level, bounds=(-1.0, 1.0))
            baselines = sorted({s["baseline"] for s in sel})
            stat["baseline"] = baselines[0] if len(baselines) == 1 else "/".join(baselines)
            stat["above_baseline"] = bool(Estimate.from_dict(stat).above(0))
            stat["seeds_disagree"] = intervals_disjoint(sel)
            stat["verdict"] = seed_verdict(sel, stat)
            entry["selectivity"] = stat
        pooled[k] = entry
    return {"seeds": [int(s) for s in seeds], "per_seed": per_seed, "pooled": pooled}


def intervals_disjoint(stats: Sequence[dict]) -> bool:
    """Whether two of the seeds' intervals do not overlap (the seeds disagree by more than
    their own uncertainty): the highest lower bound above the lowest upper bound."""
    bounded = [s for s in stats if s.get("ci_low") is not None and s.get("ci_high") is not None]
    if len(bounded) < 2:
        return False
    return max(s["ci_low"] for s in bounded) > min(s["ci_high"] for s in bounded)


def seed_verdict(per_seed: Sequence[dict], pooled: dict) -> str:
    """The verdict "above the baseline" across the seeds' selectivities and their ``pooled``
    statistic: ``"yes"`` where the pooled interval lies above 0; ``"unstable"`` where it does not
    and the seeds disagree or some seed alone says yes; else ``"no"``."""
    if Estimate.from_dict(pooled).above(0):
        return "yes"
    seed_yes = any(Estimate.from_dict(s).above(0) for s in per_seed)
    if intervals_disjoint(per_seed) or seed_yes:
        return "unstable"
    return "no"
