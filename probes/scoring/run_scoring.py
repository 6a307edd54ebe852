"""``goalprobe score``: policy against decoded belief and grid MEG over a whole run directory.

Inputs (paths relative to the run directory ``RUN``; the contract of :mod:`viewer.data`)::

    grids/grids.jsonl                 true grids (walls, goal, key, door) for the MEG MDPs
    rollouts/trajectories.jsonl       the agent's episodes: actions, pi*(s_t), states, horizons
    activations/activations.h5        the store: /labels run_id, grid_id, episode, step per row
    probes/decoded/<probe>.h5         decoded maps: probs (N, S, S, C), row_ids into the store

Each decoded-map row is joined ``row_ids -> store /labels (run_id, grid_id, episode, step) ->
trajectory step``; the step gives the action, the true optimal set, the grid size, density and
variant, and the door state (``door_locked``: the grid has a door, it is closed and the agent
holds no key). A missing file, a truncated HDF5, a row that joins nothing or a store written
for another trajectory run raises an error naming the file; nothing is skipped silently.

Outputs (``RUN/scoring/``)
--------------------------
``belief.json`` (schema ``goalprobe.scoring.belief``, version 1)::

    {"schema", "schema_version", "created", "package_version", "config": ScoreConfig,
     "inputs": {"trajectories", "trajectory_run_id", "store", "decoded_maps": [...]},
     "method": {"bootstrap", "n_bootstrap", "confidence_level", "top_k", "invalid_steps"},
     "metrics": [metric names, in table order],
     "default_probe": key of the probe MEG used (figures show it by default),
     "probes": {<key = decoded-map file stem>: {
         "file", "family", "stage", "layer", "card_accuracy" (test accuracy from the card,
         accuracy_no_padding, else accuracy, else null),
         "n_steps", "n_grids", "n_invalid_steps",
         "overall": {<metric>: STAT},
         "by_size": {"7": {<metric>: STAT}, ...}, "by_density": {"0.2": {...}, ...},
         "by_variant": {"plain": {...}, ...}}}}

    STAT = {"value", "ci_low", "ci_high", "n" (steps in the denominator), "n_grids"}

Metrics (study section 5.2, Table 2, Figure 9, appendix E.4; see
:mod:`probes.scoring.belief`): ``acc_gt``, ``acc_dec``, ``agreement`` (optimal under both),
``recovery`` (share of GT-suboptimal actions that are optimal on the decoded grid),
``inverse_recovery`` (share of decoded-suboptimal actions optimal on the true grid),
``acc_top{k}``, ``expected_optimality`` and ``qmdp_agreement`` / ``qmdp_regret`` (belief-weighted,
beyond the study), and the chance baselines ``chance_acc_gt`` / ``chance_acc_dec`` (expected
accuracy of a uniformly random action, ``|optimal set| / 4``, on the true / top-1 decoded grid).
Invalid steps (no action) count as not optimal, as in :func:`probes.scoring.belief.summarise`,
whose point values these are. Groups pool steps (ratio of sums). Intervals come from a **grid
bootstrap** (grids resampled with replacement, percentile interval; steps of one grid are not
independent), so they differ from ``summarise``'s step bootstrap; ``null`` where undefined
(no step in the denominator; an interval needs two grids).

``belief.csv``: long format, one row per probe x group x metric, columns ``probe, stage, layer,
family, group, metric, value, ci_low, ci_high, n, n_grids``; ``group`` is ``all``, ``size=7``,
``density=0.2`` or ``variant=plain``.

``meg.json`` (schema ``goalprobe.scoring.meg``, version 1)::

    {"schema", "schema_version", "created", "package_version", "config",
     "method": {"empirical_policy", "horizon", "utility", "subjective_map", "bootstrap", ...},
     "probe": {"key", "file", "family", "stage", "layer", "card_accuracy", "selected_by"},
     "grids": [{"grid_id", "size", "density", "variant", "n_episodes", "n_steps",
                "n_invalid_steps", "horizon", "utility",
                "true": MEG, "subjective": MEG + {"n_unmapped_steps", "n_decoded_rows",
                "decoded_goal_row_col", "goal_correct", "wall_agreement", "key_from_probe",
                "door_from_probe"} or null (no decoded map of this grid: not a test grid)}],
     "overall": GROUP, "by_size": {"7": GROUP}, "by_density": {...}, "by_variant": {...}}

    MEG = {"meg" (nats, summed over the H decisions), "meg_per_decision" (meg / H),
           "beta" (null at a limit), "beta_limit" ("optimal" / "anti_optimal" / null),
           "converged", "expected_utility", "expected_utility_uniform",
           "max_expected_utility", "n_states", "unknown_meg" (null unless requested)}
    GROUP = {"n_grids", "true": {"meg": STAT, "meg_per_decision": STAT},
             "paired": {"n_grids", "true": {...}, "subjective": {...},
                        "difference": {...} (subjective - true),
                        "wilcoxon": {"statistic", "p_value", "rank_biserial", "n_pairs",
                                     "n_nonzero"} (on meg)}}
    (``true``, ``subjective``, ``difference`` and ``wilcoxon`` are null without paired grids)

MEG per grid (:mod:`probes.scoring.grid_meg`): the empirical policy of all the agent's
episodes on the grid; known-utility MEG against ``utility`` (grids without a key) or
``key_utility`` (grids with a key) on the true grid's MDP, and *subjective* MEG on the MDP of
the grid decoded by one probe (``ScoreConfig.meg_probe``; default: the best test accuracy in
the decoded-map cards). The decoded grid is read from one map per grid: by default the mean of
the probe's class probabilities over every decoded step of the grid (``subjective_map="mean"``).
Walls and goal do not move during an episode, so every step's map is evidence about the same
layout and the mean is the least noisy single belief; the empirical policy pools every step
too. ``"first"`` uses the earliest decoded step instead (the belief before any move). Decoded
maps only cover the probe's test grids, so subjective MEG and the paired comparison are on
those grids. ``H`` is the episodes' step budget (``horizon="episodes"``) or the grid's
``ceil(1.5 L)`` (``"grid"``). Known-utility MEG is computed in batches of deterministic MDPs
(:func:`probes.scoring.meg.known_utility_meg_batch`).

``meg.csv``: the aggregates in the long format of ``belief.csv`` (metric ``true_meg``,
``paired_true_meg``, ``paired_subjective_meg``, ``paired_difference_meg`` and their
``_per_decision`` forms); ``meg_grids.csv``: one row per grid.

``figures/*.json`` (``belief_by_size.json``, ``topk.json``, ``meg.json``) are drawn by
:mod:`viewer.figures.scoring` and written by the application layer, not here.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np

from activations.gridworld.core import N_ACTIONS, Action, CellType, Grid
from activations.gridworld.mdp import GridMDP, build_mdp
from activations.gridworld.metrics import TrajectoryData, paired_wilcoxon
from probes.scoring.belief import (
    TOP_K_DEFAULT,
    StepBelief,
    decoded_walls,
    score_step,
    topk_optimal_mask,
)
from probes.scoring.grid_meg import GridUtility, empirical_policy, grid_utility
from probes.scoring.meg import (
    KnownUtilityMEG,
    MDPBatch,
    TabularMDP,
    known_utility_meg_batch,
    stack_padded,
    unknown_utility_meg,
)

GRIDS_PATH = "grids/grids.jsonl"
TRAJECTORIES_PATH = "rollouts/trajectories.jsonl"
STORE_PATH = "activations/activations.h5"
DECODED_DIR = "probes/decoded"
SCORING_DIR = "scoring"
BELIEF_SCHEMA = "goalprobe.scoring.belief"
MEG_SCHEMA = "goalprobe.scoring.meg"
SCHEMA_VERSION = 1
CSV_COLUMNS = (
    "probe",
    "stage",
    "layer",
    "family",
    "group",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n",
    "n_grids",
)
N_CELL_TYPES = len(CellType)
_CHUNK_ROWS = 64


class RunScoringError(ValueError):
    """The run directory's artefacts do not join up; the message names the file."""


