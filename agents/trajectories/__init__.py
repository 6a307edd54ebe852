"""Trajectory JSONL: the versioned record of every rollout step, written by ``goalprobe rollout``.

Schema ``goalprobe.trajectory/2`` (``/1`` never shipped and is not read). A file is UTF-8
JSON Lines; every line is one JSON object carrying ``"schema": "goalprobe.trajectory/2"`` and a
``"kind"``:

* ``"run"``: the first line, once. ``run_id``, ``config`` (the rollout config, JSON),
  ``backend`` (what generated the text: backend class, model, ...), ``package_version``, and
  ``prompt_coverage`` (added in ``/3``: the share of unknown tokens in the grids and in the
  instructions of the run's prompts under the agent's tokenizer, see
  :mod:`goalprobe.agents.coverage`; ``null`` without a tokenizer to ask).
  A rerun with the same ``run_id`` resumes the file; another ``run_id`` is refused.
* ``"step"``: one line per step ``t`` of an episode (field list: :class:`StepRecord`): the state
  ``s_t`` shown to the agent (grid text, agent/goal/key/door ``(row, col)``, ``has_key``,
  ``door_open``), the optimal action set ``pi*(s_t)`` and distance to the goal, the exact token
  ids of the prompt and of the generated text, the reasoning and final text, the parsed action
  (``null`` when invalid), and every rejected attempt before it. ``grid_text`` is the grid the
  prompt drew; on a false-belief grid (:attr:`goalprobe.gridworld.core.Grid.shown`) that is the
  shown grid, the *oracle belief*, and ``true_grid_text`` (added in ``/2``) is the true grid's
  text in ``s_t`` (``null`` when the prompt drew the true grid).
* ``"episode"``: one line per episode after its steps (field list: :class:`EpisodeSummary`):
  success, length, invalid steps, horizon, shortest path length, final state.

A step whose generation was cut off by the token limit carries the flag ``"truncated"`` (no
action, not counted in ``invalid_steps``) and ends its episode with ``end_reason:
"truncated"`` (added without a version change: files that have none read as before).

An episode is written as one block (its steps then its summary) with a single append, flush and
fsync once it ends, so it is either complete or the tail of an interrupted file. Readers use
only episodes whose summary line exists; the writer's resume (:func:`open_for_resume`) cuts an
incomplete tail off the file (saying so) and reports the finished episodes so they are skipped.

Conventions: coordinates are ``[row, col]``; actions are names ``"UP"``, ``"DOWN"``, ``"LEFT"``,
``"RIGHT"`` (:class:`~goalprobe.gridworld.core.Action`); ``episode`` is the episode's index on
its grid (0-based) and ``step`` the step index ``t`` (0-based); an episode is identified by
``(grid_id, episode)`` within a run.

Modules, one concept each: :mod:`~goalprobe.agents.trajectories.records` (the line records,
the schema strings and their validation), :mod:`~goalprobe.agents.trajectories.reading` (whole
files: records, episodes, counts), :mod:`~goalprobe.agents.trajectories.index` (random access:
a byte-offset index of the episodes, then one episode), :mod:`~goalprobe.agents.trajectories.writing`
(appending episodes, resuming a file). Their public names are imported from here.
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
