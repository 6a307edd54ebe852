"""The files of a run directory as the viewer may open them: every file opened must resolve
inside the run directory (:class:`UnsafePathError`: a symbolic link elsewhere is refused), and
each expected file that is absent or unreadable is recorded as a :class:`MissingArtefact`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

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
    from goalprobe.gridworld.io import GridSetFormatError, read_grid_set

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
