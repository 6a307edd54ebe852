"""The report's view of a run directory: cached JSON reads through :class:`RunLayout`.

A missing or unreadable file raises :class:`MissingInput`, whose message names the file
relative to the run directory; a section turns it into a "not run" box.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from goalprobe.run_layout import RunLayout


class MissingInput(Exception):
    """A section's input is absent; the message says which file and why."""


class RunReader:
    """Cached JSON reads of the run directory ``root``; every path comes from its ``layout``."""

    def __init__(self, root: str | Path) -> None:
        self.layout = RunLayout(Path(root))
        self.root: Path = self.layout.root
        self._cache: dict[Path, Any] = {}

    def json(self, path: Path) -> Any:
        """The parsed JSON file ``path`` (a layout path); :class:`MissingInput` when absent or
        unreadable."""
        if path not in self._cache:
            relative = self.layout.relative(path)
            if not path.is_file():
                raise MissingInput(f"{relative} not found")
            try:
                self._cache[path] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as err:
                raise MissingInput(f"{relative} is unreadable: {err}") from err
        return self._cache[path]

    def optional_json(self, path: Path) -> Any | None:
        """:meth:`json` of ``path``, or None where it is absent or unreadable."""
        try:
            return self.json(path)
        except MissingInput:
            return None

    def stage_record(self, stage: str) -> dict | None:
        """The record of a finished stage, or None."""
        return self.optional_json(self.layout.stage_record(stage))

    def stage_failure(self, stage: str) -> str | None:
        """Why a stage failed or did not run, or None."""
        failure = self.optional_json(self.layout.stage_failure(stage))
        return None if failure is None else failure.get("error")

    def cell_sweeps(self) -> dict[str, dict]:
        """Cell-type probe sweeps by file stem (``cell_<family>``; :class:`MissingInput`: none)."""
        sweeps = {p.stem: self.json(p) for p in self.layout.cell_probe_sweeps()}
        if not sweeps:
            where = self.layout.relative(self.layout.probe_sweeps)
            raise MissingInput(f"{where}/cell_*.json not found")
        return sweeps

    def distance_sweeps(self) -> dict[str, dict]:
        """Goal-distance sweeps by file stem (empty when there is none)."""
        return {p.stem: self.json(p) for p in self.layout.distance_sweep_files()}


def metric(run_metrics: Mapping, model: str, name: str) -> dict | None:
    """``run_metrics["models"][model][name]`` (a ``{value, ci_low, ci_high}`` stat) or None."""
    return run_metrics.get("models", {}).get(model, {}).get(name)


def best_cell_run(sweeps: Mapping[str, dict]) -> tuple[str, dict]:
    """The cell-probe run with the highest accuracy on grid cells: ``(name, run)``
    (:class:`MissingInput` when no run has one)."""
    best, best_name, value = None, "", -1.0
    for sweep in sweeps.values():
        for r in sweep["runs"]:
            v = (metric(r["metrics"], "probe", "accuracy_no_padding") or {}).get("value")
            if v is not None and v > value:
                best, best_name, value = r, r["name"], v
    if best is None:
        raise MissingInput("no cell-probe run has an accuracy")
    return best_name, best