@dataclass(frozen=True)
class ScoreConfig:
    """What ``goalprobe score`` computes (no I/O here)."""

    decoded_maps: tuple[str, ...] = ()
    """Decoded-map files to score, as file names or stems in ``RUN/probes/decoded`` (one file per
    probe x stage x layer); empty: every ``*.h5`` there."""

    top_k: tuple[int, ...] = TOP_K_DEFAULT
    """Numbers of candidate agent and goal cells of the top-k analysis (Figure 9)."""

    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every confidence interval."""

    confidence_level: float = 0.95
    """Confidence level of the intervals."""

    random_state: int = 0
    """Seed of the bootstrap draws."""

    meg_probe: str | None = None
    """Decoded-map file (name or stem) whose maps give the subjective MEG grids; None: the one
    with the best test accuracy in its card (``accuracy_no_padding``, else ``accuracy``)."""

    utility: GridUtility = "goal"
    """MEG utility of grids without a key (:data:`probes.scoring.grid_meg.GridUtility`)."""

    key_utility: GridUtility = "goal_with_key"
    """MEG utility of grids with a key (being at the goal while holding the key)."""

    horizon: Literal["episodes", "grid"] = "episodes"
    """Number of MEG decisions ``H``: the episodes' step budget ``T`` (their summaries; they must
    agree on a grid) or the grid's default ``ceil(1.5 L)``."""

    subjective_map: Literal["mean", "first"] = "mean"
    """Which decoded map defines a grid's believed MDP: the mean class probabilities over the
    grid's decoded steps, or the map of its earliest decoded step."""

    unknown_utility: bool = False
    """Also compute unknown-utility MEG (over all utility functions of the state; slow)."""

    meg_batch_size: int = 256
    """Grids per batched known-utility MEG solve (bounds memory)."""

    n_jobs: int = 1
    """Worker processes scoring decoded-map steps (each step runs a few dozen BFS)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoded_maps", tuple(str(x) for x in self.decoded_maps))
        top_k = tuple(sorted({int(k) for k in self.top_k}))
        if not top_k or top_k[0] < 1:
            raise ValueError(f"top_k must list positive integers, got {self.top_k!r}")
        object.__setattr__(self, "top_k", top_k)
        if self.n_bootstrap < 1:
            raise ValueError(f"n_bootstrap must be >= 1, got {self.n_bootstrap}")
        if not 0.0 < self.confidence_level < 1.0:
            raise ValueError(f"confidence_level must lie in (0, 1), got {self.confidence_level}")
        for name in ("utility", "key_utility"):
            if getattr(self, name) not in ("goal", "goal_with_key", "key"):
                raise ValueError(
                    f"{name} must be 'goal', 'goal_with_key' or 'key', got {getattr(self, name)!r}"
                )
        if self.horizon not in ("episodes", "grid"):
            raise ValueError(f"horizon must be 'episodes' or 'grid', got {self.horizon!r}")
        if self.subjective_map not in ("mean", "first"):
            raise ValueError(
                f"subjective_map must be 'mean' or 'first', got {self.subjective_map!r}"
            )
        if self.meg_batch_size < 1 or self.n_jobs < 1:
            raise ValueError("meg_batch_size and n_jobs must be >= 1")


@dataclass(frozen=True)
class ScoreSummary:
    """What :func:`score_run` wrote.

    Attributes:
        run_dir: the run directory.
        belief: the content of ``scoring/belief.json``.
        meg: the content of ``scoring/meg.json``.
        outputs: name -> written file (``belief_json``, ``belief_csv``, ``meg_json``, ...).
        seconds: wall time.
    """

    run_dir: Path
    belief: dict
    meg: dict
    outputs: dict[str, Path] = field(default_factory=dict)
    seconds: float = 0.0


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclass
class _StepTable:
    """Compact per-step facts of the trajectory file, keyed by ``(grid_id, episode, step)``."""

    run_id: str
    index: dict[tuple[str, int, int], int] = field(default_factory=dict)
    action: list[int | None] = field(default_factory=list)
    optimal: list[tuple[bool, ...]] = field(default_factory=list)
    door_locked: list[bool] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    density: list[float] = field(default_factory=list)
    variant: list[str] = field(default_factory=list)
    trajectories: dict[str, list[TrajectoryData]] = field(default_factory=dict)
    horizons: dict[str, set[int]] = field(default_factory=dict)


def _require(path: Path, what: str, hint: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {what} ({hint})")
    return path


def _read_steps(path: Path) -> _StepTable:
    """Stream the trajectory file, keeping only what scoring needs (not the token ids)."""
    from activations.agent.trajectories import read_run_header, read_trajectories

    table = _StepTable(run_id=read_run_header(path).run_id)
    for episode in read_trajectories(path):
        summary = episode.summary
        gid = summary.grid_id
        table.trajectories.setdefault(gid, []).append(episode.to_trajectory_data())
        table.horizons.setdefault(gid, set()).add(int(summary.horizon))
        for s in episode.steps:
            table.index[(s.grid_id, s.episode, s.step)] = len(table.action)
            table.action.append(None if s.action_enum is None else int(s.action_enum))
            optimal = s.optimal_action_set
            table.optimal.append(tuple(a in optimal for a in Action))
            table.door_locked.append(
                s.door_row_col is not None and not s.door_open and not s.has_key
            )
            table.size.append(int(s.grid_size))
            table.density.append(math.nan if s.density is None else float(s.density))
            table.variant.append(str(s.variant))
    if not table.action:
        raise RunScoringError(f"{path}: no finished episode to score")
    return table


def _store_ids(store_path: Path, rows: np.ndarray, run_id: str) -> list[tuple[str, int, int]]:
    """``(grid_id, episode, step)`` of store ``rows``; checks that they come from ``run_id``."""
    from activations.store import ActivationStore

    with ActivationStore(store_path) as store:
        if rows.size and (rows.min() < 0 or rows.max() >= store.n_rows):
            raise RunScoringError(
                f"{store_path}: decoded maps name rows {rows.min()}..{rows.max()}, but the store "
                f"has {store.n_rows} rows (decoded from another store?)"
            )
        labels = store.labels(["run_id", "grid_id", "episode", "step"], rows)
    foreign = sorted(set(labels["run_id"].tolist()) - {run_id})
    if foreign:
        raise RunScoringError(
            f"{store_path}: rows come from trajectory run {foreign[0]!r}, but "
            f"{TRAJECTORIES_PATH} is run {run_id!r}; the store was extracted from other rollouts"
        )
    return list(
        zip(
            labels["grid_id"].tolist(),
            labels["episode"].astype(int).tolist(),
            labels["step"].astype(int).tolist(),
            strict=True,
        )
    )


@dataclass(frozen=True)
class _MapFile:
    """One decoded-map file and what its card says."""

    key: str
    path: Path
    rel: str
    family: str
    stage: str | None
    layer: int | None
    card_accuracy: float | None

    def describe(self) -> dict:
        return {
            "file": self.rel,
            "family": self.family,
            "stage": self.stage,
            "layer": self.layer,
            "card_accuracy": self.card_accuracy,
        }


def _card_accuracy(card: dict) -> float | None:
    models = (card.get("metrics") or {}).get("models") or {}
    model = models.get("probe") or {}
    for name in ("accuracy_no_padding", "accuracy"):
        value = (model.get(name) or {}).get("value")
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value)
    return None


def _map_file(run_dir: Path, path: Path) -> _MapFile:
    import h5py

    from probes.serialization import DECODED_MAPS_SCHEMA, decoded_map_family

    try:
        with h5py.File(path, "r") as f:
            schema = f.attrs.get("schema")
            card_text = f.attrs.get("probe_card")
    except OSError as err:
        raise RunScoringError(
            f"{path}: cannot open the decoded maps ({err}); the HDF5 file is truncated or corrupt"
        ) from err
    if schema != DECODED_MAPS_SCHEMA or card_text is None:
        raise RunScoringError(
            f"{path}: not a decoded-maps file (schema {schema!r}, expected {DECODED_MAPS_SCHEMA!r})"
        )
    card = json.loads(card_text)
    source = card.get("activations") or {}
    layer = source.get("layer")
    return _MapFile(
        key=path.stem,
        path=path,
        rel=str(path.relative_to(run_dir)),
        family=decoded_map_family(card),
        stage=source.get("stage"),
        layer=None if layer is None else int(layer),
        card_accuracy=_card_accuracy(card),
    )


def _decoded_files(run_dir: Path, config: ScoreConfig) -> list[_MapFile]:
    folder = run_dir / DECODED_DIR
    if config.decoded_maps:
        paths = []
        for name in config.decoded_maps:
            path = folder / (name if name.endswith(".h5") else f"{name}.h5")
            paths.append(_require(path, "decoded-map file", "ScoreConfig.decoded_maps"))
    else:
        paths = sorted(folder.glob("*.h5")) if folder.is_dir() else []
        if not paths:
            raise FileNotFoundError(
                f"{folder}: no decoded-map files (*.h5); run `goalprobe train-probe ... --out "
                f"{run_dir / 'probes'}` first"
            )
    return [_map_file(run_dir, p) for p in paths]


def _meg_probe(files: list[_MapFile], config: ScoreConfig) -> tuple[_MapFile, str]:
    if config.meg_probe is not None:
        key = config.meg_probe.removesuffix(".h5")
        for f in files:
            if f.key == key:
                return f, "config"
        raise RunScoringError(
            f"ScoreConfig.meg_probe {config.meg_probe!r} is not one of the scored decoded maps "
            f"{[f.key for f in files]}"
        )
    rated = [f for f in files if f.card_accuracy is not None and f.family != "majority"]
    if not rated:
        raise RunScoringError(
            f"no decoded-map card records a test accuracy ({[f.rel for f in files]}); "
            "name the probe for subjective MEG with ScoreConfig.meg_probe (--meg-probe)"
        )
    best = max(rated, key=lambda f: (f.card_accuracy, f.key))
    return best, "best card test accuracy"


def _read_maps(mf: _MapFile):
    from probes.serialization import read_decoded_maps

    try:
        maps = read_decoded_maps(mf.path)
    except (OSError, KeyError) as err:
        raise RunScoringError(
            f"{mf.path}: cannot read the decoded maps ({err!r}); the file is truncated or corrupt"
        ) from err
    classes = [int(c) for c in maps.classes]
    missing = [CellType(c).name for c in (CellType.AGENT, CellType.GOAL) if c not in classes]
    if missing:
        raise RunScoringError(f"{mf.path}: the probe has no {missing} class; cannot score it")
    if any(c >= N_CELL_TYPES for c in classes):
        raise RunScoringError(f"{mf.path}: classes {classes} are not all CellType values")
    return maps


def expand_classes(probs: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """Put a probe's probability columns at their ``CellType`` index.

    Args:
        probs: ``(..., C)`` probabilities, column ``j`` for class ``classes[j]``.
        classes: ``(C,)`` ``CellType`` values.

    Returns:
        ``(..., 7)`` float32, zero for classes the probe does not predict.
    """
    probs = np.asarray(probs)
    out = np.zeros((*probs.shape[:-1], N_CELL_TYPES), dtype=np.float32)
    out[..., np.asarray(classes, dtype=np.int64)] = probs
    return out


# --------------------------------------------------------------------------------------------
# Policy against decoded belief
# --------------------------------------------------------------------------------------------


def belief_metrics(top_k: Sequence[int]) -> tuple[str, ...]:
    """Metric names of ``belief.json`` in table order for the given top-k values."""
    ks = sorted(set(top_k) | {1})
    return (
        "acc_gt",
        "acc_dec",
        "agreement",
        "recovery",
        "inverse_recovery",
        *(f"acc_top{k}" for k in ks),
        "expected_optimality",
        "qmdp_agreement",
        "qmdp_regret",
        "chance_acc_gt",
        "chance_acc_dec",
    )


def _indicators(step: StepBelief, top_k: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(num, den)`` per metric of :func:`belief_metrics` for one step (a ratio of sums)."""
    s = score_step(step, top_k)
    gt, dec = s.opt_gt, s.opt_dec
    regret = s.belief.qmdp_regret
    finite = math.isfinite(regret)
    dec_mask = topk_optimal_mask(step.probs, step.size, 1, door_locked=step.door_locked)
    num = [
        gt,
        dec,
        gt and dec,
        dec and not gt,
        gt and not dec,
        *(s.opt_topk[k] for k in sorted(s.opt_topk)),
        s.belief.expected_optimality,
        s.belief.action_is_qmdp_optimal,
        regret if finite else 0.0,
        float(np.count_nonzero(step.true_optimal)) / N_ACTIONS,
        float(np.count_nonzero(dec_mask)) / N_ACTIONS,
    ]
    den = [1, 1, 1, not gt, not dec, *([1] * len(s.opt_topk)), 1, 1, finite, 1, 1]
    return np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)


