"""Lazy, per-episode access to a goalprobe run directory (what the viewer shows).

Every path comes from the run's :class:`~goalprobe.run_layout.RunLayout`; every file may be
missing (:attr:`RunData.missing` says which are). What is read here:

* grid set (goalprobe.gridset/2, /1) and trajectories (goalprobe.trajectory/2, /1);
* the activation store (only its /labels ids);
* decoded maps, ``probes/decoded/<probe>.h5``: probs (N, S, S, C), row_ids (N,);
* predicted plans, ``plans/predicted/<decoder>.h5``: runs/<run>/plans (N, T), row_ids (N,);
* the patching bundle (goalprobe.patching/2, "records"), else the patching records CSV;
* belief and MEG scoring (JSON) and whether the report exists;
* the false_belief stage's grids, episodes and per-step decoded maps
  (``false_belief/decoded_maps.h5``, goalprobe.step_maps, keyed by ``(grid_id, episode, step)``),
  read whole on first use (:meth:`RunData.false_belief_episodes`; the set is small).

How the parts join: a trajectory step is ``(grid_id, episode, step)``; the store's ``/labels``
map each of its rows to those ids (and the trajectory ``run_id``); decoded maps and predicted
plans name store rows in ``row_ids``; a patching record names its base step in ``base_id``
(``"{run_id}/{grid_id}/{episode}/{step}"``).

Nothing is loaded whole. Opening a run scans the trajectory file once for byte offsets of
each episode (summary lines are parsed, step lines are only located), and reads the id columns
of the store and the ``row_ids`` of each HDF5 file on first use. Showing an episode reads its
step lines and only its rows of the probability and plan datasets.

Safety: the browser only ever sends *keys* (episode keys, source keys, class names) that are
looked up in allow-lists built here (:class:`UnknownKeyError` otherwise); no path ever comes
from a request. Every file opened is resolved and must lie inside the run directory
(:class:`UnsafePathError`), so a symbolic link pointing elsewhere is refused, not followed.
"""

from __future__ import annotations

import csv
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.agents.trajectories import (
    EpisodeSummary,
    RunHeader,
    StepRecord,
    TrajectoryFormatError,
    parse_record,
)
from goalprobe.gridworld.core import CellType, Grid
from goalprobe.gridworld.text import parse
from goalprobe.viewer.figures.probes import baseline_values

from goalprobe.run_layout import RunLayout

N_CLASSES = len(CellType)
"""Width of the class axis after :func:`full_class_probs` (indexed by ``CellType``)."""

STAGES: tuple[str, ...] = ("pre_reasoning", "post_reasoning")
"""Canonical stage names (``"pre"``/``"post"`` in older cards are mapped onto them)."""

_STAGE_ALIASES = {
    "pre": "pre_reasoning",
    "pre_reasoning": "pre_reasoning",
    "post": "post_reasoning",
    "post_reasoning": "post_reasoning",
    "grid_cells": "grid_cells",
}
_KIND_RE = re.compile(rb'^\{"schema":"goalprobe\.trajectory/[12]","kind":"(run|step|episode)"')
_PLAN_RUN_RE = re.compile(r"^(?P<stage>[a-z_]+)/layer(?P<layer>\d+)/(?P<kind>[a-z_]+?)(?P<n>\d*)$")


class UnsafePathError(PermissionError):
    """A path resolves outside the run directory."""


class UnknownKeyError(KeyError):
    """A key sent by the browser is not in the server-side allow-list."""


@dataclass(frozen=True)
class MissingArtefact:
    """An artefact of the run directory that is absent or unreadable.

    Attributes:
        name: what it is (``"activation store"``).
        path: its path relative to the run directory.
        reason: why it is unavailable (``"not found"`` or the reader's error).
        consequence: what the viewer cannot show without it.
    """

    name: str
    path: str
    reason: str
    consequence: str

    def __str__(self) -> str:
        return f"{self.name} ({self.path}): {self.reason}; {self.consequence}"


@dataclass(frozen=True)
class EpisodeInfo:
    """One finished episode of the trajectory file (from its summary line).

    Attributes:
        key: ``"<grid_id>:<episode>"``, the allow-list key of the episode.
        summary: the validated summary record.
        first_line: 1-based line of its first step line in the trajectory file.
        start, end: byte range of its step lines and summary line.
    """

    key: str
    summary: EpisodeSummary
    first_line: int
    start: int
    end: int

    @property
    def grid_id(self) -> str:
        return self.summary.grid_id

    @property
    def episode(self) -> int:
        return self.summary.episode

    @property
    def label(self) -> str:
        """Short human label: grid, episode, outcome and length."""
        s = self.summary
        outcome = "success" if s.success else "failure"
        return f"{s.grid_id} · ep {s.episode} · {outcome} · {s.length} steps"


@dataclass(frozen=True)
class MapSource:
    """One decoded-maps file (one probe x stage x layer).

    Attributes:
        key: allow-list key (the file stem).
        path: the resolved file.
        stage: canonical stage name.
        layer: residual-stream layer.
        family: probe family (``mlp``, ``linear``, ...).
        classes: ``(C,)`` ``CellType`` of each probability column in the file.
        card: the decoding probe's card.
    """

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
    """One run of predicted plans (one decoder x stage x layer).

    Attributes:
        key: allow-list key, ``"<file stem>/<run name>"``.
        path: the resolved file.
        run: the group name under ``runs/``.
        stage, layer: activations the decoder read.
        kind: ``decoder``, ``shuffled_control``, ...
        n_layers: decoder capacity (Transformer layers), None when unknown.
        has_split: whether split codes (0 train, 1 validation, 2 test) are stored.
    """

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


