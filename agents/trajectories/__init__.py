"""Trajectory JSONL: the versioned record of every rollout step, written by ``goalprobe rollout``
(schema ``goalprobe.trajectory/2``; lines, fields, resuming and truncation: docs/formats.md).

Modules: :mod:`.records` (line records and validation), :mod:`.reading` (whole files),
:mod:`.index` (random access by byte offset), :mod:`.writing` (appending, resuming).
"""

from goalprobe.agents.trajectories.index import (
    EpisodeSpan,
    TrajectoryIndex,
    index_trajectories,
    read_indexed_episode,
)
from goalprobe.agents.trajectories.reading import (
    TrajectoryStats,
    read_run_header,
    read_steps,
    read_trajectories,
    trajectory_stats,
)
from goalprobe.agents.trajectories.records import (
    SCHEMA,
    Attempt,
    Episode,
    EpisodeSummary,
    Record,
    RunHeader,
    StepRecord,
    TokenIdsSource,
    TrajectoryFormatError,
    TruncatedLineWarning,
    parse_record,
    record_to_json,
)
from goalprobe.agents.trajectories.writing import append_episode, open_for_resume

__all__ = [
    "SCHEMA",
    "Attempt",
    "Episode",
    "EpisodeSpan",
    "EpisodeSummary",
    "Record",
    "RunHeader",
    "StepRecord",
    "TokenIdsSource",
    "TrajectoryFormatError",
    "TrajectoryIndex",
    "TrajectoryStats",
    "TruncatedLineWarning",
    "append_episode",
    "index_trajectories",
    "open_for_resume",
    "parse_record",
    "read_indexed_episode",
    "read_run_header",
    "read_steps",
    "read_trajectories",
    "record_to_json",
    "trajectory_stats",
]