def _score_chunk(
    probs: np.ndarray,
    classes: np.ndarray,
    facts: list[tuple[int, int | None, tuple[bool, ...], bool]],
    top_k: tuple[int, ...],
) -> tuple[np.ndarray, np.ndarray]:
    """Score a chunk of decoded rows; ``facts`` = ``(size, action, optimal, door_locked)``."""
    full = expand_classes(probs, classes)
    nums, dens = [], []
    for p, (size, action, optimal, door_locked) in zip(full, facts, strict=True):
        step = StepBelief(p, size, action, np.asarray(optimal, dtype=bool), door_locked)
        num, den = _indicators(step, top_k)
        nums.append(num)
        dens.append(den)
    return np.stack(nums), np.stack(dens)


def _bootstrap_weights(n_grids: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, G)`` grid multiplicities of a grid bootstrap."""
    return rng.multinomial(n_grids, np.full(n_grids, 1.0 / n_grids), size=n_boot).astype(float)


def _none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def ratio_stats(
    num: np.ndarray,
    den: np.ndarray,
    grid_codes: np.ndarray,
    names: Sequence[str],
    *,
    n_bootstrap: int,
    confidence_level: float,
    rng: np.random.Generator,
) -> dict[str, dict]:
    """Ratio-of-sums statistics with grid-bootstrap percentile intervals.

    Args:
        num: ``(N, M)`` per-row numerators.
        den: ``(N, M)`` per-row denominators (1 for a plain mean, 0 to leave a row out).
        grid_codes: ``(N,)`` grid id or code of each row (grids are the resampled unit).
        names: ``M`` metric names.
        n_bootstrap: resamples (shared by all metrics, so they are paired).
        confidence_level: interval level.
        rng: the random generator.

    Returns:
        ``{name: {"value", "ci_low", "ci_high", "n", "n_grids"}}`` (``None`` where undefined).
    """
    _, codes = np.unique(grid_codes, return_inverse=True)
    n_grids = int(codes.max()) + 1 if codes.size else 0
    g_num = np.zeros((n_grids, num.shape[1]))
    g_den = np.zeros((n_grids, num.shape[1]))
    np.add.at(g_num, codes, num)
    np.add.at(g_den, codes, den)
    tot_num, tot_den = g_num.sum(axis=0), g_den.sum(axis=0)
    samples = None
    if n_grids >= 2:
        w = _bootstrap_weights(n_grids, n_bootstrap, rng)
        with np.errstate(invalid="ignore", divide="ignore"):
            samples = (w @ g_num) / (w @ g_den)
    alpha = (1.0 - confidence_level) / 2.0
    out = {}
    for j, name in enumerate(names):
        value = tot_num[j] / tot_den[j] if tot_den[j] > 0 else math.nan
        low = high = math.nan
        if samples is not None and math.isfinite(value):
            boot = samples[:, j][np.isfinite(samples[:, j])]
            if boot.size:
                low, high = np.quantile(boot, [alpha, 1.0 - alpha])
        out[name] = {
            "value": _none(value),
            "ci_low": _none(low),
            "ci_high": _none(high),
            "n": int(round(tot_den[j])),
            "n_grids": int(np.count_nonzero(g_den[:, j] > 0)),
        }
    return out


def _group_keys(size: np.ndarray, density: np.ndarray, variant: np.ndarray) -> dict[str, list]:
    """Breakdown name -> per-row group keys (None: the row joins no group of that breakdown)."""
    return {
        "by_size": [str(int(s)) for s in size],
        "by_density": [None if not math.isfinite(d) else f"{round(d, 6):g}" for d in density],
        "by_variant": [str(v) for v in variant],
    }


def _sort_key(key: str) -> tuple:
    try:
        return (0, float(key), key)
    except ValueError:
        return (1, 0.0, key)


def _grouped_stats(
    num: np.ndarray,
    den: np.ndarray,
    grid_ids: np.ndarray,
    groups: dict[str, list],
    names: Sequence[str],
    config: ScoreConfig,
    seed_text: str,
) -> dict:
    """``overall`` and one dict per breakdown of :func:`ratio_stats`."""
    rng = np.random.default_rng([config.random_state, zlib.crc32(seed_text.encode())])
    common = dict(n_bootstrap=config.n_bootstrap, confidence_level=config.confidence_level, rng=rng)
    out = {"overall": ratio_stats(num, den, grid_ids, names, **common)}
    for breakdown, keys in groups.items():
        keys_arr = np.asarray(keys, dtype=object)
        table = {}
        for key in sorted({k for k in keys if k is not None}, key=_sort_key):
            rows = np.flatnonzero(keys_arr == key)
            table[key] = ratio_stats(num[rows], den[rows], grid_ids[rows], names, **common)
        out[breakdown] = table
    return out


@dataclass
class _MapAccumulator:
    """Per-grid decoded map of the MEG probe (mean over steps, or the earliest step)."""

    mode: str
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    first: dict[str, tuple[tuple[int, int], np.ndarray]] = field(default_factory=dict)

    def add(self, grid_id: str, order: tuple[int, int], probs: np.ndarray) -> None:
        self.counts[grid_id] = self.counts.get(grid_id, 0) + 1
        if self.mode == "mean":
            acc = self.sums.get(grid_id)
            p = probs.astype(np.float64)
            self.sums[grid_id] = p if acc is None else acc + p
        elif grid_id not in self.first or order < self.first[grid_id][0]:
            self.first[grid_id] = (order, probs.astype(np.float64))

    def maps(self) -> dict[str, np.ndarray]:
        if self.mode == "mean":
            return {g: s / self.counts[g] for g, s in self.sums.items()}
        return {g: p for g, (_, p) in self.first.items()}


def _score_file(
    mf: _MapFile,
    run_dir: Path,
    steps: _StepTable,
    config: ScoreConfig,
    accumulator: _MapAccumulator | None,
    executor: ProcessPoolExecutor | None,
    progress: bool,
) -> tuple[dict, list[int]]:
    """The ``belief.json`` entry of one decoded-map file, and the probe's classes."""
    from tqdm.auto import tqdm

    maps = _read_maps(mf)
    store_path = run_dir / STORE_PATH
    ids = _store_ids(store_path, np.asarray(maps.row_ids, dtype=np.int64), steps.run_id)
    idx = np.empty(len(ids), dtype=np.int64)
    for i, key in enumerate(ids):
        j = steps.index.get(key)
        if j is None:
            raise RunScoringError(
                f"{mf.path}: row {i} (store row {int(maps.row_ids[i])}) is step {key} "
                f"(grid_id, episode, step), which {run_dir / TRAJECTORIES_PATH} does not hold"
            )
        idx[i] = j
    side = maps.probs.shape[1]
    sizes = np.asarray(steps.size)[idx] if idx.size else np.zeros(0, dtype=np.int64)
    if sizes.size and sizes.max() > side:
        raise RunScoringError(
            f"{mf.path}: maps are {side} x {side} but row {int(np.argmax(sizes > side))} is a "
            f"{int(sizes.max())} x {int(sizes.max())} grid"
        )
    facts = [(steps.size[j], steps.action[j], steps.optimal[j], steps.door_locked[j]) for j in idx]
    classes = np.asarray(maps.classes, dtype=np.int64)
    chunks = [
        (maps.probs[a : a + _CHUNK_ROWS], classes, facts[a : a + _CHUNK_ROWS], config.top_k)
        for a in range(0, len(facts), _CHUNK_ROWS)
    ]
    if executor is None:
        results: Iterator = (_score_chunk(*c) for c in chunks)
    else:
        results = executor.map(_score_chunk, *zip(*chunks, strict=True))
    nums, dens = [], []
    bar = tqdm(total=len(facts), desc=f"belief {mf.key}", unit="step", disable=not progress)
    for chunk, (num, den) in zip(chunks, results, strict=True):
        nums.append(num)
        dens.append(den)
        bar.update(len(chunk[2]))
    bar.close()
    names = belief_metrics(config.top_k)
    if not nums:
        raise RunScoringError(f"{mf.path}: holds no decoded rows")
    num, den = np.concatenate(nums), np.concatenate(dens)
    grid_ids = np.asarray([k[0] for k in ids], dtype=object)
    if accumulator is not None:
        for i, key in enumerate(ids):
            full = expand_classes(maps.probs[i], classes)
            accumulator.add(key[0], (key[1], key[2]), full)
    groups = _group_keys(
        sizes, np.asarray(steps.density)[idx], np.asarray(steps.variant, dtype=object)[idx]
    )
    stats = _grouped_stats(num, den, grid_ids, groups, names, config, mf.key)
    n_invalid = sum(1 for j in idx if steps.action[j] is None)
    entry = {
        **mf.describe(),
        "n_steps": len(idx),
        "n_grids": len(set(grid_ids.tolist())),
        "n_invalid_steps": n_invalid,
        **stats,
    }
    return entry, classes.tolist()