@dataclass(frozen=True, eq=False)
class EpisodeData:
    """Everything of one episode that does not depend on a probe.

    Attributes:
        info: the index entry.
        steps: ``(T,)`` step records in order.
        grid: the true grid (from the grid set, else parsed from the first step's text).
        rows: ``(T,)`` store row of each step, None where the store has none (or no store).
    """

    info: EpisodeInfo
    steps: tuple[StepRecord, ...]
    grid: Grid
    rows: tuple[int | None, ...]

    @property
    def summary(self) -> EpisodeSummary:
        return self.info.summary


@dataclass(frozen=True, eq=False)
class StepArrays:
    """Per-step arrays of one episode from one HDF5 source.

    Attributes:
        values: ``(T, ...)`` values (zeros where ``present`` is False).
        present: ``(T,)`` bool, whether the source holds the step.
    """

    values: np.ndarray
    present: np.ndarray


@dataclass(frozen=True, eq=False)
class FalseBeliefEpisodes:
    """The false_belief stage's episodes (``RUN/false_belief/``), read whole on first use: the
    set is small (a few pairs per kind, a few episodes per grid).

    Attributes:
        grids: grid id -> grid (false-belief grids carry ``shown``; controls do not).
        episodes: episode key (``"<grid_id>:<episode>"``) -> episode, in file order (the
            allow-list of false-belief episode keys).
        maps: ``(grid_id, episode, step)`` -> ``(S, S, len(CellType))`` float32 decoded map of
            the step (from ``false_belief/decoded_maps.h5``); empty without one.
        maps_why: why there are no decoded maps (None when there are).
        maps_label: what decoded them (stage, layer, probe), for captions.
    """

    grids: dict[str, Grid]
    episodes: dict[str, Any]
    maps: dict[tuple[str, int, int], np.ndarray]
    maps_why: str | None
    maps_label: str

    def label(self, key: str) -> str:
        """Short human label: grid, episode, kind and role, outcome and length."""
        from goalprobe.gridworld.false_belief import pair_facts

        episode = self.episodes[key]
        s = episode.summary
        facts = pair_facts(self.grids[s.grid_id]) or {}
        what = f"{facts.get('kind', '?').replace('_', ' ')} {facts.get('role', '?')}"
        what = what.replace("false_belief", "false belief")
        outcome = "success" if s.success else "failure"
        return f"{s.grid_id} · ep {s.episode} · {what} · {outcome} · {s.length} steps"


def find_runs(path: str | Path) -> dict[str, Path]:
    """The run directories at ``path``: ``{name: path}`` of ``path`` itself when it holds
    trajectories, else of each sub-directory that does (sorted by name; e.g. one run per agent).
    """
    root = Path(path).expanduser()
    if RunLayout(root).trajectories.is_file():
        return {root.resolve().name: root}
    if not root.is_dir():
        return {}
    return {
        child.name: child
        for child in sorted(root.iterdir())
        if child.is_dir() and RunLayout(child).trajectories.is_file()
    }


def canonical_stage(stage: str) -> str:
    """Map ``pre``/``post``/``pre_reasoning``/... onto the store's stage names."""
    try:
        return _STAGE_ALIASES[str(stage)]
    except KeyError:
        raise ValueError(
            f"unknown stage {stage!r}; expected one of {sorted(_STAGE_ALIASES)}"
        ) from None


def episode_key(grid_id: str, episode: int) -> str:
    """The allow-list key of an episode."""
    return f"{grid_id}:{int(episode)}"


