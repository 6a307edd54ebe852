"""Trajectory JSONL: the versioned record of every rollout step, written by ``goalprobe rollout``.

Schema ``goalprobe.trajectory/2`` (docs/formats.md): UTF-8 JSON Lines, each object with
``"schema"`` and a ``"kind"``: ``"run"`` (the first line: ``run_id``, ``config``, ``backend``,
``package_version``, ``prompt_coverage``; a rerun with another ``run_id`` is refused),
``"step"`` (:class:`StepRecord`: the state shown, ``pi*(s_t)``, the exact prompt and generated
token ids, reasoning, answer, parsed action and rejected attempts; ``grid_text`` is the grid the
prompt drew, ``true_grid_text`` the true one where they differ) and ``"episode"``
(:class:`EpisodeSummary`, after its steps). A step cut off by the token limit carries the flag
``"truncated"`` and ends its episode (``end_reason: "truncated"``).

An episode is appended as one block (flush and fsync) when it ends; readers use only episodes
with a summary line, and :func:`open_for_resume` cuts an incomplete tail. Coordinates are
``[row, col]``, actions their names, ``episode`` and ``step`` 0-based; ``(grid_id, episode)``
identifies an episode within a run.

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
    iter_records,
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
    "iter_records",
    "open_for_resume",
    "parse_record",
    "read_indexed_episode",
    "read_run_header",
    "read_steps",
    "read_trajectories",
    "record_to_json",
    "trajectory_stats",
]
