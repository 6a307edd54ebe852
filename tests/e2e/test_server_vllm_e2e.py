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
from vllm_fixtures import CURRENT, OLDER, VLLM_VERSION, fake_vllm

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


def stage_outputs(run_dir, names) -> dict[str, bytes]:
    """The bytes of every file the records of stages ``names`` list as outputs."""
    found = {}
    for name in names:
        record = json.loads((run_dir / "stages" / f"{name}.json").read_text())
        for relative in record["outputs"].values():
            path = run_dir / relative
            for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
                if file.is_file():
                    found[str(file.relative_to(run_dir))] = file.read_bytes()
    return found


@pytest.mark.slow
def test_one_gpu_workflow_generates_with_the_server_then_runs_the_weights_without_it(
    goalprobe_cli, gptoss_tiny, harmony_encoding, tmp_path
):
    """The one-GPU workflow of docs/gpu.md on CPU: the generation stages against the (fake)
    server with ``--generation-only``; then, the server stopped, the same command with another
    device spelling runs the weight stages, takes every generation stage from the cache without
    asking the server, and leaves the server's trajectories byte for byte."""
    from goalprobe.stages import SERVER_STAGES, WEIGHT_STAGES

    run_dir = tmp_path / "run"
    with fake_vllm(gptoss_tiny, harmony_encoding) as (url, log):
        common = (
            "demo", "--scale", "tiny", "--run-dir", run_dir, "--model", gptoss_tiny.directory,
            "--backend", "server", "--base-url", url, "--no-progress", "--jobs", "1",
        )  # fmt: skip
        first = goalprobe_cli(*common, "--generation-only")
        served = len(log.requests)
    assert first.exit_code == 0, first.output
    stages = run_dir / "stages"
    assert all((stages / f"{name}.json").is_file() for name in SERVER_STAGES)
    assert not any((stages / f"{name}.json").exists() for name in WEIGHT_STAGES)
    assert not (run_dir / "report.html").exists()
    record = json.loads((stages / "rollouts.json").read_text())
    assert record["provenance"]["software"]["server"] == VLLM_VERSION  # the server's GET /version
    generated = stage_outputs(run_dir, SERVER_STAGES)
    assert any(name.endswith(".jsonl") for name in generated)
    records = {name: (stages / f"{name}.json").read_bytes() for name in SERVER_STAGES}

    second = goalprobe_cli(*common, "--device", "cpu:0")  # the server is down now
    assert second.exit_code == 0, second.output
    assert "the server is not needed" in second.output
    assert len(log.requests) == served
    assert stage_outputs(run_dir, SERVER_STAGES) == generated
    assert {name: (stages / f"{name}.json").read_bytes() for name in SERVER_STAGES} == records
    assert all((stages / f"{name}.json").is_file() for name in WEIGHT_STAGES)
    assert (run_dir / "report.html").is_file()