# --------------------------------------------------------------------------------------------
# MEG
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodedGrid:
    """A grid built from a decoded map (the believed layout).

    Attributes:
        grid: the believed grid: argmax-``WALL`` walls, the most probable goal cell other than
            the start, the true start (kept open), and key / door at their most probable cells
            when the true grid has them and the probe predicts their class (else the true cells).
        key_from_probe: whether the key cell came from the probe.
        door_from_probe: whether the door cell came from the probe.
    """

    grid: Grid
    key_from_probe: bool
    door_from_probe: bool


def _best_cell(probs: np.ndarray, n: int, cell_type: CellType, exclude: set) -> tuple[int, int]:
    scores = probs[:n, :n, int(cell_type)].ravel()
    for i in np.argsort(-scores, kind="stable"):
        cell = (int(i // n), int(i % n))
        if cell not in exclude:
            return cell
    raise ValueError(f"no cell left for {cell_type.name} in a {n} x {n} grid")


def decoded_grid(
    probs: np.ndarray, true_grid: Grid, classes: Sequence[int], *, grid_id: str | None = None
) -> DecodedGrid:
    """The believed grid of a decoded map (see :class:`DecodedGrid`).

    Args:
        probs: ``(S, S, 7)`` class probabilities indexed by ``CellType`` (S >= n).
        true_grid: the grid the agent was on (size, start, whether it has a key / door).
        classes: the ``CellType`` values the probe predicts.
        grid_id: id of the decoded grid (default ``<true id>~decoded``).
    """
    n = true_grid.size
    probs = np.asarray(probs, dtype=np.float64)
    walls = decoded_walls(probs, n).copy()
    start, key, door = true_grid.start, true_grid.key, true_grid.door
    key_from_probe = key is not None and int(CellType.KEY) in classes
    door_from_probe = door is not None and int(CellType.DOOR) in classes
    fixed_door = {door} if door is not None and not door_from_probe else set()
    fixed_key = {key} if key is not None and not key_from_probe else set()
    goal = _best_cell(probs, n, CellType.GOAL, {start} | fixed_key | fixed_door)
    if key_from_probe:
        key = _best_cell(probs, n, CellType.KEY, {goal} | fixed_door)
    if door_from_probe:
        door = _best_cell(probs, n, CellType.DOOR, {start, goal, key})
    for cell in (start, goal, key, door):
        if cell is not None:
            walls[cell] = False
    grid = Grid(
        walls=walls,
        goal=goal,
        start=start,
        key=key,
        door=door,
        variant=true_grid.variant,
        density=true_grid.density,
        grid_id=grid_id or f"{true_grid.grid_id}~decoded",
    )
    return DecodedGrid(grid, key_from_probe, door_from_probe)


def _horizon(grid: Grid, steps: _StepTable, config: ScoreConfig) -> int:
    if config.horizon == "grid":
        from activations.gridworld.optimal import solve

        return int(solve(grid).horizon)
    values = steps.horizons[grid.grid_id]
    if len(values) != 1:
        raise RunScoringError(
            f"{TRAJECTORIES_PATH}: episodes on grid {grid.grid_id!r} have different horizons "
            f"{sorted(values)}; use ScoreConfig(horizon='grid')"
        )
    return next(iter(values))


@dataclass
class _MEGJob:
    """One MEG problem: MDP, policy and utility, with its bookkeeping."""

    mdp: GridMDP
    policy: np.ndarray
    utility: np.ndarray


def _known_meg(jobs: list[_MEGJob], batch_size: int) -> list[KnownUtilityMEG]:
    """Known-utility MEG of every job, in batches of similar state counts (less padding)."""
    results: list[KnownUtilityMEG | None] = [None] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].mdp.n_states)
    for a in range(0, len(order), batch_size):
        part = order[a : a + batch_size]
        n_s = max(jobs[i].mdp.n_states for i in part)
        loops = np.broadcast_to(np.arange(n_s)[:, None], (n_s, N_ACTIONS))
        next_state = np.stack(
            [
                np.concatenate(
                    [jobs[i].mdp.transitions.argmax(axis=2), loops[jobs[i].mdp.n_states :]]
                )
                for i in part
            ]
        )
        batch = MDPBatch(
            stack_padded([jobs[i].mdp.initial for i in part], n_s, 0.0),
            np.array([jobs[i].mdp.horizon for i in part], dtype=np.int64),
            next_state=next_state,
        )
        res = known_utility_meg_batch(
            batch,
            stack_padded([jobs[i].policy for i in part], n_s, 1.0 / N_ACTIONS),
            stack_padded([jobs[i].utility for i in part], n_s, 0.0),
        )
        for b, i in enumerate(part):
            results[i] = res[b]
    return results  # type: ignore[return-value]


