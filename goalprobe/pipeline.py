"""``goalprobe demo``: the whole study in one run directory, as cached, resumable stages.

Stages run in study order through :class:`goalprobe.stages.StageRunner` (one record per stage
under ``RUN/stages/``; its resolved config also lands in ``RUN/<stage>/config.json``)::

    grids        RUN/grids/grids.jsonl                      plain grids, sizes x densities
    rollouts     RUN/rollouts/trajectories.jsonl            sampled episodes (temperature 0.7)
    behaviour    RUN/behaviour/metrics.json                 appendix-B metrics, Fig. 4, baselines
    iso          RUN/iso/{grids,trajectories}.jsonl         iso-difficulty set, results.json
                                                            (paired Wilcoxon, Table 3)
    keys         RUN/keys/{grids,trajectories}.jsonl        key variants, results.json (Table 1)
    activations  RUN/activations/activations.h5             pre/post anchors, default layers
    probes       RUN/probes/{models,decoded,sweeps}/        cell-type probes, Figs. 6-8, controls
    distance     RUN/distance/{models,sweeps}/              goal-distance regressors, Table 4
    plans        RUN/plans/sweep.json, models/,             plan decoder, Fig. 10, Table 5
                 RUN/plans/predicted/plan_decoder.h5
    patching     RUN/patching/patch_results.json            section 5.2, appendix F
    scoring      RUN/scoring/belief.json, meg.json          Table 2, Fig. 9, MEG
    report       RUN/report.html                            every section above

The layout is the viewer's (:mod:`viewer.data`), so ``goalprobe view RUN`` opens the run.

Caching: a stage's hash covers its own parameters *and* the fingerprints (sha256 of the output
files) of the stages it reads, so a stage reruns exactly when its config or its inputs changed;
``force={"rollouts"}`` redoes the rollouts and, when the new trajectories differ, everything
downstream of them. An interrupted demo resumes: finished stages are skipped, the rollouts resume
episode by episode and the extraction part by part. A failing stage is recorded in
``RUN/stages/<stage>.failed.json`` (the report shows it); stages that need its outputs are
reported as not run, the others still run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from goalprobe.runner import StageResult, StageRunner
from goalprobe.stages import DEPENDS_ON, STAGES

SCALES: tuple[str, ...] = ("tiny", "default", "paper")
"""Named scale presets of :func:`demo_config`."""

FAILED_SUFFIX = ".failed.json"


@dataclass(frozen=True)
class DemoConfig:
    """Everything the demo does, at one scale (no I/O; see :func:`demo_config` for presets)."""

    scale: str = "default"
    """Name of the preset this config started from (informational)."""

    # -- agent -------------------------------------------------------------------------------
    model: str = "bundled"
    """Agent: ``"bundled"``, a local model directory or a Hugging Face id."""
    backend: str = "local"
    """Rollout engine: ``"local"`` (transformers in this process) or ``"server"``."""
    base_url: str | None = None
    """OpenAI-compatible endpoint for ``backend="server"`` (e.g. ``http://127.0.0.1:8000/v1``)."""
    device: str = "cpu"
    """Torch device of the local model (rollouts, extraction, patching): ``cpu`` or ``cuda``."""

    # -- grids and rollouts (section 4) ------------------------------------------------------
    sizes: tuple[int, ...] = (7, 9, 11, 13, 15)
    """Grid sides of the main grid set."""
    densities: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    """Obstacle densities of the main grid set."""
    grids_per_cell: int = 10
    """Grids per (size, density) cell."""
    episodes_per_grid: int = 10
    """Sampled trajectories per grid."""
    temperature: float = 0.7
    """Sampling temperature of every rollout."""
    top_p: float = 0.95
    """Nucleus-sampling mass of every rollout."""
    horizon_steps: int | None = None
    """Fixed horizon of the main and iso-difficulty rollouts; None uses the study's ceil(1.5 L)."""
    max_new_tokens: int = 512
    """Most generated tokens per step (reasoning + answer; GPT-OSS-20B at low effort needs
    thousands, the bundled agent about 60)."""
    rollout_batch_size: int = 64
    """Episodes in flight per generate call."""
    random_walks_per_grid: int = 200
    """Uniform random walks simulated per grid for the random-walk baseline."""

    # -- iso-difficulty (section 4.2, Table 3) and key variants (section 4.3, Table 1) --------
    iso_transforms: tuple[str, ...] = ("reflect", "rotate90", "start_goal_swap", "transpose")
    """Iso-difficulty transforms applied to the base grids."""
    iso_base_grids: int = 0
    """Base grids transformed (spread evenly over the grid set); 0 transforms every grid."""
    key_variants: tuple[str, ...] = (
        "key_door",
        "key_no_door",
        "key_door_control",
        "two_path_key",
        "two_path_no_key",
    )
    """Key variants and their matched controls."""
    key_sizes: tuple[int, ...] = (7, 9)
    """Grid sides of the key-variant grids."""
    key_density: float = 0.4
    """Obstacle density of the key-variant grids."""
    key_grids_per_size: int = 10
    """Layouts per key variant and size."""
    key_episodes_per_grid: int = 10
    """Trajectories per key-variant grid."""
    key_horizon: int = 30
    """Fixed horizon of the key-variant episodes (the study's T = 30)."""

    # -- activations (section 5) -------------------------------------------------------------
    layers: tuple[int, ...] = ()
    """Residual-stream layers to capture; empty: the default spread (last block of each third)."""
    extract_batch_size: int = 16
    """Sequences per forward pass of the extraction."""

    # -- probes (section 5.1, appendix E) ----------------------------------------------------
    probe_types: tuple[str, ...] = ("coordinate", "per_cell")
    """Cell-type probe families: the study's coordinate-conditioned probe and per-cell heads."""
    probe_families: tuple[str, ...] = ("linear", "mlp")
    """Probe readouts (distance regressors: ridge for ``linear``)."""
    probe_hidden_size: int = 1024
    """MLP probe hidden width (1024 in the study)."""
    probe_max_epochs: int = 20
    """Most probe training epochs (early stopping on validation grids)."""
    probe_batch_size: int = 128
    """Probe training batch size."""
    test_fraction: float = 0.2
    """Fraction of grids held out for testing (probes, plan decoder)."""

    # -- plan decoder (section 5.3) ----------------------------------------------------------
    plan_decoder_layers: tuple[int, ...] = (1, 2, 4)
    """Decoder capacities swept."""
    plan_control_layers: tuple[int, ...] = (2,)
    """Capacities that also get the shuffled-activation control."""
    plan_bottleneck: int = 1024
    """Decoder bottleneck / width (1024 in the study)."""
    plan_heads: int = 8
    """Attention heads per decoder layer."""
    plan_max_epochs: int = 100
    """Most decoder epochs."""
    plan_patience: int = 10
    """Epochs without validation improvement before stopping."""

    # -- patching (section 5.2, appendix F) --------------------------------------------------
    patch_sites: tuple[str, ...] = ("grid", "changed_cells", "pre_reasoning", "post_reasoning")
    """Patch sites."""
    patch_layers: tuple[str, ...] = ("thirds", "all")
    """Layer sets: each default layer alone, then every layer at once."""
    patch_max_bases: int = 100
    """Most base steps (drawn at random, seeded) from the main rollouts."""
    patch_require_optimal: bool = True
    """Keep only pairs where the unpatched agent acts optimally on both sides (the study's)."""

    # -- statistics ----------------------------------------------------------------------------
    n_bootstrap: int = 1000
    """Bootstrap resamples of every confidence interval (grids resampled)."""
    seed: int = 0
    """Seed of grids, sampling, splits, training and bootstraps."""

    def __post_init__(self) -> None:
        if self.backend not in ("local", "server"):
            raise ValueError(f"backend must be 'local' or 'server', got {self.backend!r}")
        if self.backend == "server" and not self.base_url:
            raise ValueError("backend 'server' needs base_url (the endpoint's /v1 URL)")
        for name in ("grids_per_cell", "episodes_per_grid", "key_grids_per_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if len(self.sizes) == 0 or len(self.densities) == 0:
            raise ValueError("sizes and densities need at least one value each")


_PRESETS: dict[str, dict[str, Any]] = {
    # CI: a handful of short episodes; every stage runs, nothing is meaningful statistically.
    "tiny": dict(
        sizes=(7,),
        densities=(0.0, 0.5, 1.0),
        grids_per_cell=2,
        episodes_per_grid=2,
        horizon_steps=4,
        max_new_tokens=96,
        random_walks_per_grid=50,
        iso_transforms=("reflect", "start_goal_swap"),
        iso_base_grids=2,
        key_variants=("key_door", "key_no_door"),
        key_sizes=(7,),
        key_grids_per_size=1,
        key_episodes_per_grid=1,
        key_horizon=3,
        extract_batch_size=32,
        probe_families=("linear", "mlp"),
        probe_hidden_size=32,
        probe_max_epochs=2,
        probe_batch_size=64,
        test_fraction=0.34,
        plan_decoder_layers=(1, 2),
        plan_control_layers=(1,),
        plan_bottleneck=16,
        plan_heads=2,
        plan_max_epochs=2,
        plan_patience=1,
        patch_sites=("grid", "post_reasoning"),
        patch_layers=("all",),
        patch_max_bases=1,
        patch_require_optimal=False,
        n_bootstrap=100,
    ),
    # 2 CPU cores, <= 15 minutes (measured: docs/benchmarks.md). Rollouts cost one generate call
    # per step and prompt length (grid size), so this scale spans the study's 5 sizes x 6
    # densities with one grid per cell and caps episodes at 16 steps (the study: ceil(1.5 L);
    # success on large mazes is censored by it).
    "default": dict(
        sizes=(7, 9, 11, 13, 15),
        densities=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        grids_per_cell=1,
        episodes_per_grid=3,
        horizon_steps=16,
        max_new_tokens=128,
        random_walks_per_grid=200,
        iso_transforms=("reflect", "rotate90", "start_goal_swap", "transpose"),
        iso_base_grids=3,
        key_variants=("key_door", "key_no_door", "two_path_key", "two_path_no_key"),
        key_sizes=(7,),
        key_grids_per_size=2,
        key_episodes_per_grid=2,
        key_horizon=10,
        probe_hidden_size=128,
        probe_max_epochs=10,
        test_fraction=0.25,
        plan_bottleneck=64,
        plan_heads=4,
        plan_max_epochs=6,
        plan_patience=2,
        patch_sites=("grid", "pre_reasoning", "post_reasoning"),
        patch_max_bases=8,
        patch_require_optimal=False,
        n_bootstrap=500,
    ),
    # The study's counts (section 4: 5 sizes x 6 densities x 10 grids x 10 trajectories).
    "paper": dict(max_new_tokens=4096),
}


def demo_config(scale: str = "default", **overrides: Any) -> DemoConfig:
    """The preset config of ``scale`` (``tiny``, ``default`` or ``paper``) with ``overrides``.

    Raises:
        ValueError: an unknown scale or field.
    """
    if scale not in _PRESETS:
        raise ValueError(f"unknown scale {scale!r}; expected one of {SCALES}")
    names = {f.name for f in dataclasses.fields(DemoConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"unknown DemoConfig fields {unknown}")
    return DemoConfig(scale=scale, **{**_PRESETS[scale], **overrides})


@dataclass(frozen=True)
class StageOutcome:
    """What happened to one stage in :func:`run_demo`.

    Attributes:
        name: the stage.
        status: ``"ran"``, ``"cached"``, ``"failed"`` or ``"not_run"`` (an input failed).
        seconds: wall time of the run that produced the outputs (0 when failed or not run).
        summary: small facts the stage reported (counts, headline figures).
        error: why it failed or did not run (None otherwise).
    """

    name: str
    status: str
    seconds: float
    summary: dict
    error: str | None = None


@dataclass(frozen=True)
class DemoResult:
    """The outcome of :func:`run_demo`.

    Attributes:
        run_dir: the run directory.
        config: the config it ran with.
        stages: stage name -> :class:`StageOutcome`, in run order.
        report_path: ``RUN/report.html`` (None when the report itself failed).
        seconds: wall time of the whole call.
    """

    run_dir: Path
    config: DemoConfig
    stages: dict[str, StageOutcome]
    report_path: Path | None
    seconds: float

    @property
    def failed(self) -> dict[str, str]:
        """Stage -> error of every stage that failed or could not run."""
        return {n: o.error or o.status for n, o in self.stages.items() if o.error is not None}


# ---------------------------------------------------------------------------------------------
# Fingerprints
# ---------------------------------------------------------------------------------------------


def fingerprint(paths: Iterable[Path], root: Path) -> str:
    """sha256 over the relative names and contents of ``paths`` (directories walked, sorted)."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for path in paths:
        path = Path(path)
        files.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
    for file in sorted(set(files)):
        digest.update(file.resolve().relative_to(root.resolve()).as_posix().encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def model_identity(model: str) -> dict[str, str]:
    """What identifies the agent's weights: the bundled agent's weights digest, else the name."""
    from activations.agent.bundled import bundled_weights_digest, is_bundled

    if not is_bundled(model):
        return {"model": model}
    return {"model": model, "weights_sha256": bundled_weights_digest(model)}


# ---------------------------------------------------------------------------------------------
# The agent, loaded once and only when a stage needs it
# ---------------------------------------------------------------------------------------------


class _Agent:
    """Lazy holder of the local model (extraction, patching, local rollouts)."""

    def __init__(self, config: DemoConfig) -> None:
        self.config = config
        self._loaded = None
        self._backend = None

    def loaded(self):
        """The :class:`activations.extract.LoadedModel` (float32 on CPU, bf16 on CUDA)."""
        if self._loaded is None:
            from activations.extract import load_model

            self._loaded = load_model(self.config.model, device=self.config.device)
        return self._loaded

    def rollout_backend(self) -> tuple[Any, dict]:
        """``(backend, description)`` for :func:`activations.agent.rollout.run_rollouts`."""
        if self._backend is None:
            if self.config.backend == "server":
                from activations.agent.server_backend import ServerBackend, ServerConfig
                from goalprobe.commands.rollout import load_tokenizer_for

                backend = ServerBackend(
                    ServerConfig(base_url=self.config.base_url, model=self.config.model),
                    load_tokenizer_for(self.config.model),
                )
                self._backend = (backend, backend.describe())
            else:
                from activations.agent.local_backend import LocalBackend
                from goalprobe.commands.rollout import local_backend_description

                loaded = self.loaded()
                description = local_backend_description(self.config.model)
                self._backend = (LocalBackend(loaded.model, loaded.tokenizer), description)
        return self._backend


# ---------------------------------------------------------------------------------------------
# Helpers shared by the behavioural stages
# ---------------------------------------------------------------------------------------------


def _rollout_config(config: DemoConfig, *, horizon_steps: int | None, episodes: int):
    from activations.agent.rollout import RolloutConfig

    return RolloutConfig(
        episodes_per_grid=episodes,
        horizon_steps=horizon_steps,
        batch_size=config.rollout_batch_size,
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
    )


def _rollouts(grids, agent: _Agent, rollout_config, out: Path, progress: bool) -> dict:
    """Run (or resume) rollouts into ``out``; a file of another run id is replaced."""
    from activations.agent.rollout import run_id_for, run_rollouts
    from activations.agent.trajectories import TrajectoryFormatError, read_run_header

    backend, description = agent.rollout_backend()
    if out.exists():
        try:
            stale = read_run_header(out).run_id != run_id_for(rollout_config, description)
        except TrajectoryFormatError:
            stale = True
        if stale:
            out.unlink()
    report = run_rollouts(
        grids, backend, rollout_config, out, progress=progress, backend_description=description
    )
    return {
        "run_id": report.run_id,
        "episodes": report.episodes_total,
        "episodes_resumed": report.episodes_skipped,
        "steps_now": report.steps,
        "invalid_steps_now": report.invalid_steps,
    }


def _episodes(path: Path) -> list:
    from activations.agent.trajectories import read_trajectories

    return list(read_trajectories(path))


def _ci(values: Sequence[float], config: DemoConfig) -> dict:
    """``{value, ci_low, ci_high, n}``: mean and percentile-bootstrap 95% CI of finite values."""
    from activations.stats import bootstrap_ci

    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return {"value": None, "ci_low": None, "ci_high": None, "n": 0}
    low, high = bootstrap_ci(
        x, n_resamples=config.n_bootstrap, method="percentile", random_state=config.seed
    )
    return {
        "value": float(x.mean()),
        "ci_low": None if math.isnan(low) else low,
        "ci_high": None if math.isnan(high) else high,
        "n": int(x.size),
    }


def _random_walk(grid, horizon: int, n_walks: int, rng: np.random.Generator) -> dict:
    """Success rate and per-action accuracy of uniform random walks of ``horizon`` steps."""
    from activations.gridworld.dynamics import initial_state, is_success, step
    from activations.gridworld.optimal import solve

    policy = solve(grid)
    successes, accuracies = 0, []
    for _ in range(n_walks):
        state, hits, steps = initial_state(grid), 0, 0
        for action in rng.integers(0, 4, size=horizon):
            hits += int(action) in {int(a) for a in policy.optimal_actions(state)}
            steps += 1
            state = step(grid, state, int(action))
            if is_success(grid, state):
                successes += 1
                break
        accuracies.append(hits / steps)
    return {"success_rate": successes / n_walks, "accuracy": float(np.mean(accuracies))}


def _grid_rows(episodes: list, grids: dict, config: DemoConfig) -> list[dict]:
    """One row of appendix-B metrics per grid, with the random-walk and random-action baselines."""
    from activations.gridworld.metrics import grid_metrics

    by_grid: dict[str, list] = defaultdict(list)
    for episode in episodes:
        by_grid[episode.summary.grid_id].append(episode)
    rows = []
    rng = np.random.default_rng(config.seed)
    for grid_id, eps in by_grid.items():
        m = grid_metrics([e.to_trajectory_data() for e in eps])
        first = eps[0].summary
        steps = [s for e in eps for s in e.steps]
        walk = _random_walk(grids[grid_id], first.horizon, config.random_walks_per_grid, rng)
        rows.append(
            {
                "grid_id": grid_id,
                "size": first.grid_size,
                "density": first.density,
                "variant": first.variant,
                "shortest_path_length": first.shortest_path_length,
                "n_trajectories": m.n_trajectories,
                "success_rate": m.success_rate,
                "accuracy": m.accuracy,
                "entropy": m.entropy,
                "jsd": m.jsd,
                "ece": m.ece,
                "invalid_rate": float(np.mean([not s.valid for s in steps])),
                "random_walk_success_rate": walk["success_rate"],
                "random_walk_accuracy": walk["accuracy"],
                "random_action_accuracy": float(
                    np.mean([len(s.optimal_actions) / 4 for s in steps])
                ),
            }
        )
    return rows


BEHAVIOUR_METRICS: tuple[str, ...] = (
    "success_rate",
    "accuracy",
    "entropy",
    "jsd",
    "ece",
    "random_walk_success_rate",
    "random_walk_accuracy",
    "random_action_accuracy",
)
"""Per-grid metrics aggregated (mean and grid-bootstrap CI) in ``behaviour/metrics.json``."""


def _aggregate(rows: list[dict], keys: Sequence[str], config: DemoConfig) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in keys)].append(row)
    out = []
    for key in sorted(groups, key=lambda k: tuple(-1 if v is None else v for v in k)):
        members = groups[key]
        entry = dict(zip(keys, key, strict=True))
        entry["n_grids"] = len(members)
        for metric in BEHAVIOUR_METRICS:
            entry[metric] = _ci([r[metric] for r in members], config)
        out.append(entry)
    return out


def _by_distance(episodes: list, config: DemoConfig) -> list[dict]:
    """Fig. 4 (top): accuracy and JSD from pi* against the distance to the goal (CIs over grids)."""
    from activations.gridworld.metrics import policy_table

    by_grid: dict[str, list] = defaultdict(list)
    for episode in episodes:
        by_grid[episode.summary.grid_id].append(episode)
    acc: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    jsd: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for grid_id, eps in by_grid.items():
        table = policy_table([e.to_trajectory_data() for e in eps])
        distance_of = {}
        for e in eps:
            for s in e.steps:
                distance_of[s.state] = int(s.distance_to_goal)
                acc[int(s.distance_to_goal)][grid_id].append(
                    float(s.action is not None and s.action in s.optimal_actions)
                )
        for state, value in zip(table.states, table.jsd(), strict=True):
            jsd[distance_of[state]][grid_id].append(float(value))
    rows = []
    for d in sorted(acc):
        rows.append(
            {
                "distance": d,
                "n_steps": sum(len(v) for v in acc[d].values()),
                "accuracy": _ci([float(np.mean(v)) for v in acc[d].values()], config),
                "jsd": _ci([float(np.mean(v)) for v in jsd[d].values()], config),
            }
        )
    return rows


def _write_json(path: Path, payload: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, allow_nan=False, default=_json_default) + "\n")
    os.replace(tmp, path)
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def _finite(obj: Any) -> Any:
    """``obj`` with NaN/inf floats replaced by None (strict JSON)."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------


class _Demo:
    """The stage functions of one demo run (each returns ``(outputs, summary)``)."""

    def __init__(self, run_dir: Path, config: DemoConfig, progress: bool) -> None:
        self.run_dir = run_dir
        self.config = config
        self.progress = progress
        self.agent = _Agent(config)

    def path(self, relative: str) -> Path:
        return self.run_dir / relative

    def _say(self) -> Callable[[str], None] | None:
        """A line logger that keeps tqdm bars intact, or None without progress output."""
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm.write

    # -- behaviour -----------------------------------------------------------------------------

    def grids(self, stage_dir: Path):
        from activations.gridworld.generator import GridSetConfig, generate_grid_set
        from activations.gridworld.io import write_grid_set

        c = self.config
        grids = generate_grid_set(
            GridSetConfig(c.sizes, c.densities, c.grids_per_cell, "plain", c.seed)
        )
        out = stage_dir / "grids.jsonl"
        count = write_grid_set(out, grids)
        return {"grids": out}, {"grids": count}

    def _main_grids(self) -> dict:
        from activations.gridworld.io import read_grid_set

        return {g.grid_id: g for g in read_grid_set(self.path("grids/grids.jsonl"))}

    def rollouts(self, stage_dir: Path):
        c = self.config
        grids = list(self._main_grids().values())
        out = stage_dir / "trajectories.jsonl"
        rollout = _rollout_config(c, horizon_steps=c.horizon_steps, episodes=c.episodes_per_grid)
        summary = _rollouts(grids, self.agent, rollout, out, self.progress)
        episodes = _episodes(out)
        summary["success_rate"] = float(np.mean([e.summary.success for e in episodes]))
        summary["steps"] = int(sum(e.summary.length for e in episodes))
        return {"trajectories": out}, summary

    def behaviour(self, stage_dir: Path):
        episodes = _episodes(self.path("rollouts/trajectories.jsonl"))
        rows = _grid_rows(episodes, self._main_grids(), self.config)
        payload = {
            "schema": "goalprobe.demo.behaviour/1",
            "per_grid": rows,
            "overall": _aggregate([{**r, "all": "all"} for r in rows], ["all"], self.config)[0],
            "by_size_density": _aggregate(rows, ["size", "density"], self.config),
            "by_size": _aggregate(rows, ["size"], self.config),
            "by_density": _aggregate(rows, ["density"], self.config),
            "by_distance": _by_distance(episodes, self.config),
            "baselines": {
                "random_walk": "uniform random actions for the grid's horizon "
                f"({self.config.random_walks_per_grid} walks per grid)",
                "random_action_accuracy": "expected accuracy of a uniform action at the "
                "agent's own states, mean |pi*(s)| / 4",
            },
        }
        out = _write_json(stage_dir / "metrics.json", _finite(payload))
        overall = payload["overall"]
        return {"metrics": out}, {
            "grids": len(rows),
            "accuracy": overall["accuracy"]["value"],
            "success_rate": overall["success_rate"]["value"],
            "random_walk_success_rate": overall["random_walk_success_rate"]["value"],
        }

    def iso(self, stage_dir: Path):
        from activations.gridworld.io import write_grid_set
        from activations.gridworld.metrics import align_pairs, paired_wilcoxon
        from activations.gridworld.transforms import apply_transform

        c = self.config
        base = list(self._main_grids().values())
        if c.iso_base_grids and c.iso_base_grids < len(base):
            picks = np.linspace(0, len(base) - 1, c.iso_base_grids).round().astype(int)
            base = [base[i] for i in sorted(set(picks.tolist()))]
        transformed = [apply_transform(g, name).grid for name in c.iso_transforms for g in base]
        grids_path = stage_dir / "grids.jsonl"
        write_grid_set(grids_path, transformed)
        out = stage_dir / "trajectories.jsonl"
        rollout = _rollout_config(c, horizon_steps=c.horizon_steps, episodes=c.episodes_per_grid)
        summary = _rollouts(transformed, self.agent, rollout, out, self.progress)
        all_grids = {**self._main_grids(), **{g.grid_id: g for g in transformed}}
        base_ids = {g.grid_id for g in base}
        base_rows = {
            r["grid_id"]: r
            for r in _grid_rows(
                [
                    e
                    for e in _episodes(self.path("rollouts/trajectories.jsonl"))
                    if e.summary.grid_id in base_ids
                ],
                all_grids,
                c,
            )
        }
        trans_rows = _grid_rows(_episodes(out), all_grids, c)
        tests = []
        for name in c.iso_transforms:
            rows = {
                all_grids[r["grid_id"]].extra["source_grid_id"]: r
                for r in trans_rows
                if r["grid_id"].endswith(f"~{name}")
            }
            for metric in ("accuracy", "success_rate", "entropy", "jsd"):
                pairs = {
                    k: (base_rows[k][metric], rows[k][metric])
                    for k in rows
                    if k in base_rows
                    and math.isfinite(base_rows[k][metric])
                    and math.isfinite(rows[k][metric])
                }
                entry = {"transform": name, "metric": metric, "n_pairs": len(pairs)}
                if pairs:
                    _, x, y = align_pairs(
                        {k: v[0] for k, v in pairs.items()}, {k: v[1] for k, v in pairs.items()}
                    )
                    test = paired_wilcoxon(x, y)
                    entry.update(
                        base_mean=float(x.mean()),
                        transformed_mean=float(y.mean()),
                        difference=_ci((y - x).tolist(), c),
                        statistic=test.statistic,
                        p_value=test.p_value,
                        rank_biserial=test.rank_biserial,
                        n_nonzero=test.n_nonzero,
                    )
                tests.append(entry)
        payload = {
            "schema": "goalprobe.demo.iso/1",
            "base_grids": sorted(base_ids),
            "transforms": list(c.iso_transforms),
            "tests": tests,
            "per_grid": trans_rows,
        }
        results = _write_json(stage_dir / "results.json", _finite(payload))
        summary["pairs"] = len(base) * len(c.iso_transforms)
        return {"grids": grids_path, "trajectories": out, "results": results}, summary

    def keys(self, stage_dir: Path):
        from activations.gridworld.generator import GridSetConfig, generate_grid_set
        from activations.gridworld.io import write_grid_set
        from activations.gridworld.metrics import (
            goal_success_rate,
            jaccard_similarity,
            key_attraction_bias,
            key_pickup_rate,
            manhattan_key_distance,
            stage_accuracy,
            trajectory_accuracy,
        )

        c = self.config
        grids = [
            g
            for variant in c.key_variants
            for g in generate_grid_set(
                GridSetConfig(c.key_sizes, (c.key_density,), c.key_grids_per_size, variant, c.seed)
            )
        ]
        grids_path = stage_dir / "grids.jsonl"
        write_grid_set(grids_path, grids)
        out = stage_dir / "trajectories.jsonl"
        rollout = _rollout_config(c, horizon_steps=c.key_horizon, episodes=c.key_episodes_per_grid)
        summary = _rollouts(grids, self.agent, rollout, out, self.progress)
        by_id = {g.grid_id: g for g in grids}
        trajs: dict[str, list] = defaultdict(list)
        for episode in _episodes(out):
            trajs[by_id[episode.summary.grid_id].variant].append(episode)
        variants = {}
        for variant, eps in trajs.items():
            data = [e.to_trajectory_data() for e in eps]
            entry = {
                "n_trajectories": len(data),
                "success_rate": goal_success_rate(data),
                "accuracy": _ci([trajectory_accuracy(t) for t in data], c),
            }
            if any(by_id[e.summary.grid_id].key is not None for e in eps):
                entry["key_pickup_rate"] = key_pickup_rate(data)
            if variant == "key_door":
                stages = stage_accuracy(data)
                entry["stage_accuracy"] = {
                    "to_key": stages.to_key,
                    "to_door": stages.to_door,
                    "to_goal": stages.to_goal,
                }
            if variant in ("key_no_door", "two_path_key"):
                n_non, n_towards = 0, 0
                for e, t in zip(eps, data, strict=True):
                    bias = key_attraction_bias(
                        [t], manhattan_key_distance(by_id[e.summary.grid_id].key)
                    )
                    n_non += bias.n_non_optimal
                    n_towards += bias.n_towards
                entry["key_attraction_bias"] = n_towards / n_non if n_non else None
                entry["key_attraction_n_non_optimal"] = n_non
            variants[variant] = entry
        jaccard = []
        with_key = {
            (e.summary.grid_id.split("-", 1)[1], e.summary.episode): e
            for e in trajs.get("two_path_key", [])
        }
        for e in trajs.get("two_path_no_key", []):
            other = with_key.get((e.summary.grid_id.split("-", 1)[1], e.summary.episode))
            if other is not None:
                jaccard.append(
                    jaccard_similarity(
                        [s.agent_row_col for s in other.steps]
                        + [other.summary.final_agent_row_col],
                        [s.agent_row_col for s in e.steps] + [e.summary.final_agent_row_col],
                    )
                )
        payload = {
            "schema": "goalprobe.demo.keys/1",
            "horizon": c.key_horizon,
            "variants": variants,
            "two_path_jaccard": _ci(jaccard, c),
        }
        results = _write_json(stage_dir / "results.json", _finite(payload))
        return {"grids": grids_path, "trajectories": out, "results": results}, summary

    # -- representations -----------------------------------------------------------------------

    def activations(self, stage_dir: Path):
        from activations.capture import make_capture
        from activations.extract import ExtractConfig, default_layers, extract

        loaded = self.agent.loaded()
        capture = make_capture(
            "nnsight",
            loaded.model,
            loaded.tokenizer,
            remote=False,
            model_id=loaded.model_id,
            revision=loaded.revision or None,
            host=None,
        )
        layers = self.config.layers or default_layers(capture.n_layers)
        out = stage_dir / "activations.h5"
        report = extract(
            self.path("rollouts/trajectories.jsonl"),
            out,
            capture,
            loaded.tokenizer,
            ExtractConfig(layers=tuple(layers), batch_size=self.config.extract_batch_size),
            model_id=loaded.model_id,
            model_revision=loaded.revision,
            overwrite=True,
            progress=self.progress,
        )
        return {"store": out}, {"rows": report.rows, "layers": list(layers)}

    def _store_info(self):
        from probes.probe_sweep import StoreProbeLoader

        return StoreProbeLoader(self.path("activations/activations.h5"))

    def _sweep(self, loader, target: str, estimator, out: Path, name: str) -> dict:
        from probes.probe_sweep import ProbeSweepConfig, run_probe_sweep

        c = self.config
        config = ProbeSweepConfig(
            target=target,
            stages=tuple(loader.stages),
            layers=tuple(loader.layers),
            test_fraction=c.test_fraction,
            controls=True,
            n_bootstrap=c.n_bootstrap,
            random_state=c.seed,
        )
        result = run_probe_sweep(loader, config, estimator, out_dir=out, log=self._say())
        (out / "sweeps").mkdir(parents=True, exist_ok=True)
        os.replace(out / "sweep.json", out / "sweeps" / f"{name}.json")
        return result

    def _training(self) -> dict:
        c = self.config
        return dict(
            max_epochs=c.probe_max_epochs,
            batch_size=c.probe_batch_size,
            device="cuda" if c.device.startswith("cuda") else "cpu",
            progress=self.progress,
            random_state=c.seed,
        )

    def probes(self, stage_dir: Path):
        from probes.cell_probes import CoordinateCellProbe
        from probes.per_cell import PerCellProbe

        c = self.config
        loader = self._store_info()
        for old in (self.path("probes/decoded"), self.path("probes/sweeps")):
            for file in old.glob("cell_type_*") if old.is_dir() else []:
                file.unlink()
        summary = {}
        classes = {"coordinate": CoordinateCellProbe, "per_cell": PerCellProbe}
        for probe in c.probe_types:
            for family in c.probe_families:
                estimator = classes[probe](
                    family=family, hidden_size=c.probe_hidden_size, **self._training()
                )
                result = self._sweep(
                    loader, "cell_type", estimator, stage_dir, f"cell_{probe}_{family}"
                )
                best = max(
                    result["runs"],
                    key=lambda r: r["metrics"]["models"]["probe"]["accuracy_no_padding"]["value"],
                )
                summary[f"{probe}_{family}"] = {
                    "best_run": best["name"],
                    "accuracy_no_padding": best["metrics"]["models"]["probe"][
                        "accuracy_no_padding"
                    ]["value"],
                }
        outputs = {
            "decoded": self.path("probes/decoded"),
            **{
                f"sweep_{p}_{f}": self.path(f"probes/sweeps/cell_{p}_{f}.json")
                for p in c.probe_types
                for f in c.probe_families
            },
        }
        return outputs, summary

    def distance(self, stage_dir: Path):
        from probes.distance import GoalDistanceRegressor

        c = self.config
        loader = self._store_info()
        summary, outputs = {}, {}
        for family in c.probe_families:
            estimator = GoalDistanceRegressor(
                family=family, hidden_size=c.probe_hidden_size, **self._training()
            )
            result = self._sweep(loader, "distance", estimator, stage_dir, f"distance_{family}")
            outputs[f"sweep_{family}"] = stage_dir / "sweeps" / f"distance_{family}.json"
            summary[family] = {
                r["name"]: r["metrics"]["models"]["probe"]["r2"]["value"] for r in result["runs"]
            }
        return outputs, summary

    def plans(self, stage_dir: Path):
        from probes.plan_decoder import (
            PlanDecoder,
            PlanSweepConfig,
            StorePlanLoader,
            run_plan_sweep,
        )

        c = self.config
        loader = StorePlanLoader(self.path("activations/activations.h5"))
        config = PlanSweepConfig(
            stages=tuple(loader.stages),
            layers=tuple(loader.layers),
            decoder_layers=c.plan_decoder_layers,
            control_decoder_layers=c.plan_control_layers,
            test_fraction=max(c.test_fraction * 0.75, 0.01),
            validation_fraction=max(c.test_fraction * 0.75, 0.01),
            n_bootstrap=c.n_bootstrap,
            random_state=c.seed,
        )
        decoder = PlanDecoder(
            n_heads=c.plan_heads,
            d_bottleneck=c.plan_bottleneck,
            max_epochs=c.plan_max_epochs,
            patience=c.plan_patience,
            device="cuda" if c.device.startswith("cuda") else "cpu",
            random_state=c.seed,
        )
        result = run_plan_sweep(
            loader, config, decoder, out_dir=stage_dir, overwrite=True, progress=self._say()
        )
        predicted = stage_dir / "predicted"
        predicted.mkdir(exist_ok=True)
        plans = predicted / "plan_decoder.h5"
        os.replace(stage_dir / "predicted_plans.h5", plans)
        _write_json(stage_dir / "sweep.json", result.to_dict())
        best = max(
            (r for r in result.runs if r.kind == "decoder"),
            key=lambda r: float(r.metrics.prefix_accuracy[0]),
        )
        return {"sweep": stage_dir / "sweep.json", "predicted": plans}, {
            "best": best.name,
            "prefix_accuracy_n1": float(best.metrics.prefix_accuracy[0]),
        }

    def patching(self, stage_dir: Path):
        from activations.agent.trajectories import read_run_header, read_steps
        from probes.patching.counterfactuals import (
            CounterfactualConfig,
            base_from_step,
            build_counterfactuals,
        )
        from probes.patching.experiment import (
            PatchConfig,
            PatchingContext,
            prepare_pairs,
            run_patching,
        )
        from probes.patching.patch import make_backend
        from probes.patching.results import SCHEMA, summarize, write_results

        c = self.config
        trajectories = self.path("rollouts/trajectories.jsonl")
        header = read_run_header(trajectories)
        bases = [
            base_from_step(s, where=f"{trajectories}: step {s.grid_id}/{s.episode}/{s.step}")
            for s in read_steps(trajectories)
        ]
        if len(bases) > c.patch_max_bases:
            rng = np.random.default_rng(c.seed)
            bases = [bases[i] for i in np.sort(rng.choice(len(bases), c.patch_max_bases, False))]
        config = PatchConfig(
            sites=c.patch_sites,
            layers=c.patch_layers,
            reasoning="recorded",
            require_optimal=c.patch_require_optimal,
            max_new_tokens=c.max_new_tokens,
            reasoning_effort=header.config.get("reasoning_effort", "low"),
            template_dir=header.config.get("template_dir"),
        )
        cf_config = CounterfactualConfig(random_state=c.seed)
        pairs = build_counterfactuals(bases, cf_config)
        loaded = self.agent.loaded()
        patcher = make_backend("nnsight", loaded.model, loaded.tokenizer)
        context = PatchingContext(loaded.model, loaded.tokenizer, patcher, config)
        prepared, report = prepare_pairs(pairs, context)
        meta = {
            "model": loaded.model_id,
            "model_revision": loaded.revision,
            "backend": patcher.name,
            "n_layers": patcher.n_layers,
            "layer_sets": {label: list(ls) for label, ls in context.layer_sets},
            "config": dataclasses.asdict(config),
            "counterfactuals": dataclasses.asdict(cf_config),
            "input": str(trajectories.relative_to(self.run_dir)),
            "n_bases": len(bases),
            "preparation": report.to_dict(),
        }
        if not prepared:
            path = _write_json(
                stage_dir / "patch_results.json",
                {"schema": SCHEMA, **meta, "skipped_sites": {}, "summary": [], "records": []},
            )
            return {"results": path}, {"pairs": 0, "records": 0}
        records, skipped = run_patching(prepared, context)
        summary = summarize(records, n_resamples=c.n_bootstrap, random_state=c.seed)
        meta["skipped_sites"] = dict(skipped)
        paths = write_results(stage_dir, records, summary, meta)
        return {"results": paths["results_json"]}, {
            "pairs": report.n_kept,
            "records": len(records),
        }

    def scoring(self, stage_dir: Path):
        try:
            from probes.scoring.run_scoring import ScoreConfig, score_run
        except ImportError as err:
            raise RuntimeError(
                f"probes.scoring.run_scoring is not available ({err}); policy-against-belief "
                "scoring and MEG cannot run"
            ) from err
        score_run(
            self.run_dir,
            ScoreConfig(n_bootstrap=self.config.n_bootstrap, random_state=self.config.seed),
            progress=self.progress,
        )
        outputs = {"belief": stage_dir / "belief.json", "meg": stage_dir / "meg.json"}
        missing = [str(p) for p in outputs.values() if not p.is_file()]
        if missing:
            raise RuntimeError(f"score_run did not write {missing}")
        return outputs, {}

    def report(self, stage_dir: Path):
        from goalprobe.report import write_report

        path = write_report(self.run_dir, config=dataclasses.asdict(self.config))
        return {"report": path}, {}


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def stage_params(config: DemoConfig, name: str) -> dict:
    """The part of ``config`` stage ``name`` depends on (its cache key, with input fingerprints)."""
    c = dataclasses.asdict(config)
    agent = {
        "agent": model_identity(config.model),
        "backend": config.backend,
        "base_url": config.base_url,
    }
    rollout = {k: c[k] for k in ("temperature", "top_p", "max_new_tokens", "horizon_steps", "seed")}
    pick = {
        "grids": ("sizes", "densities", "grids_per_cell", "seed"),
        "rollouts": ("episodes_per_grid",),
        "behaviour": ("random_walks_per_grid", "n_bootstrap", "seed"),
        "iso": (
            "iso_transforms",
            "iso_base_grids",
            "episodes_per_grid",
            "random_walks_per_grid",
            "n_bootstrap",
        ),
        "keys": (
            "key_variants",
            "key_sizes",
            "key_density",
            "key_grids_per_size",
            "key_episodes_per_grid",
            "key_horizon",
            "n_bootstrap",
        ),
        "activations": ("layers",),
        "probes": (
            "probe_types",
            "probe_families",
            "probe_hidden_size",
            "probe_max_epochs",
            "probe_batch_size",
            "test_fraction",
            "n_bootstrap",
            "seed",
        ),
        "distance": (
            "probe_families",
            "probe_hidden_size",
            "probe_max_epochs",
            "probe_batch_size",
            "test_fraction",
            "n_bootstrap",
            "seed",
        ),
        "plans": (
            "plan_decoder_layers",
            "plan_control_layers",
            "plan_bottleneck",
            "plan_heads",
            "plan_max_epochs",
            "plan_patience",
            "test_fraction",
            "n_bootstrap",
            "seed",
        ),
        "patching": (
            "patch_sites",
            "patch_layers",
            "patch_max_bases",
            "patch_require_optimal",
            "n_bootstrap",
            "seed",
        ),
        "scoring": ("n_bootstrap", "seed"),
        "report": (),
    }[name]
    params = {k: c[k] for k in pick}
    if name in ("rollouts", "iso", "keys"):
        params.update(agent)
        params.update(rollout)
    if name in ("activations", "patching"):
        params["agent"] = model_identity(config.model)
    return params


def _failure_path(run_dir: Path, name: str) -> Path:
    return run_dir / "stages" / f"{name}{FAILED_SUFFIX}"


def run_demo(
    run_dir: str | Path,
    config: DemoConfig | None = None,
    force: Iterable[str] = (),
    progress: bool = True,
    *,
    strict: bool = False,
    log: Callable[[str], None] | None = None,
) -> DemoResult:
    """Run (or resume) the whole study in ``run_dir`` and write ``run_dir/report.html``.

    Args:
        run_dir: the run directory (created).
        config: what to run; None uses ``demo_config("default")``.
        force: stages to redo even when cached (``"all"`` redoes every stage). Stages
            downstream of a forced one rerun when its outputs changed.
        progress: show the stages' progress bars (rollouts, extraction) and a stage bar.
        strict: raise the first stage error instead of recording it and going on.
        log: called with one line per stage (default: print).

    Returns:
        a :class:`DemoResult`.

    Raises:
        ValueError: an unknown stage in ``force``.
    """
    from tqdm.auto import tqdm

    started = time.perf_counter()
    config = config or demo_config("default")
    run_dir = Path(run_dir)
    force = set(force)
    if "all" in force:
        force = set(STAGES)
    unknown = sorted(force - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; stages are {', '.join(STAGES)}")
    run_dir.mkdir(parents=True, exist_ok=True)
    say = log or print
    runner = StageRunner(run_dir, force=force)
    demo = _Demo(run_dir, config, progress)
    _write_json(run_dir / "demo_config.json", dataclasses.asdict(config))
    outcomes: dict[str, StageOutcome] = {}
    fingerprints: dict[str, str] = {}
    bar = tqdm(STAGES, desc="goalprobe demo", unit="stage", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        failed_inputs = [d for d in DEPENDS_ON[name] if d not in fingerprints]
        failure = _failure_path(run_dir, name)
        if failed_inputs and name != "report":
            reason = f"not run: input stage(s) {', '.join(failed_inputs)} did not finish"
            outcomes[name] = StageOutcome(name, "not_run", 0.0, {}, reason)
            _write_json(failure, {"stage": name, "status": "not_run", "error": reason})
            say(f"[{name}] {reason}")
            continue
        stage_config = {
            "params": stage_params(config, name),
            "inputs": {d: fingerprints[d] for d in DEPENDS_ON[name] if d in fingerprints},
        }
        if name == "report":
            stage_config["failures"] = {n: o.error for n, o in outcomes.items() if o.error}
        fn = getattr(demo, name)
        if name in force:
            _remove_outputs(runner, name)
        try:
            result = runner.run(name, stage_config, _with_fingerprint(fn, run_dir))
        except Exception as err:  # recorded, shown in the report, re-raised when strict
            if strict:
                raise
            reason = f"failed: {type(err).__name__}: {err}"
            outcomes[name] = StageOutcome(name, "failed", 0.0, {}, reason)
            _write_json(
                failure,
                {
                    "stage": name,
                    "status": "failed",
                    "error": reason,
                    "traceback": traceback.format_exc(),
                },
            )
            say(f"[{name}] {reason}")
            continue
        failure.unlink(missing_ok=True)
        fingerprints[name] = result.summary["fingerprint"]
        outcomes[name] = _outcome(result)
        state = "cached" if result.skipped else f"done in {result.seconds:.1f} s"
        say(f"[{name}] {state}")
    bar.close()
    report = run_dir / "report.html"
    return DemoResult(
        run_dir=run_dir,
        config=config,
        stages=outcomes,
        report_path=report if report.is_file() else None,
        seconds=time.perf_counter() - started,
    )


def _remove_outputs(runner: StageRunner, name: str) -> None:
    """Delete the outputs a stage's previous record lists, so that a forced stage starts over
    (the rollouts would otherwise resume their finished episodes, the extraction its parts)."""
    path = runner.record_path(name)
    if not path.is_file():
        return
    record = json.loads(path.read_text())
    root = runner.run_dir.resolve()
    for relative in record.get("outputs", {}).values():
        target = (root / relative).resolve()
        if not target.is_relative_to(root) or target == root:
            raise ValueError(f"stage record {path} names an output outside the run: {relative}")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)


def _with_fingerprint(fn: Callable, run_dir: Path) -> Callable:
    def run(stage_dir: Path):
        outputs, summary = fn(stage_dir)
        summary = {**_finite(summary), "fingerprint": fingerprint(outputs.values(), run_dir)}
        return outputs, summary

    return run


def _outcome(result: StageResult) -> StageOutcome:
    return StageOutcome(
        name=result.name,
        status="cached" if result.skipped else "ran",
        seconds=float(result.seconds),
        summary=dict(result.summary),
    )


__all__ = [
    "DEPENDS_ON",
    "SCALES",
    "STAGES",
    "DemoConfig",
    "DemoResult",
    "StageOutcome",
    "demo_config",
    "fingerprint",
    "model_identity",
    "run_demo",
    "stage_params",
]
