"""The files of a run directory as the viewer may open them, and what it reads from them.

Every file opened must resolve inside the run directory (:class:`UnsafePathError`: a symbolic
link elsewhere is refused), and each expected file that is absent or unreadable is recorded as a
:class:`MissingArtefact`. The probe outputs the viewer can show are decoded-map sources (one file
per probe x stage x layer) and predicted-plan sources (one run of a file per decoder x stage x
layer), whose keys are the allow-lists; :class:`RowIndex` finds an episode's rows in their
``row_ids``. The false_belief stage's episodes come with their per-step decoded maps
(:func:`read_false_belief_episodes`, read whole: the set is small) and the run overview's
start-state cards (:func:`false_belief_start_maps`); the fog stage's episodes are shown per step
as the true grid and what the fogged prompt drew (hidden cells shown as padding), with the step's
action against the free-space planner on what was revealed and against the optimal policy on
the true grid (:func:`fog_step_view`). Every file is read by its owner's reader."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.gridworld.core import Action, CellType, Grid, RowCol, State
from goalprobe.gridworld.false_belief import FALSE_BELIEF, pair_facts
from goalprobe.gridworld.fog import fogged_cell_types, free_space_actions, revealed_sets
from goalprobe.gridworld.io import GridSetFormatError, read_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types
from goalprobe.probes.decoded_maps import read_decoded_maps_info, read_step_maps
from goalprobe.probes.plan_metrics import read_plan_runs
from goalprobe.viewer.figures.style import N_CLASSES

from goalprobe.run_layout import RunLayout


class UnsafePathError(PermissionError):
    """A path resolves outside the run directory."""


class UnknownKeyError(KeyError):
    """A key sent by the browser is not in the server-side allow-list."""


@dataclass(frozen=True)
class MissingArtefact:
    """An artefact of the run directory (``path`` relative to it) that is absent or unreadable,
    why, and what the viewer cannot show without it."""

    name: str
    path: str
    reason: str
    consequence: str

    def __str__(self) -> str:
        return f"{self.name} ({self.path}): {self.reason}; {self.consequence}"


class RunFiles:
    """The run directory's files (paths from its ``layout``), resolved safely; absences go to
    :attr:`missing`, in the order met."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.layout = RunLayout(root)
        self.missing: list[MissingArtefact] = []

    def resolve(self, relative: str | Path) -> Path:
        """``RUN/relative`` resolved (:class:`UnsafePathError` outside the run directory)."""
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise UnsafePathError(f"{relative}: resolves to {path}, outside the run directory")
        return path

    def relative(self, path: Path) -> str:
        """A layout path relative to the run directory, for messages."""
        return path.relative_to(self.root).as_posix()

    def note(self, name: str, path: Path | str, reason: str, consequence: str) -> None:
        """Record an absent or unreadable artefact (``path``: a layout path or a relative one)."""
        relative = self.relative(path) if isinstance(path, Path) else path
        self.missing.append(MissingArtefact(name, relative, reason, consequence))

    def artefact(self, path: Path, name: str, consequence: str) -> Path | None:
        """The resolved path of an expected file, or None (recorded in :attr:`missing`)."""
        relative = self.relative(path)
        try:
            path = self.resolve(relative)
        except UnsafePathError as err:
            self.note(name, relative, str(err), consequence)
            return None
        if not path.is_file():
            self.note(name, relative, "not found", consequence)
            return None
        return path

    def first_file(self, candidates: Iterable[Path]) -> Path | None:
        """The first of ``candidates`` that is a file inside the run (nothing recorded)."""
        for candidate in candidates:
            try:
                path = self.resolve(candidate)
            except UnsafePathError:
                continue
            if path.is_file():
                return path
        return None

    def listing(self, folder: Path, name: str, consequence: str) -> list[Path]:
        """``*.h5`` files of a directory inside the run; absences go to :attr:`missing`."""
        relative = self.relative(folder)
        try:
            directory = self.resolve(relative)
        except UnsafePathError as err:
            self.note(name, relative, str(err), consequence)
            return []
        files = sorted(directory.glob("*.h5")) if directory.is_dir() else []
        safe = []
        for path in files:
            try:
                safe.append(self.resolve(path.relative_to(self.root)))
            except (UnsafePathError, ValueError) as err:
                self.note(name, f"{relative}/{path.name}", str(err), "file skipped")
        if not safe:
            self.note(name, f"{relative}/*.h5", "not found", consequence)
        return safe


