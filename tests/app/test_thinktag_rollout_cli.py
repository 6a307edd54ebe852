"""``goalprobe rollout --model DIR`` on a think-tag model (the tiny random Qwen3 with Qwen3's
tokenizer and chat template): runs in the think-tag format; a template without reasoning
delimiters is one ``error:`` line before any weights load."""

from __future__ import annotations

import pytest
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.trajectories import read_run_header, read_trajectories
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set


@pytest.fixture(scope="module")
def grid_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("grids") / "grids.jsonl"
    write_grid_set(path, generate_grid_set(GridSetConfig((5,), (0.3,), 2, seed=5)))
    return path


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


def test_rollout_runs_a_think_tag_model(tmp_path, goalprobe_cli, grid_file, qwen3_tiny):
    out = tmp_path / "qwen3.jsonl"
    result = goalprobe_cli(
        "rollout", grid_file, "--out", out, "--model", qwen3_tiny.directory, "--episodes", 1,
        "--horizon", 2, "--max-new-tokens", 6, "--preflight-steps", 0, "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    fmt = chat_format_for(qwen3_tiny.tokenizer)
    assert read_run_header(out).chat_format == fmt.describe()
    episodes = list(read_trajectories(out))
    assert len(episodes) == 2
    for step in (s for e in episodes for s in e.steps):
        n = len(step.prompt_token_ids)
        ids = step.prompt_token_ids + step.generated_token_ids
        assert fmt.find_anchors(ids).pre_reasoning == (n - 3, n - 2, n - 1)
        assert 1 <= len(step.generated_token_ids) <= 6

    # the pre-flight runs in the format too: a random model never closes its reasoning, so a
    # budget that cuts every step is refused before the run, and nothing is written
    refused = tmp_path / "refused.jsonl"
    result = goalprobe_cli(
        "rollout", grid_file, "--out", refused, "--model", qwen3_tiny.directory,
        "--max-new-tokens", 6, "--preflight-steps", 2, "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "2 of 2 pre-flight steps (100%) were cut off" in errors[0]
    assert "effort low (not rendered: the chat template reads no effort)" in result.output
    assert not refused.exists()


def test_a_template_without_reasoning_delimiters_is_refused_before_loading(
    tmp_path, goalprobe_cli, grid_file, qwen3_plain_dir, monkeypatch
):
    import goalprobe.agents.agent_config

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the format was checked")

    monkeypatch.setattr(goalprobe.agents.agent_config, "load_model", no_load)
    out = tmp_path / "t.jsonl"
    line = _one_error_line(
        goalprobe_cli("rollout", grid_file, "--out", out, "--model", qwen3_plain_dir)
    )
    assert "no reasoning delimiters" in line and "--model" in line
    assert not out.exists()
