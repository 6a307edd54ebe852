"""Lazy, per-episode access to a goalprobe run directory (what the viewer shows).

:class:`RunData` composes the readers of the rooms that own each format; every file may be
missing (:attr:`RunData.missing`). The parts join on ``(grid_id, episode, step)``: the store's
``/labels`` map rows to those ids, HDF5 files name store rows in ``row_ids``, a patching record
names its base in ``base_id`` (``"{run_id}/{grid_id}/{episode}/{step}"``). Opening a run
indexes the trajectory file once; an episode reads its step lines and its rows only. The
browser only sends keys, looked up in allow-lists built here (:class:`UnknownKeyError`)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.agents.trajectories import (
    EpisodeSpan,
    EpisodeSummary,
    RunHeader,
    StepRecord,
    TrajectoryFormatError,
    index_trajectories,
    read_indexed_episode,
)
from goalprobe.gridworld.core import Grid
from goalprobe.gridworld.io import index_grid_set, read_indexed_grid
from goalprobe.gridworld.text import parse
from goalprobe.probes.decision_steps import DecisionSteps, read_decision_steps
from goalprobe.viewer.figures.probes import baseline_values
from goalprobe.viewer.run_files import (
    FalseBeliefEpisodes,
    FogEpisodes,
    MapSource,
    MissingArtefact,
    PlanSource,
    RowIndex,
    RunFiles,
    UnknownKeyError,
    UnsafePathError,
    episode_key,
    episode_label,
    full_class_probs,
    read_false_belief_episodes,
    read_fog_episodes,
    scan_map_sources,
    scan_plan_sources,
)

from goalprobe.run_layout import RunLayout


@dataclass(frozen=True)
class EpisodeInfo(EpisodeSpan):
    """One finished episode of the trajectory file (its :class:`EpisodeSpan`) with ``key``,
    ``"<grid_id>:<episode>"``, its allow-list key."""

    key: str

    @property
    def grid_id(self) -> str:
        return self.summary.grid_id

    @property
    def episode(self) -> int:
        return self.summary.episode

    @property
    def label(self) -> str:
        """Short human label: grid, episode, outcome and length."""
        return episode_label(self.summary)


@dataclass(frozen=True, eq=False)
class EpisodeData:
    """Everything of one episode that does not depend on a probe: its index entry, step
    records, true grid and the store row of each step (None where the store has none)."""

    info: EpisodeInfo
    steps: tuple[StepRecord, ...]
    grid: Grid
    rows: tuple[int | None, ...]

    @property
    def summary(self) -> EpisodeSummary:
        return self.info.summary


@dataclass(frozen=True, eq=False)
class StepArrays:
    """Per-step arrays of one episode from one HDF5 source: ``values`` ``(T, ...)`` (zeros
    where ``present`` is False) and, for decoded maps, the position probes' ``(T, S, S)`` agent
    and goal read-outs (None: the cell probe's) and which read-out produced each part."""

    values: np.ndarray
    present: np.ndarray
    agent: np.ndarray | None = None
    goal: np.ndarray | None = None
    readout: Any = None

    def decoded_parts(self, t: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(probs, agent, goal)`` of step ``t`` (:func:`goalprobe.viewer.step.decoded_view`)."""
        return (
            self.values[t],
            None if self.agent is None else self.agent[t],
            None if self.goal is None else self.goal[t],
        )


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


class RunData:
    """A run directory opened for viewing (``FileNotFoundError`` when it is not a directory),
    keeping the ``episode_cache`` most recently used episodes in memory. ``episodes``,
    ``map_sources`` and ``plan_sources`` are the allow-lists (by key, in file order);
    ``header`` is the trajectory file's run header (None without trajectories)."""

    def __init__(self, run_dir: str | Path, *, episode_cache: int = 16) -> None:
        root = Path(run_dir).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"{run_dir}: not a run directory")
        self.root = root.resolve(strict=True)
        self.files = RunFiles(self.root)
        self.layout: RunLayout = self.files.layout
        self.missing: list[MissingArtefact] = self.files.missing
        self.header: RunHeader | None = None
        self.episodes: dict[str, EpisodeInfo] = {}
        self._lock = threading.Lock()
        self._paths: dict[str, Path | None] = {}
        self._episode_cache = _LRU(episode_cache)
        self._array_cache = _LRU(4 * episode_cache)
        self._read: dict[str, Any] = {}
        self._store_index: dict[tuple[str, int], dict[int, int]] | None = None
        self._store_labels: dict[str, np.ndarray] | None = None
        files, layout = self.files, self.layout
        self._artefacts(
            ("grids", "grid set", "grids are rebuilt from the trajectory's grid text"),
            ("trajectories", "trajectories", "there are no episodes to show"),
        )
        if self._paths["trajectories"] is not None:
            try:
                index = index_trajectories(self._paths["trajectories"])
            except (OSError, TrajectoryFormatError) as err:
                files.note("trajectories", layout.trajectories, str(err), "no episodes")
            else:
                self.header = index.header
                for span in index.episodes:
                    key = episode_key(span.summary.grid_id, span.summary.episode)
                    self.episodes[key] = EpisodeInfo(**vars(span), key=key)
        why = "decoded maps and predicted plans cannot be joined to steps"
        self._artefacts(("store", "activation store", why))
        self.map_sources: dict[str, MapSource] = scan_map_sources(files)
        self.plan_sources: dict[str, PlanSource] = scan_plan_sources(files)
        self._patching_path = files.first_file((layout.patch_results, layout.patch_records_csv))
        if self._patching_path is None:
            files.note("patching results", layout.patch_results, "not found", "no patching panel")
        self._artefacts(
            ("attribution", "attribution file", "no attribution panel"),
            ("belief", "belief scoring", "no policy-against-belief summary"),
            ("meg", "MEG scoring", "no MEG summary"),
            ("report", "report", "no link to the static report"),
            (
                "decision_steps",
                "decision steps",
                "the reasoning is shown without the logit lens's colours",
            ),
        )

    # -- scanning -----------------------------------------------------------------------------

    def _artefacts(self, *table: tuple[str, str, str]) -> None:
        """For each ``(layout field, name, consequence)``: the file's resolved path in
        ``_paths[field]``, or None (noted in :attr:`missing`)."""
        for field, name, consequence in table:
            self._paths[field] = self.files.artefact(getattr(self.layout, field), name, consequence)

    # -- allow-lists --------------------------------------------------------------------------

    def episode_info(self, key: str) -> EpisodeInfo:
        """The index entry of an episode key (raises :class:`UnknownKeyError`)."""
        return _allowed(self.episodes, key, "episode")

    def map_source(self, key: str) -> MapSource:
        """A decoded-map source by key (raises :class:`UnknownKeyError`)."""
        return _allowed(self.map_sources, key, "decoded-map source")

    def plan_source(self, key: str) -> PlanSource:
        """A predicted-plan source by key (raises :class:`UnknownKeyError`)."""
        return _allowed(self.plan_sources, key, "predicted-plan source")

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

        def keep(s: EpisodeSummary) -> bool:
            near = s.density is not None and any(abs(s.density - d) < 1e-6 for d in dens or ())
            return (
                (size_set is None or s.grid_size in size_set)
                and (dens is None or near)
                and (variant_set is None or s.variant in variant_set)
                and (success is None or s.success == success)
            )

        return [info for info in self.episodes.values() if keep(info.summary)]

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
        """Load one episode: its step lines, its grid and its store rows (cached). Raises
        :class:`UnknownKeyError` or ``TrajectoryFormatError`` (file and line named)."""
        info = self.episode_info(key)
        return self._episode_cache.get(("episode", key), lambda: self._load_episode(info))

    def _load_episode(self, info: EpisodeInfo) -> EpisodeData:
        assert self._paths["trajectories"] is not None
        steps = read_indexed_episode(self._paths["trajectories"], info).steps
        grid = self._grid(info, steps)
        index = self._store_rows()
        by_step = {} if index is None else index.get((info.grid_id, info.episode), {})
        rows = tuple(by_step.get(i) for i in range(len(steps)))
        return EpisodeData(info=info, steps=tuple(steps), grid=grid, rows=rows)

    def _grid(self, info: EpisodeInfo, steps: Sequence[StepRecord]) -> Grid:
        """The episode's grid: from the grid set when it holds it (indexed once), else from the
        first step."""
        path = self._paths["grids"]
        offsets = self._once("grid_offsets", lambda: {} if path is None else index_grid_set(path))
        if info.grid_id in offsets and path is not None:
            return read_indexed_grid(path, *offsets[info.grid_id])
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

    def _store_rows(self) -> dict[tuple[str, int], dict[int, int]] | None:
        """(grid_id, episode) -> {step: store row} for rows of this run (built once)."""
        from goalprobe.activations.store import ActivationStore, StoreFormatError

        with self._lock:
            if self._store_index is None and self._paths["store"] is not None:
                try:
                    with ActivationStore(self._paths["store"]) as store:
                        labels = store.labels(["run_id", "grid_id", "episode", "step", "plan"])
                except (OSError, StoreFormatError) as err:
                    note = "probe panels unavailable"
                    self.files.note("activation store", self.layout.store, str(err), note)
                    self._paths["store"] = None
                    return None
                run_id = None if self.header is None else self.header.run_id
                index: dict[tuple[str, int], dict[int, int]] = {}
                ours = labels["run_id"].astype(str) == run_id
                if len(ours) and not ours.any():
                    foreign = sorted(set(labels["run_id"].astype(str).tolist()))
                    self.files.note(
                        "activation store",
                        self.layout.store,
                        f"its rows come from trajectory run(s) {', '.join(foreign)}, not from "
                        f"this run's {run_id} (extracted from another rollout)",
                        "probe and plan panels show nothing",
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
        return next((m for m in self.missing[before:] if m.name == "activation store"), None)

    def decoded_maps(self, source_key: str, episode: str) -> StepArrays:
        """Decoded maps of every step of an episode: ``values`` ``(T, S, S, len(CellType))``
        float32 ``P(CellType(c))`` (0 for classes the probe does not predict)."""
        from goalprobe.probes.decoded_maps import (
            read_decoded_probs,
            read_decoded_readouts,
            read_decoded_row_ids,
        )

        source = self.map_source(source_key)
        data = self.episode(episode)

        def load() -> StepArrays:
            index = self._once(
                f"maps/{source.key}", lambda: RowIndex(read_decoded_row_ids(source.path))
            )
            present, positions = index.positions(data.rows)
            probs = full_class_probs(read_decoded_probs(source.path, positions), source.classes)
            *parts, readout = read_decoded_readouts(source.path, positions)
            agent, goal = (None if p is None else _spread(p, present, np.float32) for p in parts)
            return StepArrays(_spread(probs, present, np.float32), present, agent, goal, readout)

        return self._array_cache.get(("maps", source_key, episode), load)

    def episodes_with_maps(self, source_key: str) -> frozenset[str]:
        """Episode keys with at least one step in a decoded-map source (built once per source;
        maps exist only for a probe's held-out test rows, so most episodes have none)."""
        from goalprobe.probes.decoded_maps import read_decoded_row_ids

        source = self.map_source(source_key)

        def load() -> frozenset[str]:
            self._store_rows()
            labels = self._store_labels
            if labels is None or self.header is None:
                return frozenset()
            rows = read_decoded_row_ids(source.path)
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
        """Predicted plans of every step of an episode: ``values`` ``(T, H)`` int8 plan tokens."""
        from goalprobe.probes.plan_metrics import read_plan_row_ids, read_plan_rows

        source = self.plan_source(source_key)
        data = self.episode(episode)

        def load() -> StepArrays:
            index = self._once(
                f"plans/{source.key}", lambda: RowIndex(read_plan_row_ids(source.path, source.run))
            )
            present, positions = index.positions(data.rows)
            plans = read_plan_rows(source.path, source.run, positions)
            return StepArrays(values=_spread(plans, present, np.int8), present=present)

        return self._array_cache.get(("plans", source_key, episode), load)

    # -- run-level summaries ------------------------------------------------------------------

    def prefix_accuracy(self, source_key: str, *, n_bootstrap: int = 200) -> dict:
        """Prefix accuracy of one plan source against the store's plan labels (test split when
        stored): ``{"accuracy": (T,), "ci": (2, T), "n_examples": int, "rows": "test"|"all"}``."""
        from goalprobe.probes.plan_metrics import read_predicted_plans, stored_run_metrics

        source = self.plan_source(source_key)

        def load() -> dict:
            if self._store_rows() is None or self._store_labels is None:
                raise FileNotFoundError("the activation store is missing")
            stored = read_predicted_plans(source.path, source.run)
            metrics, rows = stored_run_metrics(
                stored.plans,
                stored.row_ids,
                stored.split,
                self._store_labels["plan"],
                self._store_labels["grid_id"],
                n_bootstrap=n_bootstrap,
                random_state=0,
            )
            return {
                "accuracy": np.asarray(metrics.prefix_accuracy),
                "ci": np.asarray(metrics.prefix_accuracy_ci),
                "n_examples": int(metrics.n_examples),
                "rows": rows,
            }

        return self._array_cache.get(("prefix", source_key), load)

    def scoring(self, name: str) -> dict | None:
        """The parsed ``scoring/belief.json`` or ``scoring/meg.json`` (None when missing)."""
        path = {"belief": self._paths["belief"], "meg": self._paths["meg"]}.get(name)
        if path is None:
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: unreadable JSON ({err})") from err

    def false_belief_episodes(self) -> FalseBeliefEpisodes | None:
        """The false_belief stage's grids, episodes and per-step decoded maps (read once; None
        when the stage has not run). ``ValueError``: a file is unreadable or its episodes name
        grids the grid set lacks."""
        return self._once("false_belief", lambda: read_false_belief_episodes(self.files))

    def fog_episodes(self) -> FogEpisodes | None:
        """The fog stage's grids and episodes (read once; None when the stage has not run;
        ``ValueError`` as :meth:`false_belief_episodes`)."""
        return self._once("fog", lambda: read_fog_episodes(self.files))

    def decision_steps(self) -> DecisionSteps | None:
        """The decision stage's lens per step and reasoning chunk (read once; None when the
        stage has not written it; ``ValueError``: unreadable or not of its schema)."""
        path = self._paths["decision_steps"]
        try:
            return self._once("decision", lambda: path and read_decision_steps(path))
        except OSError as err:
            raise ValueError(f"{path}: unreadable ({err})") from err

    def _once(self, name: str, read: Callable[[], Any]) -> Any:
        """``read()`` once per ``name`` (kept in ``_read``), under the lock; a file outside the
        run (:class:`UnsafePathError`) is a ``ValueError``."""
        with self._lock:
            if name not in self._read:
                try:
                    self._read[name] = read()
                except UnsafePathError as err:
                    raise ValueError(str(err)) from err
            return self._read[name]

    def probe_metrics(self) -> list[dict]:
        """Test metrics of the decoded-map cards (model ``probe``, else the first) as rows
        ``{"name", "group", "metric", "value", "ci_low", "ci_high", "baselines"}``, with the
        controls scored beside it (:func:`baseline_values`)."""
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
        from goalprobe.probes.patching.results import read_records

        base = itemgetter("base_id")
        return self._by_base("patching", self._patching_path, read_records, base, episode, step)

    # -- attribution --------------------------------------------------------------------------

    def attribution_records(self, episode: str, step: int) -> list:
        """Attribution records (:class:`~goalprobe.probes.attribution.PairAttribution`) whose
        pair's base is this step (``RUN/attribution/``; a pair id is ``{base_id}/{move}``)."""
        from goalprobe.probes.attribution import read_attributions

        path = self._paths["attribution"]
        records, base = lambda p: read_attributions(p)[0], lambda r: r.pair_id.rsplit("/", 1)[0]
        return self._by_base("attribution", path, records, base, episode, step)

    def _by_base(self, name, path: Path | None, read: Callable, base_of: Callable, episode, step):
        """The records of ``read(path)`` whose base (``base_of(record)``) is this step, grouped
        by base once (:meth:`_once` under ``name``); none without the file or header."""
        info = self.episode_info(episode)
        if path is None or self.header is None:
            return []

        def group() -> dict[str, list]:
            by_base: dict[str, list] = {}
            for record in read(path):
                by_base.setdefault(base_of(record), []).append(record)
            return by_base

        base_id = f"{self.header.run_id}/{info.grid_id}/{info.episode}/{int(step)}"
        return list(self._once(name, group).get(base_id, []))


def _spread(part: np.ndarray, present: np.ndarray, dtype) -> np.ndarray:
    """``part``'s rows at the True entries of ``present`` (zeros elsewhere), as ``dtype``."""
    out = np.zeros((len(present), *np.shape(part)[1:]), dtype=dtype)
    out[present] = part
    return out


def _allowed(table: dict[str, Any], key: Any, what: str) -> Any:
    """``table[key]``, or :class:`UnknownKeyError` for a key not in the allow-list."""
    if not isinstance(key, str) or key not in table:
        raise UnknownKeyError(f"unknown {what} {key!r}")
    return table[key]


def _find_models(metrics: Any) -> dict | None:
    """The ``models`` mapping of an evaluate_cell_maps result, searched one level down."""
    if not isinstance(metrics, dict):
        return None
    for value in (metrics, *metrics.values()):
        if isinstance(value, dict) and isinstance(value.get("models"), dict):
            return value["models"]
    return None