def read_episodes(
    files: RunFiles, grids_path: Path, trajectories_path: Path, what: str
) -> tuple[dict, dict] | None:
    """``(grid id -> grid, "<grid_id>:<episode>" -> episode in file order)`` of a stage's grid
    set and trajectories (None when either is absent; ValueError: unreadable, or episodes on
    grids the grid set lacks)."""
    from goalprobe.agents.trajectories import TrajectoryFormatError, read_trajectories

    grids_file = files.resolve(files.relative(grids_path))
    trajectories_file = files.resolve(files.relative(trajectories_path))
    if not (grids_file.is_file() and trajectories_file.is_file()):
        return None
    try:
        grids = {g.grid_id: g for g in read_grid_set(grids_file)}
        episodes = {
            f"{e.summary.grid_id}:{int(e.summary.episode)}": e
            for e in read_trajectories(trajectories_file)
        }
    except (OSError, GridSetFormatError, TrajectoryFormatError) as err:
        raise ValueError(f"{what} episodes unreadable: {err}") from err
    unknown = sorted({e.summary.grid_id for e in episodes.values()} - set(grids))
    if unknown:
        raise ValueError(
            f"{files.relative(trajectories_path)}: episodes on grids the {what} grid set lacks "
            f"({', '.join(unknown[:3])})"
        )
    return grids, episodes


_STAGE_ALIASES = {
    "pre": "pre_reasoning",
    "pre_reasoning": "pre_reasoning",
    "post": "post_reasoning",
    "post_reasoning": "post_reasoning",
    "grid_cells": "grid_cells",
}


def canonical_stage(stage: str) -> str:
    """Map ``pre``/``post``/``pre_reasoning``/... onto the store's stage names."""
    if str(stage) not in _STAGE_ALIASES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {sorted(_STAGE_ALIASES)}")
    return _STAGE_ALIASES[str(stage)]


