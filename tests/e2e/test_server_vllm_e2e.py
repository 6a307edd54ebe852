"""The server path end to end against a fake vLLM serving the tiny random GPT-OSS
(``tests/vllm_fixtures.py``: vLLM's own harmony rendering, with its date line and channel list):
rollouts record the served prompt ids, extraction replays them, patching replays them (its
counterfactuals spliced into the served prompt), and the tiny demo in server mode runs every
stage with the ids the server returned."""

from __future__ import annotations

import json

import pytest
from goalprobe.activations.store import ActivationStore
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from vllm_fixtures import CURRENT, OLDER, fake_vllm

from goalprobe.config import demo_config
from goalprobe.demo import run_demo


@pytest.mark.slow
@pytest.mark.parametrize("shape", [CURRENT, OLDER], ids=["current", "older"])
def test_rollout_extract_patch_replay_the_served_prompts(
    goalprobe_cli, gptoss_tiny, harmony_encoding, tmp_path, shape
):
    model = str(gptoss_tiny.directory)
    grids = generate_grid_set(GridSetConfig(sizes=(5,), densities=(0.5,), n_per_cell=2))
    write_grid_set(tmp_path / "grids.jsonl", grids)
    traj = tmp_path / "traj.jsonl"
    with fake_vllm(gptoss_tiny, harmony_encoding, shape) as (url, log):
        result = goalprobe_cli(
            "rollout", tmp_path / "grids.jsonl", "--out", traj, "--server", url,
            "--model", model, "--tokenizer", model, "--server-token-ids",
            "--require-token-ids", "--episodes", "1", "--horizon", "2", "--no-progress",
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    steps = [s for e in read_trajectories(traj) for s in e.steps]
    assert steps and all(s.token_ids_source == "model" and s.valid for s in steps)
    assert all(s.prompt_token_ids in log.prompts for s in steps)

    store = tmp_path / "acts.h5"
    result = goalprobe_cli(
        "extract", traj, "--model", model, "--out", store, "--device", "cpu",
        "--layers", "0,1", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with ActivationStore(store) as opened:
        assert len(opened) > 0

    out = tmp_path / "patch"
    result = goalprobe_cli(
        "patch", "--trajectories", traj, "--model", model, "--out", out, "--reasoning",
        "oracle", "--allow-suboptimal", "--layers", "all", "--sites", "pre_reasoning",
        "--directions", "cf_to_base", "--moves", "goal", "--control-per-move", "0",
        "--max-new-tokens", "4", "--device", "cpu", "--n-resamples", "200",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    bundle = json.loads((out / "patch_results.json").read_text())
    assert bundle["preparation"]["n_kept"] > 0, bundle["preparation"]


@pytest.mark.slow
def test_tiny_demo_in_server_mode_uses_the_served_ids(gptoss_tiny, harmony_encoding, tmp_path):
    with fake_vllm(gptoss_tiny, harmony_encoding) as (url, log):
        config = demo_config(
            "tiny", model=str(gptoss_tiny.directory), backend="server", base_url=url
        )
        result = run_demo(tmp_path / "run", config, progress=False, jobs=1, log=lambda line: None)
    assert result.failed == {}, result.failed
    steps = [
        s for e in read_trajectories(tmp_path / "run/rollouts/trajectories.jsonl") for s in e.steps
    ]
    assert steps and all(s.token_ids_source == "model" for s in steps)
    assert all(r.get("return_token_ids") is True for r in log.requests)
