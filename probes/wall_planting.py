"""Planted wall maps in either frame, with density as real grids carry it: the power of the
conditional wall test (:mod:`goalprobe.probes.wall_test`) and its regression cases.

:func:`planted_walls` draws :func:`goalprobe.probes.synthetic.planted_cell_data` on given
layouts (the demo's grids, their densities), then adds

- a **density** direction (the grid's standardised density): the real anchors carry the wall
  count, so a prior handed the true density must not start ahead of the probe;
- the **wall map** at ``strength`` in one frame: ``"absolute"`` (one direction per canvas cell,
  :func:`planted_cell_data`'s ``wall_signal``) or ``"agent"`` (one per offset from the agent's
  cell within ``radius``). Either way a wall direction has per-feature standard deviation
  ``strength / sqrt(active)`` against unit noise (:func:`planted_cell_data`'s convention), so
  a strength means the same per-cell signal in either frame.

:func:`wall_power_curve` runs the test over strengths and seeds and reports the minimum
detectable strength in the statistic's own unit (bits per prior-uncertain cell).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.synthetic import Layout, PlantedCellData, planted_cell_data
from goalprobe.probes.wall_test import (
    Frame,
    WallTestConfig,
    conditional_wall_test,
    frame_cells,
    wall_inputs,
)


def planted_walls(
    layouts: Sequence[Layout],
    *,
    frame: Frame = "absolute",
    strength: float = 0.5,
    steps_per_grid: int = 4,
    sizes: tuple[int, ...] = (7, 9, 11, 13, 15),
    d_model: int = 128,
    n_anchors: int = 3,
    plant_density: bool = True,
    radius: int = 3,
    random_state: int = 0,
) -> PlantedCellData:
    """A synthetic data set on ``layouts`` with a wall map of ``strength`` (0: no wall
    information) planted in ``frame`` (module docstring); the other parameters as
    :func:`planted_cell_data`'s."""
    if frame not in ("absolute", "agent"):
        raise ValueError(f"frame must be 'absolute' or 'agent', got {frame!r}")
    data = planted_cell_data(
        len(layouts),
        steps_per_grid=steps_per_grid,
        sizes=sizes,
        d_model=d_model,
        n_anchors=n_anchors,
        wall_signal=strength if frame == "absolute" else 0.0,
        random_state=random_state,
        layouts=layouts,
    )
    rng = np.random.default_rng([random_state, 7919])
    labels = data.labels
    n, side = labels.shape[0], labels.shape[1]
    walls = (labels == CellType.WALL).reshape(n, -1)
    active = 3.0 + walls.mean() * side * side
    acts = data.acts.reshape(n, -1).astype(np.float32)
    n_features = acts.shape[1]
    if plant_density:
        dens = data.densities
        scaled = (dens - dens.mean()) / max(float(dens.std()), 1e-8)
        direction = rng.standard_normal(n_features).astype(np.float32) / np.sqrt(active)
        acts += np.outer(scaled, direction).astype(np.float32)
    if frame == "agent" and strength:
        flat, inside = frame_cells("agent", side, data.agent_row_col, radius)
        latent = (np.take_along_axis(walls, flat, axis=1) & inside).astype(np.float32)
        directions = rng.standard_normal((latent.shape[1], n_features)).astype(np.float32)
        acts += latent @ (directions * (strength / np.sqrt(active)))
    return replace(data, acts=acts.reshape(data.acts.shape))


def planted_inputs(data: PlantedCellData) -> np.ndarray:
    """:func:`~goalprobe.probes.wall_test.wall_inputs` of a planted data set."""
    return wall_inputs(data.acts, data.grid_sizes, data.densities, data.agent_row_col)


@dataclass(frozen=True)
class WallPowerDesign:
    """The power curve's search (the data's shape comes from the layouts)."""

    strengths: tuple[float, ...] = (0.0, 0.125, 0.25, 0.5, 1.0)
    """Planted strengths, increasing."""
    seeds: tuple[int, ...] = (0, 1)
    """Data sets per strength."""
    frames: tuple[Frame, ...] = ("absolute", "agent")
    """Frames planted (each read by the probe of its own frame)."""
    power: float = 0.8
    """Share of seeds a strength must be detected in."""
    steps_per_grid: int = 4
    """Rows per grid."""
    test_fraction: float = 0.25
    """Held-out grids."""
    plant_density: bool = True
    """Features carry the density (as real anchors do)."""


def wall_power_curve(
    layouts: Sequence[Layout],
    design: WallPowerDesign = WallPowerDesign(),
    config: WallTestConfig = WallTestConfig(),
) -> dict:
    """Detection by the conditional wall test of walls planted in each frame: ``{design,
    frames: {frame: summarise_power(trials)}}``."""
    sizes = tuple(sorted({int(lay.walls.shape[0]) for lay in layouts}))
    out: dict = {"design": design.__dict__.copy(), "frames": {}}
    for frame in design.frames:
        trials = []
        for strength in design.strengths:
            for seed in design.seeds:
                data = planted_walls(
                    layouts,
                    frame=frame,
                    strength=strength,
                    steps_per_grid=design.steps_per_grid,
                    sizes=sizes,
                    plant_density=design.plant_density,
                    radius=config.radius,
                    random_state=seed,
                )
                split = split_by_grid(
                    data.grid_ids,
                    test_fraction=design.test_fraction,
                    stratify=data.grid_sizes,
                    random_state=seed,
                )
                cfg = WallTestConfig(**{**config.__dict__, "frame": frame, "random_state": seed})
                res = conditional_wall_test(
                    planted_inputs(data), data.labels, data.grid_ids, split.train, split.test, cfg
                )
                trial = {
                    "strength": strength,
                    "seed": seed,
                    "detected": res["overall"]["detected"],
                    "bits": res["overall"]["bits"]["difference"],
                    "auc_difference": res["overall"]["auc_within_grid"]["difference"],
                    "median_alpha": float(np.median(res["alpha"])),
                }
                if "rings" in res:
                    trial["ring_bits"] = {
                        k: v["bits"]["difference"]["value"] for k, v in res["rings"].items()
                    }
                trials.append(trial)
        out["frames"][frame] = summarise_power(trials, design)
    return out


def summarise_power(trials: Sequence[dict], design: WallPowerDesign) -> dict:
    """Detection share per strength, the minimum detectable strength (detected in at least
    ``design.power`` of the seeds; None: none tried) and the bits it carries."""
    detection = {
        s: float(np.mean([t["detected"] for t in trials if t["strength"] == s]))
        for s in design.strengths
    }
    bits = {
        s: float(np.mean([t["bits"]["value"] for t in trials if t["strength"] == s]))
        for s in design.strengths
    }
    mds = next((s for s in design.strengths if s > 0 and detection[s] >= design.power), None)
    return {
        "trials": list(trials),
        "detection": {f"{s:g}": d for s, d in detection.items()},
        "bits_by_strength": {f"{s:g}": b for s, b in bits.items()},
        "minimum_detectable_strength": mds,
        "bits_at_mds": None if mds is None else bits[mds],
    }
