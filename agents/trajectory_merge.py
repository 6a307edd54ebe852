"""Join the trajectory files of one rollout run's shards (``goalprobe rollout --shard i/N``).

Episodes are independent of the shard they ran in (each has its own seed, derived from the run
seed, its grid and its index), so the shards of one run hold, together, exactly the episodes of
the unsharded run. The merged file has the run's header (same run id) and every episode once,
in ``(grid_id, episode)`` order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from goalprobe.agents.trajectories import (
    Episode,
    TrajectoryFormatError,
    append_episode,
    open_for_resume,
    read_run_header,
    read_trajectories,
)


def merge_trajectory_files(shards: Sequence[str | os.PathLike], out: str | os.PathLike) -> int:
    """Write the episodes of ``shards`` (one run's trajectory files) into ``out`` (written beside
    it and renamed into place when complete); returns the number of episodes written.

    Raises:
        TrajectoryFormatError: the files hold different runs, or an episode appears twice.
        ValueError: no shard given.
    """
    if not shards:
        raise ValueError("no trajectory files to merge")
    paths = [Path(s) for s in shards]
    headers = [read_run_header(p) for p in paths]
    for path, header in zip(paths, headers, strict=True):
        if header.run_id != headers[0].run_id:
            raise TrajectoryFormatError(
                f"{path} holds run {header.run_id!r}, {paths[0]} run {headers[0].run_id!r}: "
                "only the shards of one run merge"
            )
    episodes: dict[tuple[str, int], tuple[Path, Episode]] = {}
    for path in paths:
        for episode in read_trajectories(path):
            if episode.key in episodes:
                raise TrajectoryFormatError(
                    f"episode {episode.key} is in both {episodes[episode.key][0]} and {path}"
                )
            episodes[episode.key] = (path, episode)
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    open_for_resume(partial, headers[0])
    for key in sorted(episodes):
        episode = episodes[key][1]
        append_episode(partial, list(episode.steps), episode.summary)
    os.replace(partial, out)
    return len(episodes)