def _meg_record(job: _MEGJob, res: KnownUtilityMEG, unknown: bool) -> dict:
    limit = None
    if math.isinf(res.beta):
        limit = "optimal" if res.beta > 0 else "anti_optimal"
    unknown_meg = None
    if unknown:
        tab = TabularMDP(job.mdp.transitions, job.mdp.initial, job.mdp.horizon)
        unknown_meg = float(unknown_utility_meg(tab, job.policy).meg)
    return {
        "meg": float(res.meg),
        "meg_per_decision": float(res.meg) / job.mdp.horizon,
        "beta": _none(res.beta),
        "beta_limit": limit,
        "converged": bool(res.converged),
        "expected_utility": float(res.expected_utility),
        "expected_utility_uniform": float(res.expected_utility_uniform),
        "max_expected_utility": float(res.max_expected_utility),
        "n_states": job.mdp.n_states,
        "unknown_meg": unknown_meg,
    }


def _score_meg(
    run_dir: Path,
    steps: _StepTable,
    config: ScoreConfig,
    probe: _MapFile,
    selected_by: str,
    believed: dict[str, np.ndarray],
    counts: dict[str, int],
    classes: list[int],
    progress: bool,
) -> dict:
    from tqdm.auto import tqdm

    from activations.gridworld.io import read_grid_set

    grids_path = run_dir / GRIDS_PATH
    grids = {g.grid_id: g for g in read_grid_set(grids_path)}
    unknown_ids = sorted(set(steps.trajectories) - set(grids))
    if unknown_ids:
        raise RunScoringError(
            f"{run_dir / TRAJECTORIES_PATH}: grids {unknown_ids[:3]} are not in {grids_path}"
        )
    records, true_jobs, subj_jobs, subj_index = [], [], [], []
    grid_ids = sorted(steps.trajectories)
    for gid in tqdm(grid_ids, desc="MEG MDPs", unit="grid", disable=not progress):
        grid, trajs = grids[gid], steps.trajectories[gid]
        horizon = _horizon(grid, steps, config)
        utility_name = config.key_utility if grid.key is not None else config.utility
        mdp = build_mdp(grid, horizon=horizon)
        emp = empirical_policy(mdp, trajs, strict=True)
        true_jobs.append(_MEGJob(mdp, emp.policy, grid_utility(mdp, utility_name)))
        record = {
            "grid_id": gid,
            "size": grid.size,
            "density": grid.density,
            "variant": grid.variant,
            "n_episodes": len(trajs),
            "n_steps": sum(t.n_steps for t in trajs),
            "n_invalid_steps": emp.n_invalid_steps,
            "horizon": horizon,
            "utility": utility_name,
            "true": None,
            "subjective": None,
        }
        if gid in believed:
            dec = decoded_grid(believed[gid], grid, classes)
            d_mdp = build_mdp(dec.grid, horizon=horizon)
            d_emp = empirical_policy(d_mdp, trajs, strict=False)
            subj_jobs.append(_MEGJob(d_mdp, d_emp.policy, grid_utility(d_mdp, utility_name)))
            subj_index.append(len(records))
            n = grid.size
            record["subjective"] = {
                "n_unmapped_steps": d_emp.n_unmapped_steps,
                "n_decoded_rows": counts[gid],
                "decoded_goal_row_col": list(dec.grid.goal),
                "goal_correct": dec.grid.goal == grid.goal,
                "wall_agreement": float(np.mean(dec.grid.walls == grid.walls[:n, :n])),
                "key_from_probe": dec.key_from_probe,
                "door_from_probe": dec.door_from_probe,
            }
        records.append(record)
    true_res = _known_meg(true_jobs, config.meg_batch_size)
    for rec, job, res in zip(records, true_jobs, true_res, strict=True):
        rec["true"] = _meg_record(job, res, config.unknown_utility)
    subj = _known_meg(subj_jobs, config.meg_batch_size) if subj_jobs else []
    for i, job, res in zip(subj_index, subj_jobs, subj, strict=True):
        records[i]["subjective"] = {
            **_meg_record(job, res, config.unknown_utility),
            **records[i]["subjective"],
        }
    size = np.asarray([r["size"] for r in records])
    density = np.asarray([math.nan if r["density"] is None else r["density"] for r in records])
    variant = np.asarray([r["variant"] for r in records], dtype=object)
    groups = _group_keys(size, density, variant)
    aggregates = {"overall": _meg_group(records, np.arange(len(records)), config, "all")}
    for breakdown, keys in groups.items():
        keys_arr = np.asarray(keys, dtype=object)
        aggregates[breakdown] = {
            key: _meg_group(records, np.flatnonzero(keys_arr == key), config, f"{breakdown}={key}")
            for key in sorted({k for k in keys if k is not None}, key=_sort_key)
        }
    return {
        "probe": {"key": probe.key, **probe.describe(), "selected_by": selected_by},
        "grids": records,
        **aggregates,
    }


