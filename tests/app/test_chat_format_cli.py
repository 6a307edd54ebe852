"""``goalprobe states`` and ``goalprobe extract`` on a think-tag model (Qwen3's tokenizer and
chat template, a tiny random Qwen3 saved to a directory): prompts in Qwen3's chat format, rows at
its anchors; a template without reasoning delimiters is one ``error:`` line naming what is
missing."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.activations.store import ActivationStore
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.prompts import build_messages
from goalprobe.agents.trajectories import read_run_header, read_steps
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set


@pytest.fixture(scope="module")
def grid_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("grids") / "grids.jsonl"
    write_grid_set(path, generate_grid_set(GridSetConfig((7, 9), (0.3,), 1, seed=5)))
    return path


def test_states_and_extract_on_a_think_tag_model(tmp_path, goalprobe_cli, grid_file, qwen3_tiny):
    model = qwen3_tiny.directory
    tokenizer = qwen3_tiny.tokenizer
    fmt = chat_format_for(tokenizer)
    states = tmp_path / "states.jsonl"
    result = goalprobe_cli("states", grid_file, "--out", states, "--model", model, "--per-grid", 3)
    assert result.exit_code == 0, result.output
    header = read_run_header(states)
    assert header.chat_format == fmt.describe() and header.chat_format["name"] == "think_tag"
    steps = list(read_steps(states))
    assert len(steps) == 6
    for step in steps:
        messages = build_messages(step.grid_text, variant=Variant(step.variant), has_key=False)
        assert step.prompt_token_ids == fmt.encode_prompt(messages)
        text = tokenizer.decode(step.prompt_token_ids)
        assert text.startswith("<|im_start|>system\n") and text.endswith(
            f"{step.grid_text}<|im_end|>\n<|im_start|>assistant\n"
        )

    store = tmp_path / "states.h5"
    result = goalprobe_cli(
        "extract",
        states,
        "--out",
        store,
        "--model",
        model,
        "--stages",
        "pre_reasoning",
        "--layers",
        "0,1",
        "--backend",
        "hooks",
        "--device",
        "cpu",
        "--max-batch-tokens",  # the planner models eager/sink/flex attention; Qwen3 runs sdpa
        "0",
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    with ActivationStore(store) as s:
        assert s.chat_format["name"] == "think_tag" and len(s) == len(steps)
        pre = s.positions("pre_reasoning")
        for i, step in enumerate(steps):
            n = len(step.prompt_token_ids)
            assert pre[i].tolist() == [n - 3, n - 2, n - 1]
            pieces = [tokenizer.decode([step.prompt_token_ids[p]]) for p in pre[i]]
            assert pieces == ["<|im_start|>", "assistant", "\n"]
        assert np.isfinite(s.read("pre_reasoning", 1, np.arange(len(steps)))).all()

    # a harmony model refuses the think-tag file before loading
    wrong = goalprobe_cli("extract", states, "--out", tmp_path / "w.h5", "--model", "bundled")
    assert wrong.exit_code == 2
    assert "think_tag chat format" in wrong.output and "uses harmony" in wrong.output


def _one_error_line(result) -> str:
    assert result.exit_code == 2
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


def test_a_template_without_reasoning_delimiters_is_one_error_line(
    tmp_path, goalprobe_cli, grid_file, qwen3_tiny, qwen3_plain_dir
):
    out = tmp_path / "states.jsonl"
    line = _one_error_line(
        goalprobe_cli("states", grid_file, "--out", out, "--model", qwen3_plain_dir)
    )
    assert "no reasoning delimiters" in line and "never writes </think>" in line
    assert not out.exists()
    # extract: refused before the model loads, no output left behind
    states = tmp_path / "ok.jsonl"
    ok = goalprobe_cli("states", grid_file, "--out", states, "--model", qwen3_tiny.directory)
    assert ok.exit_code == 0, ok.output
    store = tmp_path / "s.h5"
    line = _one_error_line(
        goalprobe_cli("extract", states, "--out", store, "--model", qwen3_plain_dir)
    )
    assert "no reasoning delimiters" in line and "--model" in line
    assert not store.exists() and not (tmp_path / "s.h5.parts").exists()


def test_patch_refuses_a_template_without_reasoning_delimiters_before_loading(
    tmp_path, goalprobe_cli, grid_file, qwen3_plain_dir
):
    out = tmp_path / "patching"
    line = _one_error_line(
        goalprobe_cli("patch", "--grids", grid_file, "--out", out, "--model", qwen3_plain_dir)
    )
    assert "no reasoning delimiters" in line and "never writes </think>" in line
    assert "--model" in line and not out.exists()
