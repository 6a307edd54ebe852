"""Reading trajectory files whole: every record in order, finished episodes, counts.

A truncated final line (a killed writer) is reported with a :class:`TruncatedLineWarning` and
skipped; steps of an episode without its summary line are ignored with a warning. Every line is
validated by :func:`~goalprobe.agents.trajectories.records.parse_record`; random access to one
episode is :mod:`goalprobe.agents.trajectories.index`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from goalprobe.agents.trajectories.records import (
    Episode,
    Record,
    RunHeader,
    StepRecord,
    TrajectoryFormatError,
    TruncatedLineWarning,
    parse_record,
)


@dataclass(frozen=True)
class _Line:
    number: int  # 1-based
    end_offset: int  # byte offset just after the line
    record: Record


def _warn_truncated(message: str) -> None:
    warnings.warn(message, TruncatedLineWarning, stacklevel=4)


def _scan(path: Path, on_truncated: Callable[[str], None] = _warn_truncated) -> Iterator[_Line]:
    """Validated records of ``path``; a truncated final line is reported and skipped."""
    offset = 0
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            offset += len(raw)
            where = f"{path}:{number}"
            complete = raw.endswith(b"\n")
            if not raw.strip():
                if complete:
                    raise TrajectoryFormatError(f"{where}: empty line")
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                if not complete:
                    on_truncated(
                        f"{where}: final line is truncated ({len(raw)} bytes without a newline; "
                        "the writing run was probably interrupted); ignoring it"
                    )
                    return
                raise TrajectoryFormatError(f"{where}: not valid JSON ({err})") from err
            yield _Line(number, offset, parse_record(obj, where))


class _EpisodeAssembler:
    """Groups step lines into episodes and checks that every episode is well formed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: RunHeader | None = None
        self.pending: list[StepRecord] = []
        self.pending_first_line = 0
        self.seen: set[tuple[str, int]] = set()

    def feed(self, line: _Line) -> Episode | None:
        record, where = line.record, f"{self.path}:{line.number}"
        if isinstance(record, RunHeader):
            if line.number != 1:
                raise TrajectoryFormatError(f"{where}: a 'run' line may only be the first line")
            self.header = record
            return None
        if self.header is None:
            raise TrajectoryFormatError(f"{where}: the file does not start with a 'run' line")
        if record.run_id != self.header.run_id:
            raise TrajectoryFormatError(
                f"{where}: run_id {record.run_id!r} differs from the header's "
                f"{self.header.run_id!r}"
            )
        if isinstance(record, StepRecord):
            if self.pending and record.key != self.pending[0].key:
                raise TrajectoryFormatError(
                    f"{where}: step of episode {record.key} starts before episode "
                    f"{self.pending[0].key} (line {self.pending_first_line}) has its summary line"
                )
            if record.step != len(self.pending):
                raise TrajectoryFormatError(
                    f"{where}: field 'step' is {record.step}, expected {len(self.pending)}"
                )
            if not self.pending:
                self.pending_first_line = line.number
            self.pending.append(record)
            return None
        key = record.key
        if key in self.seen:
            raise TrajectoryFormatError(f"{where}: episode {key} appears twice")
        steps = tuple(self.pending)
        if any(s.key != key for s in steps):
            raise TrajectoryFormatError(
                f"{where}: summary of {key} follows another episode's steps"
            )
        if len(steps) != record.length:
            raise TrajectoryFormatError(
                f"{where}: field 'length' is {record.length} but {len(steps)} step lines precede it"
            )
        if sum(not s.valid and not s.truncated for s in steps) != record.invalid_steps:
            raise TrajectoryFormatError(
                f"{where}: field 'invalid_steps' disagrees with the step lines"
            )
        self.seen.add(key)
        self.pending = []
        return Episode(steps, record)


def read_run_header(path: str | os.PathLike) -> RunHeader:
    """The ``run`` line of a trajectory file."""
    path = Path(path)
    for line in _scan(path):
        if isinstance(line.record, RunHeader):
            return line.record
        break
    raise TrajectoryFormatError(f"{path}:1: the file does not start with a 'run' line")


def read_trajectories(path: str | os.PathLike) -> Iterator[Episode]:
    """The finished episodes of a trajectory file, in file order, validated.

    Steps of an episode without a summary line (an interrupted run) are reported with a warning
    and ignored; so is a truncated final line.
    """
    path = Path(path)
    assembler = _EpisodeAssembler(path)
    for line in _scan(path):
        episode = assembler.feed(line)
        if episode is not None:
            yield episode
    if assembler.pending:
        warnings.warn(
            f"{path}:{assembler.pending_first_line}: episode {assembler.pending[0].key} "
            f"has {len(assembler.pending)} step line(s) but no summary line (interrupted run); "
            "ignoring it",
            TruncatedLineWarning,
            stacklevel=2,
        )


def read_steps(path: str | os.PathLike) -> Iterator[StepRecord]:
    """The step records of every finished episode (see :func:`read_trajectories`)."""
    for episode in read_trajectories(path):
        yield from episode.steps


@dataclass(frozen=True)
class TrajectoryStats:
    """What a whole pass over a trajectory file found (finished episodes only): the largest
    token id of their prompts and generations (-1 when none) and where it is
    (``file:line: step t of episode e on grid g``)."""

    path: Path
    run_id: str
    episodes: int
    steps: int
    max_token_id: int
    max_token_at: str

    def check_nonempty(self) -> None:
        """Raise :class:`TrajectoryFormatError` when the file holds no finished episode."""
        if not self.episodes:
            raise TrajectoryFormatError(
                f"{self.path}: holds no finished episode (empty, header only, or every episode "
                "interrupted); nothing to read"
            )

    def check_vocabulary(self, vocab_size: int) -> None:
        """Raise :class:`TrajectoryFormatError` (naming file, line and step) when a token id
        is outside a vocabulary of ``vocab_size`` ids (the file was written for another
        model)."""
        if self.max_token_id >= vocab_size:
            raise TrajectoryFormatError(
                f"{self.max_token_at}: token id {self.max_token_id} is outside the model's "
                f"vocabulary of {vocab_size} ids (the file was written with another tokenizer)"
            )


def trajectory_stats(path: str | os.PathLike) -> TrajectoryStats:
    """Validate a whole trajectory file and count its finished episodes and steps
    (``TrajectoryFormatError`` also for a file without a 'run' line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trajectory file")
    if path.stat().st_size == 0:
        raise TrajectoryFormatError(f"{path}: the file is empty (no 'run' line, no episodes)")
    assembler = _EpisodeAssembler(path)
    episodes = steps = 0
    best, best_at = -1, ""
    for line in _scan(path, on_truncated=lambda message: None):
        episode = assembler.feed(line)
        if episode is None:
            continue
        episodes += 1
        steps += len(episode.steps)
        first_line = line.number - len(episode.steps)
        for i, step in enumerate(episode.steps):
            ids = [*step.prompt_token_ids, *step.generated_token_ids]
            for attempt in step.rejected_attempts:
                ids.extend(attempt.generated_token_ids)
            if max(ids, default=-1) > best:
                best = max(ids)
                best_at = (
                    f"{path}:{first_line + i}: step {step.step} of episode {step.episode} on "
                    f"grid {step.grid_id!r}"
                )
    if assembler.header is None:
        raise TrajectoryFormatError(f"{path}:1: the file does not start with a 'run' line")
    return TrajectoryStats(path, assembler.header.run_id, episodes, steps, best, best_at)