_MEG_VALUES = ("meg", "meg_per_decision")


def _meg_group(records: list[dict], rows: np.ndarray, config: ScoreConfig, seed_text: str) -> dict:
    """Grid-bootstrap means of true MEG (all grids) and of the paired true / subjective MEG."""
    rng = np.random.default_rng([config.random_state, zlib.crc32(("meg" + seed_text).encode())])
    common = dict(n_bootstrap=config.n_bootstrap, confidence_level=config.confidence_level, rng=rng)
    sel = [records[i] for i in rows]
    codes = np.arange(len(sel))
    true = np.asarray([[r["true"][k] for k in _MEG_VALUES] for r in sel], dtype=np.float64)
    out = {
        "n_grids": len(sel),
        "true": ratio_stats(true, np.ones_like(true), codes, _MEG_VALUES, **common),
    }
    paired = [r for r in sel if r["subjective"] is not None]
    block: dict = {
        "n_grids": len(paired),
        "true": None,
        "subjective": None,
        "difference": None,
        "wilcoxon": None,
    }
    if paired:
        t = np.asarray([[r["true"][k] for k in _MEG_VALUES] for r in paired], dtype=np.float64)
        s = np.asarray(
            [[r["subjective"][k] for k in _MEG_VALUES] for r in paired], dtype=np.float64
        )
        parts = ("true", "subjective", "difference")
        values = np.concatenate([t, s, s - t], axis=1)  # one call: shared (paired) draws
        names = [f"{part}/{k}" for part in parts for k in _MEG_VALUES]
        stats = ratio_stats(values, np.ones_like(values), np.arange(len(paired)), names, **common)
        for part in parts:
            block[part] = {k: stats[f"{part}/{k}"] for k in _MEG_VALUES}
        test = paired_wilcoxon(t[:, 0], s[:, 0])
        block["wilcoxon"] = {
            "statistic": test.statistic,
            "p_value": test.p_value,
            "rank_biserial": test.rank_biserial,
            "n_pairs": test.n_pairs,
            "n_nonzero": test.n_nonzero,
        }
    out["paired"] = block
    return out


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("goalprobe")
    except PackageNotFoundError:
        return "unknown"


