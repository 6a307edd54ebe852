"""Rollouts with a real (tiny, random) GPT-OSS: invalid output, trajectory JSONL, resume, seeds."""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from agent_fixtures import SHORT_TEMPLATES, build_tiny_backend
from goalprobe.agents.backend import Completion
from goalprobe.agents.rollout import RolloutConfig, derive_seed, describe_backend, run_rollouts
from goalprobe.agents.trajectories import (
    SCHEMA,
    TrajectoryFormatError,
    TruncatedLineWarning,
    read_run_header,
    read_steps,
    read_trajectories,
)
from goalprobe.gridworld.core import Grid, Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.metrics import TrajectoryData
from goalprobe.gridworld.optimal import default_horizon, solve


def key_door_grid() -> Grid:
    walls = np.ones((5, 5), dtype=bool)
    walls[1, 1:4] = False
    walls[2, 1] = walls[2, 3] = walls[3, 3] = False
    # row 1: start (1,1) ... key (1,3); door (2,3) blocks the way down to the goal (3,3)
    return Grid(
        walls=walls,
        goal=(3, 3),
        start=(1, 1),
        key=(2, 1),
        door=(2, 3),
        variant=Variant.KEY_DOOR,
        grid_id="kd-hand-0",
    )


@pytest.fixture(scope="module")
def backend():
    return build_tiny_backend()


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("templates")
    for name, text in SHORT_TEMPLATES.items():
        (directory / name).write_text(text + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def grids() -> list[Grid]:
    plain = generate_grid_set(GridSetConfig(sizes=(5,), densities=(0.0, 1.0), n_per_cell=1))
    return [*plain, key_door_grid()]


@pytest.fixture(scope="module")
def config(template_dir) -> RolloutConfig:
    return RolloutConfig(
        episodes_per_grid=2,
        horizon_steps=2,
        retries=1,
        batch_size=3,
        max_new_tokens=4,
        temperature=1.0,
        top_p=1.0,
        seed=7,
        template_dir=str(template_dir),
    )


class Stopped:
    """The real model's completions as if a stop token had ended them where the budget did:
    answers that name no action but were not cut off (the invalid-output path; the raw tiny
    model at 4 tokens is cut off, which is truncation, see the test below)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def describe(self):  # the inner backend's identity, so the run id does not change
        return describe_backend(self.inner)

    def generate(self, batch, sampling, *, seeds=None):
        return [
            replace(c, finish_reason="stop")
            for c in self.inner.generate(batch, sampling, seeds=seeds)
        ]


@pytest.fixture(scope="module")
def reference(backend, grids, config, tmp_path_factory) -> Path:
    """An uninterrupted run of ``config`` (the tiny model never names an action)."""
    out = tmp_path_factory.mktemp("reference") / "traj.jsonl"
    report = run_rollouts(grids, Stopped(backend), config, out, progress=False)
    assert report.episodes_run == len(grids) * config.episodes_per_grid
    return out


def episode_dicts(path: Path) -> dict:
    return {
        ep.key: (asdict(ep.summary), [asdict(s) for s in ep.steps])
        for ep in read_trajectories(path)
    }


# ---------------------------------------------------------------------------------------------


def test_invalid_output_is_recorded_agent_stays_and_episode_is_summarised(
    reference, grids, config, backend
):
    episodes = list(read_trajectories(reference))
    assert len(episodes) == len(grids) * config.episodes_per_grid  # none dropped
    by_id = {g.grid_id: g for g in grids}
    for episode in episodes:
        grid = by_id[episode.summary.grid_id]
        summary = episode.summary
        assert summary.length == config.horizon_steps == summary.horizon
        assert summary.invalid_steps == summary.length
        assert not summary.success and summary.end_reason == "horizon"
        assert summary.total_attempts == summary.length * (config.retries + 1)
        assert summary.final_agent_row_col == grid.start
        assert summary.shortest_path_length == solve(grid).shortest_path_length
        for t, step in enumerate(episode.steps):
            assert step.step == t
            assert step.action is None and not step.valid
            assert step.parse_error
            assert step.agent_row_col == step.next_agent_row_col == grid.start
            assert step.attempts == config.retries + 1 == len(step.rejected_attempts) + 1
            assert "invalid" in step.flags and "retried" in step.flags
            assert step.token_ids_source == "model"
            assert 0 < len(step.generated_token_ids) <= config.max_new_tokens
            for attempt in step.rejected_attempts:
                assert attempt.parse_error and 0 < len(attempt.generated_token_ids) <= 4
            # the prompt ids are the exact harmony prompt with the grid shown at this step
            prompt = backend.tokenizer.decode(step.prompt_token_ids, skip_special_tokens=False)
            assert step.grid_text in prompt and prompt.endswith("<|start|>assistant")
            assert step.optimal_actions == sorted(
                step.optimal_actions, key=lambda a: ["UP", "DOWN", "LEFT", "RIGHT"].index(a)
            )
            assert step.distance_to_goal == solve(grid).shortest_path_length
        data = episode.to_trajectory_data()
        assert isinstance(data, TrajectoryData)
        assert data.actions == (None,) * summary.length


def test_steps_cut_by_the_token_limit_are_truncated_not_the_agents_choice(
    backend, grids, config, tmp_path
):
    from goalprobe.stages.rollouts import grid_episodes, truncation_counts

    out = tmp_path / "cut.jsonl"
    report = run_rollouts(grids, backend, config, out, progress=False)  # every answer cut at 4
    episodes = list(read_trajectories(out))
    assert report.truncated_episodes == len(episodes) == len(grids) * config.episodes_per_grid
    assert report.invalid_steps == 0
    for episode in episodes:
        summary, (step,) = episode.summary, episode.steps  # the episode ends at the cut
        assert summary.end_reason == "truncated" and episode.truncated and not summary.success
        assert summary.invalid_steps == 0 and summary.total_attempts == 1  # not retried
        assert step.finish_reason == "length" and step.truncated and "invalid" not in step.flags
        assert step.action is None and step.attempts == 1 and not step.rejected_attempts
        assert step.parse_error.startswith("truncated")
        assert len(step.generated_token_ids) == config.max_new_tokens
    by_id = {g.grid_id: g for g in grids}
    assert grid_episodes(episodes, by_id) == []  # no behaviour from cut-off answers
    counts = truncation_counts(episodes)
    assert counts["truncated_episodes"] == counts["episodes"] == len(episodes)


class CutInTheAnswer:
    """A generation cut off inside its final answer: part of the JSON object is there."""

    def generate(self, batch, sampling):
        return [
            Completion(
                prompt_token_ids=[1, 2],
                generated_token_ids=[3] * sampling.max_new_tokens,
                text="...",
                reasoning="I go left.",
                final='{"action": "LEFT", "re',
                token_ids_source="model",
                finish_reason="length",
            )
            for _ in batch
        ]


def test_an_answer_cut_inside_the_json_is_truncated_not_left(grids, config, tmp_path):
    from goalprobe.agents.parser import parse_action, parse_completion

    assert parse_action('{"action": "LEFT", "re').action is not None  # the text alone parses
    assert parse_completion('{"action": "LEFT", "re', "length").truncated
    assert parse_completion('{"action": "LEFT"}', "stop").action.name == "LEFT"
    out = tmp_path / "cut.jsonl"
    run_rollouts(grids[:1], CutInTheAnswer(), replace(config, retries=2), out, progress=False)
    (episode, second) = read_trajectories(out)
    for each in (episode, second):
        (step,) = each.steps
        assert step.action is None and step.truncated and each.summary.end_reason == "truncated"
        assert step.next_agent_row_col == step.agent_row_col  # not moved LEFT


def test_key_state_is_recorded(reference):
    steps = [s for s in read_steps(reference) if s.grid_id == "kd-hand-0"]
    assert steps
    for step in steps:
        assert step.key_row_col == (2, 1) and step.door_row_col == (2, 3)
        assert step.has_key is False and step.door_open is False
        assert step.variant == Variant.KEY_DOOR
        assert "You do not carry K." not in step.grid_text  # the grid text is the grid only


def test_every_line_carries_schema_and_kind(reference):
    lines = reference.read_text(encoding="utf-8").splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert all(json.loads(line)["schema"] == SCHEMA for line in lines)
    assert kinds[0] == "run" and kinds.count("run") == 1
    assert kinds.count("episode") == 6
    header = read_run_header(reference)
    assert header.config["seed"] == 7 and header.config["retries"] == 1


def test_same_seed_same_rollouts_other_seed_differs(backend, grids, config, tmp_path):
    quick = replace(config, horizon_steps=1, retries=0, batch_size=6)
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    run_rollouts(grids, backend, quick, a, progress=False)
    run_rollouts(grids, backend, replace(quick, batch_size=4), b, progress=False)
    run_rollouts(grids, backend, replace(quick, seed=8), c, progress=False)
    # same seed: the same run and episodes, whatever the batch composition
    assert read_run_header(a).run_id == read_run_header(b).run_id
    assert episode_dicts(a) == episode_dicts(b)
    ids_a = [s.generated_token_ids for s in read_steps(a)]
    ids_c = [s.generated_token_ids for s in read_steps(c)]
    assert ids_a != ids_c


class _Crash(Exception):
    pass


class Wrapped:
    """Delegates to a real backend; dies on call number ``crash_at`` (a killed process)."""

    def __init__(self, inner, crash_at: int | None = None) -> None:
        self.inner, self.crash_at, self.calls = inner, crash_at, 0

    def describe(self):  # the inner backend's identity, so the run id does not change
        return describe_backend(self.inner)

    def generate(self, batch, sampling, *, seeds=None):
        self.calls += 1
        if self.calls == self.crash_at:
            raise _Crash("killed")
        return self.inner.generate(batch, sampling, seeds=seeds)


def test_resume_after_interruption_equals_uninterrupted_run(backend, grids, config, tmp_path):
    # per-conversation seeds: an episode's sampling does not depend on the batch it is in
    config = replace(config, horizon_steps=1, retries=0, batch_size=2)
    reference = tmp_path / "reference.jsonl"
    run_rollouts(grids, backend, replace(config, batch_size=6), reference, progress=False)
    out = tmp_path / "traj.jsonl"
    with pytest.raises(_Crash):
        run_rollouts(grids, Wrapped(backend, crash_at=3), config, out, progress=False)
    assert len(list(read_trajectories(out))) == 4  # the fifth and sixth were in flight
    # a kill in the middle of writing an episode leaves a partial block behind
    block = reference.read_text(encoding="utf-8").split("\n")[7:9]
    assert '"kind":"step"' in block[0] and '"kind":"episode"' in block[1]
    with out.open("a", encoding="utf-8") as fh:
        fh.write(block[0] + "\n" + block[1][: len(block[1]) // 2])
    with pytest.warns(TruncatedLineWarning) as caught:
        assert len(list(read_trajectories(out))) == 4
    messages = " | ".join(str(w.message) for w in caught)
    assert "final line is truncated" in messages and "no summary line" in messages

    with pytest.warns(TruncatedLineWarning, match="dropping"):
        report = run_rollouts(grids, Wrapped(backend), config, out, progress=False)
    assert report.episodes_skipped == 4 and report.episodes_run == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert episode_dicts(out) == episode_dicts(reference)
    again = run_rollouts(grids, Wrapped(backend), config, out, progress=False)
    assert again.episodes_run == 0 and again.generate_calls == 0


def test_other_config_is_refused(reference, grids, config, backend, tmp_path):
    out = tmp_path / "traj.jsonl"
    out.write_bytes(reference.read_bytes())
    with pytest.raises(TrajectoryFormatError, match="holds run"):
        run_rollouts(grids, backend, replace(config, temperature=0.5), out, progress=False)
    # batch size is not part of the run's identity
    report = run_rollouts(grids, backend, replace(config, batch_size=1), out, progress=False)
    assert report.episodes_run == 0


def test_reader_names_file_line_and_field(reference, tmp_path):
    lines = reference.read_text(encoding="utf-8").splitlines(keepends=True)
    step = json.loads(lines[1])
    step["agent_row_col"] = [1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + json.dumps(step) + "\n" + "".join(lines[2:]), encoding="utf-8")
    with pytest.raises(TrajectoryFormatError, match=rf"{bad}:2: field 'agent_row_col'"):
        list(read_trajectories(bad))

    bad.write_text(lines[0] + "{not json\n" + "".join(lines[1:]), encoding="utf-8")
    with pytest.raises(TrajectoryFormatError, match=rf"{bad}:2: not valid JSON"):
        list(read_trajectories(bad))

    other = json.loads(lines[1]) | {"schema": "goalprobe.trajectory/0"}
    bad.write_text(lines[0] + json.dumps(other) + "\n", encoding="utf-8")
    with pytest.raises(TrajectoryFormatError, match=r":2: schema 'goalprobe.trajectory/0'"):
        list(read_trajectories(bad))

    summary_line = next(i for i, line in enumerate(lines) if '"kind":"episode"' in line)
    summary = json.loads(lines[summary_line]) | {"length": 99}
    lines[summary_line] = json.dumps(summary) + "\n"
    bad.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(TrajectoryFormatError, match=rf":{summary_line + 1}: field 'length'"):
        list(read_trajectories(bad))


def test_truncated_final_line_is_reported_and_ignored(reference, tmp_path):
    data = reference.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[:-7])  # the last summary line loses its end
    with pytest.warns(TruncatedLineWarning) as caught:
        episodes = list(read_trajectories(cut))
    assert len(episodes) == 5
    assert re.search(rf"{cut}:\d+: final line is truncated", str(caught[0].message))
    assert "has 2 step line(s) but no summary line" in str(caught[1].message)


def test_horizon_rule():
    config = RolloutConfig()
    for length in range(1, 60):
        assert config.horizon(length) == math.ceil(1.5 * length) == default_horizon(length)
    assert RolloutConfig(horizon_factor=2.0).horizon(7) == 14
    assert RolloutConfig(horizon_steps=30).horizon(7) == 30
    with pytest.raises(ValueError, match="retries"):
        RolloutConfig(retries=-1)
    with pytest.raises(ValueError, match="top_p"):
        RolloutConfig(top_p=0.0)


def test_seeds_are_stable_and_distinct():
    assert derive_seed(0, "g", 1) == derive_seed(0, "g", 1)
    seeds = {derive_seed(0, "g", e) for e in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < 2**31 for s in seeds)


@pytest.mark.slow
def test_bundled_agent_rollout_follows_the_dynamics(grids, tmp_path, bundled_agent):
    from goalprobe.agents.local_backend import LocalBackend
    from goalprobe.gridworld.dynamics import initial_state, is_success, step

    backend = LocalBackend(*bundled_agent)
    config = RolloutConfig(episodes_per_grid=1, batch_size=3, max_new_tokens=96, seed=1)
    out = tmp_path / "bundled.jsonl"
    report = run_rollouts(grids, backend, config, out, progress=False)
    assert report.episodes_run == len(grids)
    by_id = {g.grid_id: g for g in grids}
    valid = 0
    for episode in read_trajectories(out):
        grid = by_id[episode.summary.grid_id]
        state = initial_state(grid)
        for record in episode.steps:
            assert record.state == state
            if record.valid:
                valid += 1
                assert record.final and record.reasoning and record.parse_error is None
                state = step(grid, state, record.action_enum)
            assert record.next_agent_row_col == state.agent
        assert episode.summary.final_state == state
        assert episode.summary.success == is_success(grid, state)
        assert episode.summary.success or episode.summary.length == episode.summary.horizon
    assert valid > 0


class OutOfMemoryAbove:
    """The real tiny model, except that a ``generate`` call of more than ``limit``
    conversations raises CUDA's out-of-memory error (before any work, as a device would)."""

    def __init__(self, inner, limit: int) -> None:
        self.inner, self.limit, self.sizes = inner, limit, []

    def describe(self):  # the inner backend's identity, so the run id does not change
        return describe_backend(self.inner)

    def generate(self, batch, sampling, *, seeds=None):
        import torch

        self.sizes.append(len(batch))
        if len(batch) > self.limit:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory: {len(batch)} rows")
        return self.inner.generate(batch, sampling, seeds=seeds)


def test_generation_halves_on_out_of_memory_and_writes_every_episode_once(
    backend, grids, config, tmp_path
):
    config = replace(config, horizon_steps=1, retries=0, batch_size=6)
    reference = tmp_path / "reference.jsonl"
    run_rollouts(grids, backend, config, reference, progress=False)
    out = tmp_path / "traj.jsonl"
    fake = OutOfMemoryAbove(backend, limit=2)
    report = run_rollouts(grids, fake, config, out, progress=False)
    # 6 fails, 3 fails, then batches of 1 (3 // 2) for the rest of the run
    assert fake.sizes[:3] == [6, 3, 1] and max(fake.sizes[2:]) <= 1
    assert report.batch == {
        "planned": 6,
        "batch": 1,
        "largest_run": 1,
        "halvings": [{"from": 6, "to": 3}, {"from": 3, "to": 1}],
    }
    keys = [ep.key for ep in read_trajectories(out)]
    assert len(keys) == len(set(keys)) == len(grids) * config.episodes_per_grid
    assert episode_dicts(out) == episode_dicts(reference)  # per-row seeds: same episodes


def test_out_of_memory_at_one_conversation_stops_with_the_figures(backend, grids, config, tmp_path):
    from goalprobe.agents.oom import OutOfMemoryAtOneError

    config = replace(config, horizon_steps=1, retries=0, batch_size=2)
    with pytest.raises(
        OutOfMemoryAtOneError, match="generation: one item at a time.*planned batch 2"
    ):
        run_rollouts(
            grids, OutOfMemoryAbove(backend, 0), config, tmp_path / "t.jsonl", progress=False
        )