def full_class_probs(probs: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """Spread probability columns over every ``CellType`` (absent classes get 0).

    Args:
        probs: ``(..., C)`` probabilities of ``classes``.
        classes: ``(C,)`` ``CellType`` values.

    Returns:
        ``(..., len(CellType))`` float32, column ``c`` is ``P(CellType(c))``.
    """
    probs = np.asarray(probs, dtype=np.float32)
    out = np.zeros((*probs.shape[:-1], N_CLASSES), dtype=np.float32)
    out[..., np.asarray(classes, dtype=np.int64)] = probs
    return out


class _LRU:
    """A tiny thread-safe LRU cache (the Dash server answers callbacks on several threads)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, make: Callable[[], Any]):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = make()
        with self._lock:
            self._data[key] = value
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value


class _RowIndex:
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


def _read_positions(ds, positions: np.ndarray) -> np.ndarray:
    """``ds[positions]`` for any order of ``positions`` (h5py wants increasing indices)."""
    if positions.size == 0:
        return np.zeros((0, *ds.shape[1:]), dtype=ds.dtype)
    unique, inverse = np.unique(positions, return_inverse=True)
    return ds[unique.tolist()][inverse]


class RunData:
    """A run directory opened for viewing: an index of episodes and probe sources.

    Args:
        run_dir: the run directory.
        episode_cache: episodes kept in memory (least recently used are dropped).

    Attributes:
        root: resolved run directory.
        missing: artefacts that are absent or unreadable (shown as a notice).
        header: the trajectory file's run header, None without trajectories.
        episodes: episode key -> :class:`EpisodeInfo`, in file order (the episode allow-list).
        map_sources: source key -> :class:`MapSource` (the decoded-map allow-list).
        plan_sources: source key -> :class:`PlanSource` (the predicted-plan allow-list).

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory.
    """

    def __init__(self, run_dir: str | Path, *, episode_cache: int = 16) -> None:
        root = Path(run_dir).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"{run_dir}: not a run directory")
        self.root = root.resolve(strict=True)
        self.layout = RunLayout(self.root)
        self.missing: list[MissingArtefact] = []
        self.header: RunHeader | None = None
        self.episodes: dict[str, EpisodeInfo] = {}
        self.map_sources: dict[str, MapSource] = {}
        self.plan_sources: dict[str, PlanSource] = {}
        self._lock = threading.Lock()
        self._episode_cache = _LRU(episode_cache)
        self._array_cache = _LRU(4 * episode_cache)
        self._row_indexes: dict[str, _RowIndex] = {}
        self._store_index: dict[tuple[str, int], dict[int, int]] | None = None
        self._store_labels: dict[str, np.ndarray] | None = None
        self._grid_offsets: dict[str, tuple[int, int]] | None = None
        self._patching: dict[str, list[dict]] | None = None
        self._false_belief: tuple[FalseBeliefEpisodes | None] | None = None
        self._scan()

    # -- paths --------------------------------------------------------------------------------

    def resolve(self, relative: str | Path) -> Path:
        """``RUN/relative`` resolved (symbolic links followed); must stay inside the run.

        Raises:
            UnsafePathError: the path resolves outside the run directory.
        """
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise UnsafePathError(f"{relative}: resolves to {path}, outside the run directory")
        return path

    def _relative(self, path: Path) -> str:
        """A layout path relative to the run directory, for messages."""
        return path.relative_to(self.root).as_posix()

    def _artefact(self, path: Path, name: str, consequence: str) -> Path | None:
        """The resolved path of an expected file, or None (recorded in :attr:`missing`)."""
        relative = self._relative(path)
        try:
            path = self.resolve(relative)
        except UnsafePathError as err:
            self.missing.append(MissingArtefact(name, relative, str(err), consequence))
            return None
        if not path.is_file():
            self.missing.append(MissingArtefact(name, relative, "not found", consequence))
            return None
        return path

    # -- scanning -----------------------------------------------------------------------------

    def _scan(self) -> None:
        layout = self.layout
        self._grids_path = self._artefact(
            layout.grids, "grid set", "grids are rebuilt from the trajectory's grid text"
        )
        self._traj_path = self._artefact(
            layout.trajectories, "trajectories", "there are no episodes to show"
        )
        if self._traj_path is not None:
            try:
                self._index_trajectories(self._traj_path)
            except (OSError, TrajectoryFormatError) as err:
                self.missing.append(
                    MissingArtefact(
                        "trajectories", self._relative(layout.trajectories), str(err), "no episodes"
                    )
                )
                self.episodes = {}
        self._store_path = self._artefact(
            layout.store,
            "activation store",
            "decoded maps and predicted plans cannot be joined to steps",
        )
        self._scan_maps()
        self._scan_plans()
        self._patching_path = None
        for candidate in (layout.patch_results, layout.patch_records_csv):
            try:
                path = self.resolve(candidate)
            except UnsafePathError:
                continue
            if path.is_file():
                self._patching_path = path
                break
        if self._patching_path is None:
            self.missing.append(
                MissingArtefact(
                    "patching results",
                    self._relative(layout.patch_results),
                    "not found",
                    "no patching panel",
                )
            )
        self._belief_path = self._artefact(
            layout.belief, "belief scoring", "no policy-against-belief summary"
        )
        self._meg_path = self._artefact(layout.meg, "MEG scoring", "no MEG summary")
        self._artefact(layout.report, "report", "no link to the static report")

    def _index_trajectories(self, path: Path) -> None:
        """Byte ranges of every finished episode; summaries are parsed and validated."""
        episodes: dict[str, EpisodeInfo] = {}
        block_start = 0
        block_line = 1
        offset = 0
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                offset += len(raw)
                if not raw.endswith(b"\n"):
                    break  # a truncated final line: an interrupted writer; ignored
                match = _KIND_RE.match(raw)
                kind = match.group(1).decode() if match else None
                if kind is None:
                    try:
                        kind = json.loads(raw).get("kind")
                    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
                        raise TrajectoryFormatError(f"{path}:{number}: not valid JSON") from err
                if kind == "step":
                    continue
                record = parse_record(json.loads(raw), f"{path}:{number}")
                if isinstance(record, RunHeader):
                    if number != 1:
                        raise TrajectoryFormatError(f"{path}:{number}: a 'run' line must be first")
                    self.header = record
                elif isinstance(record, EpisodeSummary):
                    key = episode_key(record.grid_id, record.episode)
                    if key in episodes:
                        raise TrajectoryFormatError(f"{path}:{number}: episode {key} repeats")
                    episodes[key] = EpisodeInfo(key, record, block_line, block_start, offset)
                block_start, block_line = offset, number + 1
        if self.header is None:
            raise TrajectoryFormatError(f"{path}:1: the file does not start with a 'run' line")
        self.episodes = episodes

    def _scan_maps(self) -> None:
        import h5py

        files = self._listing(self.layout.decoded_dir, "decoded maps", "no decoded cognitive maps")
        for path in files:
            rel = path.relative_to(self.root).as_posix()
            try:
                with h5py.File(path, "r") as f:
                    if f.attrs.get("schema") != "goalprobe.decoded_maps":
                        raise ValueError(f"schema is {f.attrs.get('schema')!r}")
                    if "probs" not in f or "row_ids" not in f:
                        raise ValueError("datasets probs and row_ids are required")
                    shape = f["probs"].shape
                    card = json.loads(f.attrs.get("probe_card", "{}"))
                    source = card.get("activations") or {}
                    params = card.get("hyperparameters") or {}
                    stage = f.attrs.get("stage", source.get("stage"))
                    layer = f.attrs.get("layer", source.get("layer"))
                    family = f.attrs.get("family", params.get("family", card.get("class")))
                    classes = tuple(int(c) for c in np.asarray(f.attrs["classes"]).tolist())
                if stage is None or layer is None:
                    raise ValueError(
                        "neither the file attributes nor the probe card name its stage and layer"
                    )
                if len(shape) != 4 or shape[1] != shape[2] or shape[3] != len(classes):
                    raise ValueError(f"probs has shape {shape} for {len(classes)} classes")
                if any(not 0 <= c < N_CLASSES for c in classes):
                    raise ValueError(f"classes {classes} are not CellType values")
                self.map_sources[path.stem] = MapSource(
                    key=path.stem,
                    path=path,
                    stage=canonical_stage(_text(stage)),
                    layer=int(layer),
                    family=_text(family or "probe"),
                    classes=classes,
                    card=card,
                )
            except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
                self.missing.append(
                    MissingArtefact("decoded maps", rel, f"unreadable: {err}", "file skipped")
                )

    def _scan_plans(self) -> None:
        import h5py

        files = self._listing(
            self.layout.predicted_plans_dir, "predicted plans", "no plan-decoder panel"
        )
        for path in files:
            rel = path.relative_to(self.root).as_posix()
            try:
                with h5py.File(path, "r") as f:
                    if f.attrs.get("schema") != "goalprobe.predicted_plans":
                        raise ValueError(f"schema is {f.attrs.get('schema')!r}")
                    runs = _plan_runs(f)
                    for run in runs:
                        group = f[f"runs/{run}"]
                        card = json.loads(group.attrs.get("card", "{}"))
                        self.plan_sources[f"{path.stem}/{run}"] = _plan_source(
                            f"{path.stem}/{run}", path, run, dict(f.attrs), card, "split" in group
                        )
                if not runs:
                    raise ValueError("no runs/<name>/plans group")
            except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
                self.missing.append(
                    MissingArtefact("predicted plans", rel, f"unreadable: {err}", "file skipped")
                )

    def _listing(self, folder: Path, name: str, consequence: str) -> list[Path]:
        """``*.h5`` files of a directory inside the run; absences go to :attr:`missing`."""
        relative = self._relative(folder)
        try:
            directory = self.resolve(relative)
        except UnsafePathError as err:
            self.missing.append(MissingArtefact(name, relative, str(err), consequence))
            return []
        files = sorted(directory.glob("*.h5")) if directory.is_dir() else []
        safe = []
        for path in files:
            try:
                safe.append(self.resolve(path.relative_to(self.root)))
            except (UnsafePathError, ValueError) as err:
                self.missing.append(
                    MissingArtefact(name, f"{relative}/{path.name}", str(err), "file skipped")
                )
        if not safe:
            self.missing.append(MissingArtefact(name, f"{relative}/*.h5", "not found", consequence))
        return safe

    # -- allow-lists --------------------------------------------------------------------------

    def episode_info(self, key: str) -> EpisodeInfo:
        """The index entry of an episode key (raises :class:`UnknownKeyError`)."""
        if not isinstance(key, str) or key not in self.episodes:
            raise UnknownKeyError(f"unknown episode {key!r}")
        return self.episodes[key]

    def map_source(self, key: str) -> MapSource:
        """A decoded-map source by key (raises :class:`UnknownKeyError`)."""
        if not isinstance(key, str) or key not in self.map_sources:
            raise UnknownKeyError(f"unknown decoded-map source {key!r}")
        return self.map_sources[key]

    def plan_source(self, key: str) -> PlanSource:
        """A predicted-plan source by key (raises :class:`UnknownKeyError`)."""
        if not isinstance(key, str) or key not in self.plan_sources:
            raise UnknownKeyError(f"unknown predicted-plan source {key!r}")
        return self.plan_sources[key]

    def filter_episodes(
        self,
        *,
        sizes: Iterable[int] | None = None,
        densities: Iterable[float] | None = None,
        variants: Iterable[str] | None = None,
        success: bool | None = None,
    ) -> list[EpisodeInfo]:
        """Episodes matching every given criterion (None: no constraint), in file order."""
        size_set = None if sizes is None else {int(s) for s in sizes}
        dens = None if densities is None else [float(d) for d in densities]
        variant_set = None if variants is None else {str(v) for v in variants}
        out = []
        for info in self.episodes.values():
            s = info.summary
            if size_set is not None and s.grid_size not in size_set:
                continue
            if dens is not None and not any(
                s.density is not None and abs(s.density - d) < 1e-6 for d in dens
            ):
                continue
            if variant_set is not None and s.variant not in variant_set:
                continue
            if success is not None and s.success != success:
                continue
            out.append(info)
        return out

    def facets(self) -> dict[str, list]:
        """Distinct sizes, densities and variants among the episodes (for filter options)."""
        summaries = [i.summary for i in self.episodes.values()]
        return {
            "sizes": sorted({s.grid_size for s in summaries}),
            "densities": sorted({s.density for s in summaries if s.density is not None}),
            "variants": sorted({s.variant for s in summaries}),
        }

    # -- episodes -----------------------------------------------------------------------------

    def episode(self, key: str) -> EpisodeData:
        """Load one episode: its step lines, its grid and its store rows (cached).

        Raises:
            UnknownKeyError: ``key`` is not an episode of the run.
            TrajectoryFormatError: its lines break the schema (file and line named).
        """
        info = self.episode_info(key)
        return self._episode_cache.get(("episode", key), lambda: self._load_episode(info))

    def _load_episode(self, info: EpisodeInfo) -> EpisodeData:
        assert self._traj_path is not None
        with self._traj_path.open("rb") as fh:
            fh.seek(info.start)
            block = fh.read(info.end - info.start)
        lines = block.splitlines()
        steps = []
        for i, raw in enumerate(lines[:-1]):
            where = f"{self._traj_path}:{info.first_line + i}"
            try:
                record = parse_record(json.loads(raw), where)
            except json.JSONDecodeError as err:
                raise TrajectoryFormatError(f"{where}: not valid JSON ({err})") from err
            if not isinstance(record, StepRecord):
                raise TrajectoryFormatError(f"{where}: expected a step line of episode {info.key}")
            if (record.grid_id, record.episode, record.step) != (info.grid_id, info.episode, i):
                raise TrajectoryFormatError(
                    f"{where}: step line ({record.grid_id}, {record.episode}, step {record.step}) "
                    f"does not continue episode {info.key} at step {i}"
                )
            steps.append(record)
        if len(steps) != info.summary.length:
            raise TrajectoryFormatError(
                f"{self._traj_path}:{info.first_line}: episode {info.key} has {len(steps)} step "
                f"lines, its summary says {info.summary.length}"
            )
        grid = self._grid(info, steps)
        index = self._store_rows()
        by_step = {} if index is None else index.get((info.grid_id, info.episode), {})
        rows = tuple(by_step.get(i) for i in range(len(steps)))
        return EpisodeData(info=info, steps=tuple(steps), grid=grid, rows=rows)

    def _grid(self, info: EpisodeInfo, steps: Sequence[StepRecord]) -> Grid:
        """The episode's grid: from the grid set when it holds it, else from the first step."""
        from goalprobe.gridworld.io import grid_from_dict

        offsets = self._grid_index()
        if info.grid_id in offsets and self._grids_path is not None:
            start, line = offsets[info.grid_id]
            with self._grids_path.open("rb") as fh:
                fh.seek(start)
                raw = fh.readline()
            return grid_from_dict(json.loads(raw), where=f"{self._grids_path}:{line}")
        first = steps[0]
        visible, state = parse(first.grid_text, variant=first.variant, grid_id=first.grid_id)
        return Grid(
            walls=visible.walls,
            goal=first.goal_row_col,
            start=info.summary.start_row_col,
            key=first.key_row_col,
            door=first.door_row_col,
            variant=first.variant,
            density=first.density,
            grid_id=first.grid_id,
        )

    def _grid_index(self) -> dict[str, tuple[int, int]]:
        """grid_id -> (byte offset, line) in the grid set (built once)."""
        with self._lock:
            if self._grid_offsets is None:
                offsets: dict[str, tuple[int, int]] = {}
                if self._grids_path is not None:
                    offset = 0
                    with self._grids_path.open("rb") as fh:
                        for number, raw in enumerate(fh, start=1):
                            if raw.strip():
                                try:
                                    grid_id = json.loads(raw).get("grid_id")
                                except (json.JSONDecodeError, AttributeError) as err:
                                    raise ValueError(
                                        f"{self._grids_path}:{number}: not a JSON object"
                                    ) from err
                                if isinstance(grid_id, str):
                                    offsets.setdefault(grid_id, (offset, number))
                            offset += len(raw)
                self._grid_offsets = offsets
            return self._grid_offsets

    def _store_rows(self) -> dict[tuple[str, int], dict[int, int]] | None:
        """(grid_id, episode) -> {step: store row} for rows of this run (built once)."""
        from goalprobe.activations.store import ActivationStore, StoreFormatError

        with self._lock:
            if self._store_index is None and self._store_path is not None:
                try:
                    with ActivationStore(self._store_path) as store:
                        labels = store.labels(["run_id", "grid_id", "episode", "step", "plan"])
                except (OSError, StoreFormatError) as err:
                    self.missing.append(
                        MissingArtefact(
                            "activation store",
                            self._relative(self.layout.store),
                            str(err),
                            "probe panels unavailable",
                        )
                    )
                    self._store_path = None
                    return None
                run_id = None if self.header is None else self.header.run_id
                index: dict[tuple[str, int], dict[int, int]] = {}
                ours = labels["run_id"].astype(str) == run_id
                if len(ours) and not ours.any():
                    foreign = sorted(set(labels["run_id"].astype(str).tolist()))
                    self.missing.append(
                        MissingArtefact(
                            "activation store",
                            self._relative(self.layout.store),
                            f"its rows come from trajectory run(s) {', '.join(foreign)}, not from "
                            f"this run's {run_id} (extracted from another rollout)",
                            "probe and plan panels show nothing",
                        )
                    )
                for row in np.flatnonzero(ours).tolist():
                    key = (str(labels["grid_id"][row]), int(labels["episode"][row]))
                    index.setdefault(key, {})[int(labels["step"][row])] = row
                self._store_index = index
                self._store_labels = labels
            return self._store_index

    # -- probe outputs ------------------------------------------------------------------------

    def check_store(self) -> MissingArtefact | None:
        """Read the store's ids now; the notice (also in :attr:`missing`) when it is unreadable
        or none of its rows belongs to this run's trajectories, else None."""
        before = len(self.missing)
        self._store_rows()
        added = [m for m in self.missing[before:] if m.name == "activation store"]
        return added[0] if added else None

    def _row_index(self, cache_key: str, path: Path, dataset: str) -> _RowIndex:
        import h5py

        with self._lock:
            if cache_key not in self._row_indexes:
                with h5py.File(path, "r") as f:
                    self._row_indexes[cache_key] = _RowIndex(f[dataset][()])
            return self._row_indexes[cache_key]

    def decoded_maps(self, source_key: str, episode: str) -> StepArrays:
        """Decoded maps of every step of an episode.

        Returns:
            :class:`StepArrays` with ``values: (T, S, S, len(CellType))`` float32 probabilities
            (column ``c`` = ``P(CellType(c))``, 0 for classes the probe does not predict).
        """
        source = self.map_source(source_key)
        data = self.episode(episode)

        def load() -> StepArrays:
            import h5py

            index = self._row_index(f"maps/{source.key}", source.path, "row_ids")
            present, positions = index.positions(data.rows)
            with h5py.File(source.path, "r") as f:
                ds = f["probs"]
                side = ds.shape[1]
                probs = _read_positions(ds, positions)
            values = np.zeros((len(data.rows), side, side, N_CLASSES), dtype=np.float32)
            values[present] = full_class_probs(probs, source.classes)
            return StepArrays(values=values, present=present)

        return self._array_cache.get(("maps", source_key, episode), load)

    def episodes_with_maps(self, source_key: str) -> frozenset[str]:
        """Episode keys with at least one step in a decoded-map source (built once per source).

        Decoded maps are written for the rows a probe was scored on (its held-out test grids),
        so most episodes of a run have none.
        """
        import h5py

        source = self.map_source(source_key)

        def load() -> frozenset[str]:
            self._store_rows()
            labels = self._store_labels
            if labels is None or self.header is None:
                return frozenset()
            with h5py.File(source.path, "r") as f:
                rows = np.asarray(f["row_ids"][()], dtype=np.int64)
            rows = rows[(rows >= 0) & (rows < len(labels["grid_id"]))]
            ours = labels["run_id"][rows].astype(str) == self.header.run_id
            rows = rows[ours]
            keys = {
                episode_key(str(g), int(e))
                for g, e in zip(labels["grid_id"][rows], labels["episode"][rows], strict=True)
            }
            return frozenset(k for k in keys if k in self.episodes)

        return self._array_cache.get(("mapped", source_key), load)

    def first_mapped_step(self, source_key: str, episode: str) -> int:
        """The first step of ``episode`` that has a decoded map in ``source_key`` (0 if none)."""
        present = self.decoded_maps(source_key, episode).present
        return int(np.argmax(present)) if present.any() else 0

    def predicted_plans(self, source_key: str, episode: str) -> StepArrays:
        """Predicted plans of every step of an episode.

        Returns:
            :class:`StepArrays` with ``values: (T, H)`` int8 plan tokens (plan format).
        """
        source = self.plan_source(source_key)
        data = self.episode(episode)

        def load() -> StepArrays:
            import h5py

            index = self._row_index(
                f"plans/{source.key}", source.path, f"runs/{source.run}/row_ids"
            )
            present, positions = index.positions(data.rows)
            with h5py.File(source.path, "r") as f:
                ds = f[f"runs/{source.run}/plans"]
                plans = _read_positions(ds, positions)
                horizon = ds.shape[1]
            values = np.zeros((len(data.rows), horizon), dtype=np.int8)
            values[present] = plans
            return StepArrays(values=values, present=present)

        return self._array_cache.get(("plans", source_key, episode), load)

    # -- run-level summaries ------------------------------------------------------------------

    def prefix_accuracy(self, source_key: str, *, n_bootstrap: int = 200) -> dict:
        """Prefix accuracy of one plan source against the store's plan labels.

        Uses the test split when the file stores split codes (else every row, and says so).

        Returns:
            ``{"accuracy": (T,), "ci": (2, T), "n_examples": int, "rows": "test"|"all"}``.
        """
        import h5py
        from goalprobe.probes.plan_metrics import plan_metrics, truncate_plans

        source = self.plan_source(source_key)

        def load() -> dict:
            if self._store_rows() is None or self._store_labels is None:
                raise FileNotFoundError("the activation store is missing")
            with h5py.File(source.path, "r") as f:
                group = f[f"runs/{source.run}"]
                plans = group["plans"][()]
                row_ids = group["row_ids"][()].astype(np.int64)
                split = group["split"][()] if "split" in group else None
            keep = np.ones(len(row_ids), bool) if split is None else split == 2
            n_rows = len(self._store_labels["plan"])
            keep &= (row_ids >= 0) & (row_ids < n_rows)
            rows = row_ids[keep]
            target = truncate_plans(self._store_labels["plan"][rows], plans.shape[1])
            grid_ids = self._store_labels["grid_id"][rows].astype(str)
            metrics = plan_metrics(
                plans[keep], target, grid_ids, n_bootstrap=n_bootstrap, random_state=0
            )
            return {
                "accuracy": np.asarray(metrics.prefix_accuracy),
                "ci": np.asarray(metrics.prefix_accuracy_ci),
                "n_examples": int(metrics.n_examples),
                "rows": "all" if split is None else "test",
            }

        return self._array_cache.get(("prefix", source_key), load)

    def scoring(self, name: str) -> dict | None:
        """The parsed ``scoring/belief.json`` or ``scoring/meg.json`` (None when missing)."""
        path = {"belief": self._belief_path, "meg": self._meg_path}.get(name)
        if path is None:
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: unreadable JSON ({err})") from err

    def false_belief_maps(self, per_kind: int = 1) -> list[dict]:
        """The first ``per_kind`` false-belief grids of each kind at their start state, drawn
        three ways (empty when the false_belief stage has not run).

        Returns:
            ``[{"grid_id", "kind", "true", "shown", "decoded" (None without a probe reading),
            "differs", "decoded_at" (what the probe read at the differing cells)}]``; maps are
            ``(n, n)`` ``CellType`` arrays.

        Raises:
            ValueError: the grid set or the results are unreadable.
        """
        from goalprobe.gridworld.false_belief import FALSE_BELIEF, pair_facts
        from goalprobe.gridworld.io import GridSetFormatError, read_grid_set
        from goalprobe.gridworld.text import cell_types

        grids_path, results_path = self.layout.false_belief_grids, self.layout.false_belief_results
        if not (grids_path.is_file() and results_path.is_file()):
            return []
        try:
            grids = read_grid_set(grids_path)
            results = json.loads(results_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, GridSetFormatError) as err:
            raise ValueError(f"false-belief outputs unreadable: {err}") from err
        decoding = results.get("decoding") or {}
        maps = decoding.get("maps") or {}
        cells = decoding.get("cells") or []
        out: list[dict] = []
        taken: dict[str, int] = {}
        for grid in grids:
            facts = pair_facts(grid)
            if (
                not facts
                or facts["role"] != FALSE_BELIEF
                or taken.get(facts["kind"], 0) >= per_kind
            ):
                continue
            taken[facts["kind"]] = taken.get(facts["kind"], 0) + 1
            decoded = maps.get(grid.grid_id)
            out.append(
                {
                    "grid_id": grid.grid_id,
                    "kind": facts["kind"],
                    "true": cell_types(grid),
                    "shown": cell_types(grid.shown),
                    "decoded": None if decoded is None else np.asarray(decoded, dtype=np.int64),
                    "differs": [tuple(c) for c in facts["differs"]],
                    "decoded_at": [c for c in cells if c["grid_id"] == grid.grid_id],
                }
            )
        return out

    def false_belief_episodes(self) -> FalseBeliefEpisodes | None:
        """The false_belief stage's grids, episodes and per-step decoded maps (read once).

        Returns:
            None when the stage has not run (no false-belief trajectories or grids).

        Raises:
            ValueError: a file is unreadable or its episodes name grids the grid set lacks.
        """
        with self._lock:
            if self._false_belief is None:
                try:
                    self._false_belief = (self._read_false_belief(),)
                except UnsafePathError as err:
                    raise ValueError(str(err)) from err
            return self._false_belief[0]

    def _read_false_belief(self) -> FalseBeliefEpisodes | None:
        from goalprobe.agents.trajectories import read_trajectories
        from goalprobe.gridworld.io import GridSetFormatError, read_grid_set
        from goalprobe.probes.serialization import read_step_maps

        layout = self.layout
        grids_path = self.resolve(self._relative(layout.false_belief_grids))
        traj_path = self.resolve(self._relative(layout.false_belief_trajectories))
        maps_path = self.resolve(self._relative(layout.false_belief_decoded))
        if not (grids_path.is_file() and traj_path.is_file()):
            return None
        try:
            grids = {g.grid_id: g for g in read_grid_set(grids_path)}
            episodes = {
                episode_key(e.summary.grid_id, e.summary.episode): e
                for e in read_trajectories(traj_path)
            }
        except (OSError, GridSetFormatError, TrajectoryFormatError) as err:
            raise ValueError(f"false-belief episodes unreadable: {err}") from err
        unknown = sorted({e.summary.grid_id for e in episodes.values()} - set(grids))
        if unknown:
            raise ValueError(
                f"{self._relative(layout.false_belief_trajectories)}: episodes on grids the "
                f"false-belief grid set lacks ({', '.join(unknown[:3])})"
            )
        maps: dict[tuple[str, int, int], np.ndarray] = {}
        why, label = None, ""
        if maps_path.is_file():
            try:
                step_maps = read_step_maps(maps_path)
            except (OSError, ValueError, KeyError) as err:
                raise ValueError(f"false-belief decoded maps unreadable: {err}") from err
            probs = full_class_probs(step_maps.probs, step_maps.classes.tolist())
            maps = {key: probs[i] for key, i in step_maps.index().items()}
            a = step_maps.attrs
            label = f"{_text(a.get('stage', '?'))} · layer {a.get('layer', '?')}"
        else:
            why = (
                "no decoded maps of the false-belief steps: run goalprobe demo with the probes "
                "stage (the headline probe decodes every visited state)"
            )
        return FalseBeliefEpisodes(grids, episodes, maps, why, label)

    def probe_metrics(self) -> list[dict]:
        """Test metrics recorded in the decoded-map cards, as tidy rows.

        Returns:
            ``[{"name", "group", "metric", "value", "ci_low", "ci_high", "baselines"}]`` for the
            cards that hold :func:`goalprobe.probes.metrics.evaluate_cell_maps` output (``models`` ->
            metric -> ``{value, ci_low, ci_high}``); the model named ``probe`` (else the first)
            is used; ``baselines`` holds the controls the sweep scored beside it (majority,
            size and size-density priors, shuffled labels; :func:`baseline_values`).
        """
        rows = []
        for source in self.map_sources.values():
            models = _find_models(source.card.get("metrics"))
            if not models:
                continue
            model = models.get("probe") or next(iter(models.values()))
            for metric in ("accuracy", "accuracy_no_padding", "agent_top1", "goal_top1"):
                entry = model.get(metric)
                if isinstance(entry, dict) and isinstance(entry.get("value"), int | float):
                    rows.append(
                        {
                            "name": f"{source.family} L{source.layer}",
                            "group": source.stage,
                            "metric": metric,
                            "value": float(entry["value"]),
                            "ci_low": entry.get("ci_low"),
                            "ci_high": entry.get("ci_high"),
                            "baselines": baseline_values(models, metric),
                        }
                    )
        return rows

    # -- patching -----------------------------------------------------------------------------

    def patching_records(self, episode: str, step: int) -> list[dict]:
        """Patching records whose base is this step (``base_id`` run/grid/episode/step)."""
        info = self.episode_info(episode)
        if self._patching_path is None or self.header is None:
            return []
        with self._lock:
            if self._patching is None:
                self._patching = _index_patching(self._patching_path)
        base_id = f"{self.header.run_id}/{info.grid_id}/{info.episode}/{int(step)}"
        return list(self._patching.get(base_id, []))


def _plan_runs(f) -> list[str]:
    """Names of the groups under ``runs/`` that hold a ``plans`` dataset, sorted."""
    import h5py

    runs: list[str] = []

    def visit(name: str, obj) -> None:
        if isinstance(obj, h5py.Group) and "plans" in obj:
            runs.append(name)

    if "runs" in f:
        f["runs"].visititems(visit)
    return sorted(runs)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _plan_source(
    key: str, path: Path, run: str, attrs: dict, card: dict, has_split: bool
) -> PlanSource:
    """Stage, layer and capacity of a plan run: file attributes, then the card, then its name."""
    provenance = card.get("provenance") or {}
    params = card.get("hyperparameters") or {}
    named = _PLAN_RUN_RE.match(run)
    stage = attrs.get("stage", provenance.get("stage", named and named["stage"]))
    layer = attrs.get("layer", provenance.get("layer", named and named["layer"]))
    kind = provenance.get("kind", named["kind"] if named else "decoder")
    n_layers = attrs.get("n_layers", params.get("n_layers", named and named["n"]))
    if stage is None or layer is None:
        raise ValueError(f"run {run!r}: stage and layer are not recorded")
    return PlanSource(
        key=key,
        path=path,
        run=run,
        stage=canonical_stage(_text(stage)),
        layer=int(layer),
        kind=_text(kind),
        n_layers=int(n_layers) if n_layers not in (None, "") else None,
        has_split=has_split,
    )


def _find_models(metrics: Any) -> dict | None:
    """The ``models`` mapping of an evaluate_cell_maps result, searched one level down."""
    if not isinstance(metrics, dict):
        return None
    if isinstance(metrics.get("models"), dict):
        return metrics["models"]
    for value in metrics.values():
        if isinstance(value, dict) and isinstance(value.get("models"), dict):
            return value["models"]
    return None


def _index_patching(path: Path) -> dict[str, list[dict]]:
    """base_id -> records of a patching bundle (JSON with ``records``, or the records CSV)."""
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            records = [_csv_record(r) for r in csv.DictReader(fh)]
    else:
        try:
            bundle = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON (line {err.lineno}): {err.msg}") from err
        records = bundle.get("records") if isinstance(bundle, dict) else bundle
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected a list of records or an object with 'records'")
    out: dict[str, list[dict]] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("base_id"), str):
            raise ValueError(f"{path}: record {i} has no string field 'base_id'")
        out.setdefault(record["base_id"], []).append(record)
    return out


_CSV_FLOATS = ("ld_target", "ld_source", "ld_patched", "recovered")
_CSV_BOOLS = ("action_changed", "into_source_optimal", "in_target_optimal")


def _csv_record(row: dict) -> dict:
    out: dict[str, Any] = dict(row)
    for name in _CSV_FLOATS:
        if name in out:
            out[name] = float(out[name]) if out[name] not in ("", None) else math.nan
    for name in _CSV_BOOLS:
        if name in out:
            out[name] = str(out[name]).lower() == "true"
    return out