def full_class_probs(probs: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """Spread ``(..., C)`` probabilities of the ``(C,)`` ``classes`` over every ``CellType``:
    ``(..., len(CellType))`` float32, column ``c`` is ``P(CellType(c))`` (0 for absent ones)."""
    probs = np.asarray(probs, dtype=np.float32)
    out = np.zeros((*probs.shape[:-1], N_CLASSES), dtype=np.float32)
    out[..., np.asarray(classes, dtype=np.int64)] = probs
    return out


@dataclass(frozen=True)
class MapSource:
    """One decoded-maps file (key: the file stem): its probe's stage, layer, family and card,
    and the ``CellType`` of each probability column."""

    key: str
    path: Path
    stage: str
    layer: int
    family: str
    classes: tuple[int, ...]
    card: dict = field(repr=False, compare=False)

    @property
    def label(self) -> str:
        return f"{self.family} · {self.stage.split('_')[0]} · layer {self.layer} ({self.key})"


@dataclass(frozen=True)
class PlanSource:
    """One run (group under ``runs/``; key ``"<file stem>/<run name>"``) of predicted plans:
    the activations its decoder read, its kind (``decoder``, ``shuffled_control``, ...), its
    capacity (None: unknown) and whether split codes are stored."""

    key: str
    path: Path
    run: str
    stage: str
    layer: int
    kind: str
    n_layers: int | None
    has_split: bool

    @property
    def label(self) -> str:
        capacity = "" if self.n_layers is None else f" {self.n_layers}-layer"
        return f"{self.kind.replace('_', ' ')}{capacity} · {self.stage.split('_')[0]} · layer {self.layer}"


HEADLINE_FAMILY = "headline"
"""The family the viewer lists the headline maps under (files with ``role="headline"``, the maps
scoring uses), apart from the probe sweep's maps of the same stage, layer and family."""


def scan_map_sources(files: RunFiles) -> dict[str, MapSource]:
    """The decoded-map files of the run, by key; unreadable ones go to ``files.missing``."""
    paths = files.listing(files.layout.decoded_dir, "decoded maps", "no decoded cognitive maps")
    sources: dict[str, MapSource] = {}
    for path in paths:
        try:
            info = read_decoded_maps_info(path)
            if info.stage is None or info.layer is None:
                raise ValueError(
                    "neither the file attributes nor the probe card name its stage and layer"
                )
            sources[path.stem] = MapSource(
                key=path.stem,
                path=path,
                stage=canonical_stage(info.stage),
                layer=info.layer,
                family=HEADLINE_FAMILY if info.role == "headline" else info.family,
                classes=info.classes,
                card=info.card,
            )
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
            files.note("decoded maps", path, f"unreadable: {err}", "file skipped")
    return sources


def scan_plan_sources(files: RunFiles) -> dict[str, PlanSource]:
    """Every run of the run's predicted-plans files, by key; unreadable files go to
    ``files.missing``."""
    paths = files.listing(
        files.layout.predicted_plans_dir, "predicted plans", "no plan-decoder panel"
    )
    sources: dict[str, PlanSource] = {}
    for path in paths:
        try:
            for run in read_plan_runs(path):
                key = f"{path.stem}/{run.run}"
                sources[key] = PlanSource(
                    key=key,
                    path=path,
                    run=run.run,
                    stage=canonical_stage(run.stage),
                    layer=run.layer,
                    kind=run.kind,
                    n_layers=run.n_layers,
                    has_split=run.has_split,
                )
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
            files.note("predicted plans", path, f"unreadable: {err}", "file skipped")
    return sources


class RowIndex:
    """Sorted ``row_ids`` of an HDF5 file, for looking up the positions of store rows."""

    def __init__(self, row_ids: np.ndarray) -> None:
        ids = np.asarray(row_ids, dtype=np.int64)
        self.order = np.argsort(ids, kind="stable")
        self.sorted = ids[self.order]

    def positions(self, rows: Sequence[int | None]) -> tuple[np.ndarray, np.ndarray]:
        """``(present (T,) bool, positions (P,) int)``: file positions of the present rows."""
        wanted = np.asarray([-1 if r is None else r for r in rows], dtype=np.int64)
        at = np.searchsorted(self.sorted, wanted)
        at = np.minimum(at, max(len(self.sorted) - 1, 0))
        present = (
            (wanted >= 0) & (self.sorted[at] == wanted)
            if len(self.sorted)
            else np.zeros(len(rows), bool)
        )
        return present, self.order[at[present]]


def episode_key(grid_id: str, episode: int) -> str:
    """The allow-list key of an episode."""
    return f"{grid_id}:{int(episode)}"


def episode_label(summary, what: str = "") -> str:
    """Short human label of an episode: grid, episode, ``what`` (if any), outcome and length."""
    outcome = "success" if summary.success else "failure"
    middle = f" · {what}" if what else ""
    return f"{summary.grid_id} · ep {summary.episode}{middle} · {outcome} · {summary.length} steps"


@dataclass(frozen=True, eq=False)
class FalseBeliefEpisodes:
    """The false_belief stage's grids and episodes (by episode key, in file order: the
    allow-list), and by ``(grid_id, episode, step)`` each step's ``(S, S, len(CellType))``
    decoded map and position read-outs (empty without them; ``maps_why`` says why), with what
    decoded them (``maps_label``)."""

    grids: dict[str, Grid]
    episodes: dict[str, Any]
    maps: dict[tuple[str, int, int], np.ndarray]
    maps_why: str | None
    maps_label: str
    readouts: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict
    )

    def label(self, key: str) -> str:
        """Short human label: grid, episode, kind and role, outcome and length."""
        episode = self.episodes[key]
        s = episode.summary
        facts = pair_facts(self.grids[s.grid_id]) or {}
        what = f"{facts.get('kind', '?').replace('_', ' ')} {facts.get('role', '?')}"
        return episode_label(s, what.replace("false_belief", "false belief"))


def read_false_belief_episodes(files: RunFiles) -> FalseBeliefEpisodes | None:
    """The stage's episodes and maps (None when it has not run; raises as
    :func:`goalprobe.viewer.run_files.read_episodes`)."""
    layout = files.layout
    maps_path = files.resolve(files.relative(layout.false_belief_decoded))
    read = read_episodes(
        files, layout.false_belief_grids, layout.false_belief_trajectories, "false-belief"
    )
    if read is None:
        return None
    grids, episodes = read
    maps: dict[tuple[str, int, int], np.ndarray] = {}
    readouts: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = {}
    why, label = None, ""
    if maps_path.is_file():
        try:
            step_maps = read_step_maps(maps_path)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"false-belief decoded maps unreadable: {err}") from err
        probs = full_class_probs(step_maps.probs, step_maps.classes.tolist())
        index = step_maps.index()
        maps = {key: probs[i] for key, i in index.items()}
        if step_maps.agent is not None and step_maps.goal is not None:
            agent, goal = (
                np.asarray(p, dtype=np.float32) for p in (step_maps.agent, step_maps.goal)
            )
            readouts = {key: (agent[i], goal[i]) for key, i in index.items()}
        a = step_maps.attrs
        stage = a.get("stage", "?")
        stage = stage.decode() if isinstance(stage, bytes) else str(stage)
        label = f"{stage} · layer {a.get('layer', '?')}"
    else:
        why = (
            "no decoded maps of the false-belief steps: run goalprobe demo with the probes "
            "stage (the headline probe decodes every visited state)"
        )
    return FalseBeliefEpisodes(grids, episodes, maps, why, label, readouts)


