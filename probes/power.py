"""The power of "no wall map beyond the prior": the smallest planted wall signal the headline
probe's verdict detects (minimum detectable effect).

For each planted wall strength (:func:`goalprobe.probes.synthetic.planted_cell_data`) and seed, a
data set shaped as the demo's is scored by the sweep's own
:func:`~goalprobe.probes.probe_sweep.fit_and_score`; "detected" is the demo's verdict (the wall
AUC's selectivity over the strongest control above 0). The minimum detectable effect is the
smallest strength detected in at least ``power`` of the seeds; below it a "no" says nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.probes.probe_sweep import ProbeData, ProbeSweepConfig, fit_and_score
from goalprobe.probes.serialization import ActivationSource
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.synthetic import Layout, PlantedCellData, planted_cell_data

WALL_METRIC = "auc/wall"
"""The headline metric whose verdict the power is computed for."""


@dataclass(frozen=True)
class PowerDesign:
    """The synthetic data set's shape (the demo's probing set by default) and the search."""

    n_grids: int = 420
    """Grids (the demo's probing set: 5 sizes x 6 densities x 14)."""
    steps_per_grid: int = 4
    """Rows per grid (prompt states per probing grid)."""
    sizes: tuple[int, ...] = (7, 9, 11, 13, 15)
    """Grid sides."""
    densities: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    """Wall densities (of the demo's generator with ``grid_seed``, else of random walls)."""
    grid_seed: int | None = None
    """Seed of the demo's grid generator (:func:`demo_layouts`); None: random walls per cell."""
    d_model: int = 128
    """Width of one anchor (the bundled agents' hidden size)."""
    n_anchors: int = 3
    """Anchor tokens per row."""
    signals: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0)
    """Planted wall strengths tried, in increasing order."""
    seeds: tuple[int, ...] = (0, 1)
    """Data sets per strength."""
    power: float = 0.8
    """Share of seeds a strength must be detected in to count."""
    test_fraction: float = 0.25
    """Held-out grids (the sweep's)."""
    n_bootstrap: int = 300
    """Bootstrap of the verdict's interval."""


def as_probe_data(planted: PlantedCellData, label: str = "synthetic") -> ProbeData:
    """A synthetic data set (:func:`planted_cell_data`) as the sweep's :class:`ProbeData`."""
    n = len(planted.grid_ids)
    return ProbeData(
        acts=planted.acts,
        row_ids=np.arange(n, dtype=np.int64),
        grid_ids=planted.grid_ids,
        grid_sizes=planted.grid_sizes,
        densities=planted.densities,
        cell_types=planted.labels,
        agent_row_col=planted.agent_row_col,
        goal_row_col=planted.goal_row_col,
        goal_distance=planted.goal_distance.astype(np.float64),
        source=ActivationSource("synthetic", label, "synthetic", 0),
    )


def demo_layouts(design: PowerDesign) -> list[Layout] | None:
    """The walls, goals and densities of the demo's grid generator at ``design.grid_seed``
    (``n_grids`` spread evenly over sizes x densities), or None without a seed."""
    if design.grid_seed is None:
        return None
    cells = len(design.sizes) * len(design.densities)
    if design.n_grids % cells:
        raise ValueError(f"n_grids={design.n_grids} does not spread evenly over {cells} cells")
    grids = generate_grid_set(
        GridSetConfig(
            sizes=design.sizes,
            densities=design.densities,
            n_per_cell=design.n_grids // cells,
            seed=design.grid_seed,
        )
    )
    return [
        Layout(np.asarray(g.walls, dtype=bool), (g.goal[0], g.goal[1]), float(g.density or 0.0))
        for g in grids
    ]


def _probe_data(
    n_grids: int, design: PowerDesign, signal: float, seed: int, layouts: list[Layout] | None
) -> ProbeData:
    planted = planted_cell_data(
        n_grids,
        steps_per_grid=design.steps_per_grid,
        sizes=design.sizes,
        canvas=max(design.sizes),
        densities=design.densities,
        d_model=design.d_model,
        n_anchors=design.n_anchors,
        wall_signal=signal,
        random_state=seed,
        layouts=layouts,
    )
    return as_probe_data(planted, f"wall_signal={signal},seed={seed}")


def wall_power(estimator, design: PowerDesign = PowerDesign()) -> dict:
    """Detection of planted wall maps by ``estimator`` (the headline probe, unfitted): the
    trials and :func:`summarise`'s detection shares and minimum detectable effect (None when
    no strength tried is detected)."""
    config = ProbeSweepConfig(
        test_fraction=design.test_fraction, n_bootstrap=design.n_bootstrap, random_state=0
    )
    trials = []
    layouts = demo_layouts(design)
    for signal in design.signals:
        for seed in design.seeds:
            data = _probe_data(design.n_grids, design, signal, seed, layouts)
            split = split_by_grid(
                data.grid_ids,
                test_fraction=design.test_fraction,
                stratify=data.grid_sizes,
                random_state=seed,
            )
            _, metrics, _, _ = fit_and_score(config, estimator, data, split.train, split.test)
            sel = metrics.get("selectivity", {}).get(WALL_METRIC, {})
            auc = metrics["models"]["probe"].get(WALL_METRIC, {}).get("value")
            trials.append(
                {
                    "signal": signal,
                    "seed": seed,
                    "detected": bool(sel.get("above_baseline")),
                    "auc": auc,
                    "selectivity": {k: sel.get(k) for k in ("value", "ci_low", "ci_high")},
                    "strongest_control": sel.get("baseline"),
                }
            )
    return summarise(trials, design)


def summarise(trials: Sequence[dict], design: PowerDesign) -> dict:
    """The detection share per strength and the minimum detectable effect of ``trials``."""
    detection = {
        s: float(np.mean([t["detected"] for t in trials if t["signal"] == s]))
        for s in design.signals
    }
    mde = next((s for s in design.signals if detection[s] >= design.power), None)
    aucs = [t["auc"] for t in trials if t["signal"] == mde and t["auc"] is not None]
    return {
        "design": {k: getattr(design, k) for k in design.__dataclass_fields__},
        "trials": list(trials),
        "detection": {f"{s:g}": d for s, d in detection.items()},
        "minimum_detectable_effect": mde,
        "auc_at_mde": float(np.mean(aucs)) if aucs else None,
    }
