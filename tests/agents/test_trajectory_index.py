"""Random access to a trajectory file (goalprobe.agents.trajectories): the byte-offset
index and one episode read by its span agree with the whole-file reader, and the index refuses
what the reader refuses."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from goalprobe.agents.prompt_states import PromptStatesConfig, write_prompt_states
from goalprobe.agents.trajectories import (
    SCHEMA,
    TrajectoryFormatError,
    append_episode,
    index_trajectories,
    read_indexed_episode,
    read_run_header,
    read_trajectories,
)
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set


@pytest.fixture(scope="module")
def trajectory(tmp_path_factory):
    """A real trajectory file: prompt-only one-step episodes, then three-step episodes built
    from them with the writer (so byte ranges span several lines)."""
    grids = generate_grid_set(
        GridSetConfig(sizes=(7,), densities=(0.2,), n_per_cell=3, seed=5, min_distance=3)
    )
    path = tmp_path_factory.mktemp("traj") / "trajectories.jsonl"
    write_prompt_states(
        grids,
        lambda messages, effort: [7, 8, 9],
        PromptStatesConfig(states_per_grid=2),
        path,
        backend_description={"test": "fixed encoder"},
    )
    for episode in list(read_trajectories(path))[:2]:
        s = episode.summary
        steps = [replace(episode.steps[0], episode=s.episode + 10, step=t) for t in range(3)]
        summary = replace(
            s, episode=s.episode + 10, length=3, invalid_steps=sum(not x.valid for x in steps)
        )
        append_episode(path, steps, summary)
    return path


def test_the_index_agrees_with_the_whole_file_reader(trajectory):
    index = index_trajectories(trajectory)
    episodes = list(read_trajectories(trajectory))
    assert index.header == read_run_header(trajectory)
    assert [span.summary for span in index.episodes] == [e.summary for e in episodes]
    assert max(span.summary.length for span in index.episodes) == 3
    for span, episode in zip(index.episodes, episodes, strict=True):
        assert read_indexed_episode(trajectory, span) == episode
    lines = trajectory.read_bytes().splitlines(keepends=True)
    last = index.episodes[-1]
    assert last.end == len(trajectory.read_bytes())
    assert sum(len(x) for x in lines[: last.first_line - 1]) == last.start


def test_a_version_1_file_is_refused(trajectory, tmp_path):
    old = tmp_path / "v1.jsonl"
    old.write_text(trajectory.read_text().replace(SCHEMA, "goalprobe.trajectory/1"))
    with pytest.raises(TrajectoryFormatError, match="trajectory/1"):
        index_trajectories(old)


def test_a_truncated_final_line_is_ignored(trajectory, tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(trajectory.read_bytes() + b'{"schema":"')
    assert index_trajectories(cut).episodes == index_trajectories(trajectory).episodes


def test_the_index_refuses_what_the_reader_refuses(trajectory, tmp_path):
    lines = trajectory.read_text().splitlines()
    repeated = tmp_path / "repeated.jsonl"
    repeated.write_text("\n".join([*lines, *lines[1:3]]) + "\n")
    with pytest.raises(TrajectoryFormatError, match="repeats"):
        index_trajectories(repeated)
    headless = tmp_path / "headless.jsonl"
    headless.write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(TrajectoryFormatError, match="does not start with a 'run' line"):
        index_trajectories(headless)
    other = tmp_path / "other.jsonl"
    summary = json.loads(lines[2])
    summary["schema"] = "goalprobe.trajectory/9"
    other.write_text("\n".join([lines[0], lines[1], json.dumps(summary), *lines[3:]]) + "\n")
    with pytest.raises(TrajectoryFormatError, match=r"other.jsonl:3: schema"):
        index_trajectories(other)


def test_a_step_line_that_does_not_continue_its_episode_is_refused(trajectory, tmp_path):
    index = index_trajectories(trajectory)
    span = index.episodes[-1]
    lines = trajectory.read_text().splitlines()
    step = json.loads(lines[span.first_line])  # the episode's second step line
    step["step"] = 2
    lines[span.first_line] = json.dumps(step, separators=(",", ":"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    spans = index_trajectories(broken).episodes
    with pytest.raises(TrajectoryFormatError, match="does not continue episode"):
        read_indexed_episode(broken, spans[-1])