def false_belief_start_maps(files: RunFiles, per_kind: int = 1) -> list[dict]:
    """The first ``per_kind`` false-belief grids of each kind at their start state as
    ``[{"grid_id", "kind", "true", "shown", "decoded" (None: no probe reading), "differs",
    "decoded_at"}]`` (maps ``(n, n)`` ``CellType`` arrays; empty when the stage has not run)."""
    from goalprobe.probes.scoring.false_belief import read_results

    grids_path, results_path = files.layout.false_belief_grids, files.layout.false_belief_results
    if not (grids_path.is_file() and results_path.is_file()):
        return []
    try:
        grids = read_grid_set(grids_path)
        results = read_results(results_path)
    except (OSError, ValueError) as err:
        raise ValueError(f"false-belief outputs unreadable: {err}") from err
    decoding = results.get("decoding") or {}
    maps = decoding.get("maps") or {}
    cells = decoding.get("cells") or []
    out: list[dict] = []
    taken: dict[str, int] = {}
    for grid in grids:
        facts = pair_facts(grid)
        if not facts or facts["role"] != FALSE_BELIEF or taken.get(facts["kind"], 0) >= per_kind:
            continue
        taken[facts["kind"]] = taken.get(facts["kind"], 0) + 1
        decoded = maps.get(grid.grid_id)
        out.append(
            {
                "grid_id": grid.grid_id,
                "kind": facts["kind"],
                "true": cell_types(grid),
                "shown": cell_types(grid.prompt_grid),
                "decoded": None if decoded is None else np.asarray(decoded, dtype=np.int64),
                "differs": [tuple(c) for c in facts["differs"]],
                "decoded_at": [c for c in cells if c["grid_id"] == grid.grid_id],
            }
        )
    return out


@dataclass(frozen=True, eq=False)
class FogEpisodes:
    """The fog stage's grids and episodes (by episode key, in file order)."""

    grids: dict[str, Grid]
    episodes: dict[str, Any]

    def label(self, key: str) -> str:
        """Grid, episode, outcome and length."""
        return episode_label(self.episodes[key].summary)


@dataclass(frozen=True)
class FogStepView:
    """One step of a fogged episode: ``(n, n)`` cell types of the true grid and of what the
    prompt drew (``hidden`` cells as ``PADDING``), the action (None: invalid) against the
    free-space planner's moves on what was revealed and the optimal moves on the true grid."""

    step: int
    n_steps: int
    true_types: np.ndarray
    shown_types: np.ndarray
    hidden: tuple[RowCol, ...]
    agent: RowCol
    action: Action | None
    free_space: frozenset[Action]
    optimal: frozenset[Action]
    reasoning: str | None
    final: str | None


def read_fog_episodes(files: RunFiles) -> FogEpisodes | None:
    """The fog stage's grids and episodes (None when the stage has not run); raises as
    :func:`goalprobe.viewer.run_files.read_episodes`."""
    read = read_episodes(files, files.layout.fog_grids, files.layout.fog_trajectories, "fog")
    return None if read is None else FogEpisodes(*read)


def fog_step_view(fog: FogEpisodes, key: str, step: int) -> FogStepView:
    """The view of step ``step`` (clipped) of episode ``key`` (``KeyError`` if unknown)."""
    episode = fog.episodes[key]
    grid = fog.grids[episode.summary.grid_id]
    steps = episode.steps
    t = min(max(int(step), 0), max(len(steps) - 1, 0))
    record = steps[t]
    state = State(tuple(record.agent_row_col))
    cells = [grid.start, *(tuple(s.next_agent_row_col) for s in steps[:t])]
    revealed = revealed_sets(grid, cells)[-1]
    shown = fogged_cell_types(grid, state, revealed).astype(np.int64)
    hidden = tuple((int(r), int(c)) for r, c in np.argwhere(shown < 0))
    shown[shown < 0] = CellType.PADDING
    action = Action[record.action] if record.action else None
    return FogStepView(
        step=t,
        n_steps=len(steps),
        true_types=cell_types(grid, state).astype(np.int64),
        shown_types=shown,
        hidden=hidden,
        agent=state.agent,
        action=action,
        free_space=free_space_actions(grid, state, revealed, goal_known=False),
        optimal=solve(grid).optimal_actions(state),
        reasoning=record.reasoning,
        final=record.final,
    )