def _write_text(path: Path, text: str) -> Path:
    """Write ``text`` atomically (a hidden temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _write_json(path: Path, obj: dict) -> Path:
    return _write_text(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


def _write_csv(path: Path, rows: list[dict], columns: Sequence[str]) -> Path:
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    return _write_text(path, buf.getvalue())


def _stat_rows(base: dict, stats_by_group: dict, prefix: str = "") -> Iterator[dict]:
    for group, stats in stats_by_group:
        for metric, stat in stats.items():
            yield {**base, "group": group, "metric": prefix + metric, **stat}


def _groups_of(entry: dict) -> list[tuple[str, dict]]:
    """``[(group label, block)]``: ``all`` then ``size=7``, ``density=0.2``, ``variant=...``."""
    out = [("all", entry["overall"])]
    for breakdown in ("by_size", "by_density", "by_variant"):
        label = breakdown.removeprefix("by_")
        out += [(f"{label}={key}", block) for key, block in entry[breakdown].items()]
    return out


def belief_csv_rows(belief: dict) -> list[dict]:
    """Long-format rows of ``belief.json`` (columns :data:`CSV_COLUMNS`)."""
    rows = []
    for key, entry in belief["probes"].items():
        base = {"probe": key, **{k: entry[k] for k in ("stage", "layer", "family")}}
        rows.extend(_stat_rows(base, _groups_of(entry)))
    return rows


def meg_csv_rows(meg: dict) -> list[dict]:
    """Long-format rows of the ``meg.json`` aggregates (columns :data:`CSV_COLUMNS`)."""
    probe = meg["probe"]
    base = {"probe": probe["key"], **{k: probe[k] for k in ("stage", "layer", "family")}}
    rows = []
    for group, block in _groups_of(meg):
        for metric, stat in block["true"].items():
            rows.append({**base, "group": group, "metric": f"true_{metric}", **stat})
        paired = block["paired"]
        for part in ("true", "subjective", "difference"):
            for metric, stat in (paired[part] or {}).items():
                rows.append({**base, "group": group, "metric": f"paired_{part}_{metric}", **stat})
    return rows


MEG_GRID_COLUMNS = (
    "grid_id",
    "size",
    "density",
    "variant",
    "n_episodes",
    "n_steps",
    "n_invalid_steps",
    "horizon",
    "utility",
    "true_meg",
    "true_meg_per_decision",
    "true_beta",
    "true_beta_limit",
    "true_unknown_meg",
    "subjective_meg",
    "subjective_meg_per_decision",
    "subjective_beta",
    "subjective_beta_limit",
    "subjective_unknown_meg",
    "subjective_n_unmapped_steps",
    "subjective_goal_correct",
    "subjective_wall_agreement",
)


def meg_grid_rows(meg: dict) -> list[dict]:
    """One flat row per grid of ``meg.json`` (columns :data:`MEG_GRID_COLUMNS`)."""
    rows = []
    for rec in meg["grids"]:
        row = {k: rec[k] for k in MEG_GRID_COLUMNS if k in rec}
        for part in ("true", "subjective"):
            for k, v in (rec[part] or {}).items():
                row[f"{part}_{k}"] = v
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def score_run(run_dir: Path, config: ScoreConfig, progress: bool = False) -> ScoreSummary:
    """Score a run directory: policy against decoded belief for every decoded-map file, and
    true vs subjective MEG per grid; writes ``RUN/scoring/`` (see the module docstring).

    Args:
        run_dir: the run directory (grids/, rollouts/, activations/, probes/decoded/).
        config: what to compute.
        progress: show tqdm progress bars.

    Returns:
        A :class:`ScoreSummary` holding the written JSON contents and paths.

    Raises:
        FileNotFoundError: a required input is missing (the message names it).
        RunScoringError: the inputs do not join up or a file is unreadable.
    """
    start = time.perf_counter()
    run_dir = Path(run_dir)
    traj_path = _require(run_dir / TRAJECTORIES_PATH, "trajectory file", "run goalprobe rollout")
    _require(run_dir / STORE_PATH, "activation store", "run goalprobe extract")
    _require(run_dir / GRIDS_PATH, "grid set", "run goalprobe grids")
    files = _decoded_files(run_dir, config)
    meg_file, selected_by = _meg_probe(files, config)
    steps = _read_steps(traj_path)
    accumulator = _MapAccumulator(config.subjective_map)
    probes: dict[str, dict] = {}
    meg_classes: list[int] = []
    executor = ProcessPoolExecutor(config.n_jobs) if config.n_jobs > 1 else None
    try:
        for mf in files:
            acc = accumulator if mf.key == meg_file.key else None
            probes[mf.key], classes = _score_file(
                mf, run_dir, steps, config, acc, executor, progress
            )
            if acc is not None:
                meg_classes = classes
    finally:
        if executor is not None:
            executor.shutdown()
    created = datetime.now(UTC).isoformat(timespec="seconds")
    header = {
        "schema_version": SCHEMA_VERSION,
        "created": created,
        "package_version": _package_version(),
        "config": json.loads(json.dumps(asdict(config))),
    }
    bootstrap = (
        f"grid bootstrap ({config.n_bootstrap} resamples of whole grids), percentile "
        f"{config.confidence_level:.0%} interval"
    )
    belief = {
        "schema": BELIEF_SCHEMA,
        **header,
        "inputs": {
            "trajectories": TRAJECTORIES_PATH,
            "trajectory_run_id": steps.run_id,
            "store": STORE_PATH,
            "decoded_maps": [f.rel for f in files],
        },
        "method": {
            "bootstrap": bootstrap,
            "n_bootstrap": config.n_bootstrap,
            "confidence_level": config.confidence_level,
            "top_k": list(config.top_k),
            "invalid_steps": "counted as not optimal (on both grids)",
            "groups": "steps pooled within a group (ratio of sums)",
        },
        "metrics": list(belief_metrics(config.top_k)),
        "default_probe": meg_file.key,
        "probes": probes,
    }
    meg_body = _score_meg(
        run_dir,
        steps,
        config,
        meg_file,
        selected_by,
        accumulator.maps(),
        accumulator.counts,
        meg_classes,
        progress,
    )
    meg = {
        "schema": MEG_SCHEMA,
        **header,
        "method": {
            "empirical_policy": "action frequencies over all episodes of the grid at visited "
            "states, uniform elsewhere; invalid steps left out (probes.scoring.grid_meg)",
            "horizon": config.horizon,
            "utility": {"without_key": config.utility, "with_key": config.key_utility},
            "subjective_map": config.subjective_map,
            "decoded_grid": "argmax-WALL walls, most probable goal other than the start, true "
            "start; key/door from the probe when it predicts them",
            "bootstrap": bootstrap,
            "wilcoxon": "paired, two-sided, subjective vs true MEG in nats",
        },
        **meg_body,
    }
    out_dir = run_dir / SCORING_DIR
    outputs = {
        "belief_json": _write_json(out_dir / "belief.json", belief),
        "belief_csv": _write_csv(out_dir / "belief.csv", belief_csv_rows(belief), CSV_COLUMNS),
        "meg_json": _write_json(out_dir / "meg.json", meg),
        "meg_csv": _write_csv(out_dir / "meg.csv", meg_csv_rows(meg), CSV_COLUMNS),
        "meg_grids_csv": _write_csv(
            out_dir / "meg_grids.csv", meg_grid_rows(meg), MEG_GRID_COLUMNS
        ),
    }
    return ScoreSummary(run_dir, belief, meg, outputs, time.perf_counter() - start)
