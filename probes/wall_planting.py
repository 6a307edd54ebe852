"""Planted maps: synthetic activations with a planted cognitive map (sanity checks, tests,
benchmarks), and the power of the wall read-outs on them: the smallest planted wall signal each
verdict detects (minimum detectable effect; below it a "no" says nothing).

**Synthetic data** (:func:`planted_cell_data`): each grid has random walls (or a given layout),
a goal and several steps (agent cells reachable from the goal); a step's activation is Gaussian
noise plus a random linear image of its latent state (one-hot walls, agent, goal, grid size,
distance to the goal). A working probe recovers the map; on shuffled labels it must not.

**The sweep's verdict** (:func:`wall_power`): for each strength and seed, a data set shaped as
the demo's is scored by the sweep's own
:func:`~goalprobe.probes.probe_sweep.fit_and_score`; "detected" is the demo's verdict (the wall
AUC's selectivity over the strongest control above 0), the minimum detectable effect the
smallest strength detected in at least ``power`` of the seeds.

**The conditional wall test** (:mod:`goalprobe.probes.wall_test`, :func:`wall_power_curve`):
:func:`planted_walls` draws :func:`planted_cell_data` on given layouts (the demo's grids, their
densities), then adds

- a **density** direction (the grid's standardised density): the real anchors carry the wall
  count, so a prior handed the true density must not start ahead of the probe;
- the **wall map** at ``strength`` in one frame: ``"absolute"`` (one direction per canvas cell,
  :func:`planted_cell_data`'s ``wall_signal``) or ``"agent"`` (one per offset from the agent's
  cell within ``radius``). Either way a wall direction has per-feature standard deviation
  ``strength / sqrt(active)`` against unit noise (:func:`planted_cell_data`'s convention), so
  a strength means the same per-cell signal in either frame.

The minimum detectable strength is reported in the statistic's own unit (bits per
prior-uncertain cell).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.optimal import bfs_distances
from goalprobe.probes.probe_sweep import ProbeData, ProbeSweepConfig, fit_and_score
from goalprobe.probes.serialization import ActivationSource
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.wall_test import (
    Frame,
    WallTestConfig,
    conditional_wall_test,
    frame_cells,
    wall_inputs,
)


@dataclass(frozen=True)
class Layout:
    """One given grid of :func:`planted_cell_data`: ``(n, n)`` bool walls, the (open) goal cell
    and the density it was generated with (metadata)."""

    walls: np.ndarray
    goal: tuple[int, int]
    density: float


@dataclass(frozen=True)
class PlantedCellData:
    """A synthetic probing data set, row ``i`` one step of one grid: ``acts (N, n_anchors,
    d_model)`` and the labels an activation store holds (``labels``: ``(N, S, S)`` uint8
    ``CellType`` maps, ``PADDING`` outside the grid)."""

    acts: np.ndarray
    labels: np.ndarray
    grid_ids: np.ndarray
    grid_sizes: np.ndarray
    densities: np.ndarray
    agent_row_col: np.ndarray
    goal_row_col: np.ndarray
    goal_distance: np.ndarray


def planted_cell_data(
    n_grids: int,
    *,
    steps_per_grid: int = 4,
    sizes: tuple[int, ...] = (5, 7),
    canvas: int | None = None,
    densities: tuple[float, ...] = (0.0, 0.2, 0.4),
    d_model: int = 64,
    n_anchors: int = 3,
    signal: float = 1.0,
    wall_signal: float | None = None,
    dtype: type = np.float32,
    chunk_rows: int = 4096,
    random_state: int = 0,
    layouts: Sequence[Layout] | None = None,
) -> PlantedCellData:
    """Draw a synthetic data set with a planted, linearly embedded cognitive map.

    ``n_grids * steps_per_grid`` rows, sizes and densities drawn uniformly, on a canvas of side
    ``canvas`` (default ``max(sizes)``). ``signal``: the planted signal's scale against unit
    noise; ``wall_signal``: the wall cells' alone (default ``signal``; 0: no wall map);
    ``chunk_rows``: rows embedded at a time. ``layouts``: one :class:`Layout` per grid instead
    of random walls, goals and densities (the agents' cells are still drawn among the cells
    reachable from the goal).
    """
    side = max(sizes) if canvas is None else canvas
    if max(sizes) > side:
        raise ValueError(f"grid size {max(sizes)} exceeds the canvas {side}")
    if layouts is not None and len(layouts) != n_grids:
        raise ValueError(f"{len(layouts)} layouts for {n_grids} grids")
    if layouts is not None and any(lay.walls.shape[0] not in sizes for lay in layouts):
        raise ValueError(f"a layout's side is not among sizes={sizes}")
    rng = np.random.default_rng(random_state)
    n_rows = n_grids * steps_per_grid
    labels = np.full((n_rows, side, side), CellType.PADDING, dtype=np.uint8)
    grid_sizes = np.empty(n_rows, dtype=np.int64)
    grid_density = np.empty(n_rows, dtype=np.float64)
    agent = np.empty((n_rows, 2), dtype=np.int64)
    goal = np.empty((n_rows, 2), dtype=np.int64)
    distance = np.empty(n_rows, dtype=np.float32)
    for g in range(n_grids):
        if layouts is None:
            n = int(rng.choice(sizes))
            density = float(rng.choice(densities))
            walls = rng.random((n, n)) < density
            goal_rc = (int(rng.integers(n)), int(rng.integers(n)))
        else:
            walls = np.array(layouts[g].walls, dtype=bool)
            n, density = walls.shape[0], float(layouts[g].density)
            goal_rc = (int(layouts[g].goal[0]), int(layouts[g].goal[1]))
        walls[goal_rc] = False
        dist = bfs_distances(walls, goal_rc)
        reachable = np.argwhere(np.isfinite(dist) & (dist > 0))
        if len(reachable) == 0:  # goal walled in: drop the walls of this grid
            walls[:] = False
            dist = bfs_distances(walls, goal_rc)
            reachable = np.argwhere(np.isfinite(dist) & (dist > 0))
        rows = slice(g * steps_per_grid, (g + 1) * steps_per_grid)
        picks = reachable[rng.integers(len(reachable), size=steps_per_grid)]
        base = np.where(walls, CellType.WALL, CellType.OPEN).astype(np.uint8)
        base[goal_rc] = CellType.GOAL
        labels[rows, :n, :n] = base
        labels[np.arange(rows.start, rows.stop), picks[:, 0], picks[:, 1]] = CellType.AGENT
        grid_sizes[rows] = n
        grid_density[rows] = density
        agent[rows] = picks
        goal[rows] = goal_rc
        distance[rows] = dist[picks[:, 0], picks[:, 1]]
    grid_ids = np.repeat(np.array([f"g{g:06d}" for g in range(n_grids)]), steps_per_grid)

    cells = side * side
    size_codes = np.searchsorted(np.asarray(sorted(sizes)), grid_sizes)
    n_latent = 3 * cells + len(sizes) + 1
    n_features = n_anchors * d_model
    active = 3.0 + np.mean(labels == CellType.WALL) * cells
    directions = rng.standard_normal((n_latent, n_features), dtype=np.float32)
    directions *= signal / np.sqrt(active)
    if wall_signal is not None:
        directions[:cells] *= wall_signal / signal if signal else 0.0
        if not signal:
            noise = rng.standard_normal((cells, n_features), dtype=np.float32)
            directions[:cells] = wall_signal / np.sqrt(active) * noise
    dist_scaled = (distance - distance.mean()) / max(float(distance.std()), 1.0)
    acts: np.ndarray = np.empty((n_rows, n_features), dtype=dtype)
    for start in range(0, n_rows, chunk_rows):
        stop = min(start + chunk_rows, n_rows)
        m = stop - start
        latent = np.zeros((m, n_latent), dtype=np.float32)
        flat = labels[start:stop].reshape(m, cells)
        latent[:, :cells] = flat == CellType.WALL
        latent[np.arange(m), cells + agent[start:stop, 0] * side + agent[start:stop, 1]] = 1.0
        latent[np.arange(m), 2 * cells + goal[start:stop, 0] * side + goal[start:stop, 1]] = 1.0
        latent[np.arange(m), 3 * cells + size_codes[start:stop]] = 1.0
        latent[:, -1] = dist_scaled[start:stop]
        block = rng.standard_normal((m, n_features), dtype=np.float32)
        block += latent @ directions
        acts[start:stop] = block
    acts = acts.reshape(n_rows, n_anchors, d_model)
    return PlantedCellData(acts, labels, grid_ids, grid_sizes, grid_density, agent, goal, distance)


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
                split = _split(data, design.test_fraction, seed)
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
    detection = _detection(trials, "strength", design.strengths)
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


def _split(data: PlantedCellData | ProbeData, test_fraction: float, seed: int):
    """The split by grid of a planted data set, stratified by grid size."""
    ids, sizes = data.grid_ids, data.grid_sizes
    return split_by_grid(ids, test_fraction=test_fraction, stratify=sizes, random_state=seed)


def _detection(trials: Sequence[dict], key: str, levels: Sequence[float]) -> dict[float, float]:
    """The share of ``trials`` detected at each level of ``key`` (the planted strength)."""
    return {s: float(np.mean([t["detected"] for t in trials if t[key] == s])) for s in levels}


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
            planted = planted_cell_data(
                design.n_grids,
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
            data = as_probe_data(planted, f"wall_signal={signal},seed={seed}")
            split = _split(data, design.test_fraction, seed)
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
    detection = _detection(trials, "signal", design.signals)
    mde = next((s for s in design.signals if detection[s] >= design.power), None)
    aucs = [t["auc"] for t in trials if t["signal"] == mde and t["auc"] is not None]
    return {
        "design": {k: getattr(design, k) for k in design.__dataclass_fields__},
        "trials": list(trials),
        "detection": {f"{s:g}": d for s, d in detection.items()},
        "minimum_detectable_effect": mde,
        "auc_at_mde": float(np.mean(aucs)) if aucs else None,
    }
