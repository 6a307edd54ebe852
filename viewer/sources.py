"""The probe outputs the viewer can show: decoded-map sources (one file per probe x stage x
layer) and predicted-plan sources (one run of a file per decoder x stage x layer), whose keys are
the allow-lists, and :class:`RowIndex` to find an episode's rows in their ``row_ids``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.probes.decoded_maps import read_decoded_maps_info
from goalprobe.probes.predicted_plans import read_plan_runs
from goalprobe.viewer.run_files import RunFiles

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


def canonical_stage(stage: str) -> str:
    """Map ``pre``/``post``/``pre_reasoning``/... onto the store's stage names."""
    try:
        return _STAGE_ALIASES[str(stage)]
    except KeyError:
        raise ValueError(
            f"unknown stage {stage!r}; expected one of {sorted(_STAGE_ALIASES)}"
        ) from None


def stage_rank(stage: str) -> int:
    """Sort key of a stage: the canonical stages in order, then any other."""
    return STAGES.index(stage) if stage in STAGES else len(STAGES)


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
