"""Random access to the episodes of a trajectory file: a byte-offset index, then one episode.

:func:`index_trajectories` scans a file once: the run line and every summary line are parsed
and validated (:func:`~goalprobe.agents.trajectories.records.parse_record`, so both schema
versions are read); step lines are only located (a prefix match on the schema and kind,
falling back to decoding the line). :func:`read_indexed_episode` then reads one episode's step
lines by their byte range and validates each. Only finished episodes (with a summary line) are
indexed; a truncated final line (an interrupted writer) is ignored.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from goalprobe.agents.trajectories.records import (
    SCHEMA,
    Episode,
    EpisodeSummary,
    RunHeader,
    StepRecord,
    TrajectoryFormatError,
    parse_record,
)

_KIND_RE = re.compile(
    rb'^\{"schema":"' + re.escape(SCHEMA.encode()) + rb'","kind":"(run|step|episode)"'
)
"""The start of a line as :func:`~goalprobe.agents.trajectories.records.record_to_json` writes
it: tells a step line from the others without decoding it."""


@dataclass(frozen=True)
class EpisodeSpan:
    """Where one finished episode lies in its trajectory file: its validated summary, the
    1-based line of its first step line, and the byte range of its step and summary lines."""

    summary: EpisodeSummary
    first_line: int
    start: int
    end: int


@dataclass(frozen=True)
class TrajectoryIndex:
    """The run line and the finished episodes (one span each) of a trajectory file, in file
    order."""

    path: Path
    header: RunHeader
    episodes: tuple[EpisodeSpan, ...]


def index_trajectories(path: str | os.PathLike) -> TrajectoryIndex:
    """Byte ranges of every finished episode of a trajectory file; summaries are validated.

    Raises:
        TrajectoryFormatError: a run or summary line breaks the schema, a line is not JSON,
            the first line is not the run line, or an episode repeats (file and line named).
    """
    path = Path(path)
    header: RunHeader | None = None
    spans: list[EpisodeSpan] = []
    seen: set[tuple[str, int]] = set()
    block_start, block_line, offset = 0, 1, 0
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
                header = record
            elif isinstance(record, EpisodeSummary):
                if record.key in seen:
                    raise TrajectoryFormatError(
                        f"{path}:{number}: episode {record.grid_id}:{record.episode} repeats"
                    )
                seen.add(record.key)
                spans.append(EpisodeSpan(record, block_line, block_start, offset))
            block_start, block_line = offset, number + 1
    if header is None:
        raise TrajectoryFormatError(f"{path}:1: the file does not start with a 'run' line")
    return TrajectoryIndex(path, header, tuple(spans))


def read_indexed_episode(path: str | os.PathLike, span: EpisodeSpan) -> Episode:
    """One episode of an indexed file: its step lines read by byte range and validated.

    Raises:
        TrajectoryFormatError: a step line breaks the schema or does not continue the episode,
            or the number of step lines disagrees with the summary (file and line named).
    """
    path = Path(path)
    summary = span.summary
    name = f"{summary.grid_id}:{summary.episode}"
    with path.open("rb") as fh:
        fh.seek(span.start)
        block = fh.read(span.end - span.start)
    steps = []
    for i, raw in enumerate(block.splitlines()[:-1]):
        where = f"{path}:{span.first_line + i}"
        try:
            record = parse_record(json.loads(raw), where)
        except json.JSONDecodeError as err:
            raise TrajectoryFormatError(f"{where}: not valid JSON ({err})") from err
        if not isinstance(record, StepRecord):
            raise TrajectoryFormatError(f"{where}: expected a step line of episode {name}")
        if (record.grid_id, record.episode, record.step) != (summary.grid_id, summary.episode, i):
            raise TrajectoryFormatError(
                f"{where}: step line ({record.grid_id}, {record.episode}, step {record.step}) "
                f"does not continue episode {name} at step {i}"
            )
        steps.append(record)
    if len(steps) != summary.length:
        raise TrajectoryFormatError(
            f"{path}:{span.first_line}: episode {name} has {len(steps)} step lines, its summary "
            f"says {summary.length}"
        )
    return Episode(tuple(steps), summary)
