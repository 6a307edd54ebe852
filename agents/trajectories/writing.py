"""Writing trajectory files: one durable append per finished episode, and resuming a file.

An episode is written as one block (its steps then its summary) with a single append, flush and
fsync once it ends. :func:`open_for_resume` cuts an incomplete tail off an existing file (saying
so) and reports the finished episodes so that the rollout skips them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from goalprobe.agents.trajectories.reading import _EpisodeAssembler, _scan
from goalprobe.agents.trajectories.records import (
    EpisodeSummary,
    RunHeader,
    StepRecord,
    TrajectoryFormatError,
    TruncatedLineWarning,
    record_to_json,
)


def open_for_resume(path: str | os.PathLike, header: RunHeader) -> set[tuple[str, int]]:
    """Prepare ``path`` for appending the episodes of the run described by ``header``.

    A missing or empty file gets the header line. An existing file must hold the same
    ``run_id``; a tail after its last complete episode (steps of an interrupted episode, a
    truncated line) is cut off with a warning saying how many bytes were dropped. Returns the
    ``(grid_id, episode)`` keys of the episodes already finished in the file;
    ``TrajectoryFormatError`` when it belongs to another run or is corrupt before its tail.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        _append(path, record_to_json(header))
        return set()
    assembler = _EpisodeAssembler(path)
    good_end = 0
    finished: set[tuple[str, int]] = set()
    notes: list[str] = []
    for line in _scan(path, on_truncated=notes.append):
        if isinstance(line.record, RunHeader) and line.record.run_id != header.run_id:
            raise TrajectoryFormatError(
                f"{path}:{line.number}: the file holds run {line.record.run_id!r}, not "
                f"{header.run_id!r} (its rollout config differs); choose another output "
                "path or delete the file"
            )
        episode = assembler.feed(line)
        if isinstance(line.record, RunHeader) or episode is not None:
            good_end = line.end_offset
        if episode is not None:
            finished.add(episode.key)
    if assembler.pending:
        notes.append(
            f"episode {assembler.pending[0].key} has {len(assembler.pending)} step line(s) "
            f"from line {assembler.pending_first_line} but no summary"
        )
    size = path.stat().st_size
    if good_end < size:
        reasons = "; ".join(notes)
        warnings.warn(
            f"{path}: dropping {size - good_end} bytes after the last finished episode "
            f"(episodes in flight when the previous run stopped){': ' + reasons if reasons else ''}",
            TruncatedLineWarning,
            stacklevel=2,
        )
        with path.open("r+b") as fh:
            fh.truncate(good_end)
            fh.flush()
            os.fsync(fh.fileno())
    return finished


def append_episode(
    path: str | os.PathLike, steps: list[StepRecord], summary: EpisodeSummary
) -> None:
    """Append one finished episode (its steps, then its summary) as one durable write."""
    block = "".join(record_to_json(s) for s in steps) + record_to_json(summary)
    _append(Path(path), block)


def _append(path: Path, text: str) -> None:
    with path.open("ab") as fh:
        fh.write(text.encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
