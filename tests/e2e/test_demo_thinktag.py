"""``goalprobe demo --scale tiny`` on a think-tag model: the tiny random Qwen3 (Qwen3's real
tokenizer and chat template) with the oracle engine, which writes the episodes in Qwen3's format
from the optimal policy (a random model never closes its reasoning), runs every stage to a
report; the harmony path keeps its run ids and cache keys; a template without reasoning
delimiters is one ``error:`` line before any stage runs."""

from __future__ import annotations

import json

import pytest
from goalprobe.activations.store import ActivationStore
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.models import describe_local_model, load_tokenizer, model_identity
from goalprobe.agents.rollout import run_id_for
from goalprobe.agents.trajectories import read_run_header, read_steps

from goalprobe.config import demo_config
from goalprobe.run_layout import RunLayout
from goalprobe.stages import STAGES


@pytest.mark.slow  # the tiny demo end to end (327 s on 2 shared cores at load 20; CPU time below)
def test_tiny_demo_on_a_think_tag_model_runs_every_stage(tmp_path, goalprobe_cli, qwen3_tiny):
    run = tmp_path / "run"
    result = goalprobe_cli(
        "demo", "--scale", "tiny", "--model", qwen3_tiny.directory, "--backend", "oracle",
        "--run-dir", run, "--no-progress", "--jobs", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"stages {len(STAGES)} ran" in result.output
    layout = RunLayout(run)
    assert sorted(p.stem for p in layout.stages_dir.glob("*.json")) == sorted(STAGES)
    assert not list(layout.stages_dir.glob("*.failed.json"))
    assert layout.report.is_file()

    config = json.loads(layout.demo_config.read_text())
    assert config["agent"]["chat_format"] == "think_tag"
    assert config["agent"]["backend"] == "oracle"
    assert config["patching"]["patch"]["reasoning"] == "oracle"

    fmt = chat_format_for(qwen3_tiny.tokenizer)
    header = read_run_header(layout.trajectories)
    assert header.chat_format == fmt.describe() and header.backend["class"] == "OracleBackend"
    steps = list(read_steps(layout.trajectories))
    for step in steps:  # the oracle's completions are in Qwen3's format, closed and answered
        ids = step.prompt_token_ids + step.generated_token_ids
        assert fmt.reasoning_span(ids) is not None and step.generated_token_ids[-1] in fmt.stop_ids
    for store in (layout.store, layout.probing_store):
        with ActivationStore(store) as s:
            assert s.chat_format["name"] == "think_tag" and len(s) > 0
    with ActivationStore(layout.store) as s:
        assert len(s.positions("post_reasoning")) == len(steps)

    # patching ran on the Qwen3's forward passes, regenerations included (stop ids: the format's)
    patching = json.loads((layout.stages_dir / "patching.json").read_text())["summary"]
    assert patching["pairs"] > 0 and patching["records"] > 0
    records = json.loads(layout.patch_results.read_text())
    assert any(r.get("mode") == "regenerated" for r in records["records"]), records.keys()


def test_the_chat_format_is_in_run_ids_and_cache_keys_but_harmony_keeps_its_own(qwen3_tiny):
    harmony = chat_format_for(load_tokenizer("bundled"))
    think = chat_format_for(qwen3_tiny.tokenizer)
    tiny = demo_config("tiny")
    # harmony: the run id and the cache key's agent identity are those of before formats
    assert describe_local_model("bundled", chat_format=harmony) == {
        "class": "LocalBackend",
        **model_identity("bundled"),
    }
    assert demo_config("tiny", chat_format=harmony).agent.identity() == tiny.agent.identity()
    assert "chat_format" not in tiny.agent.identity()
    # another format: in both, so a run of one format never resumes another's files
    model = str(qwen3_tiny.directory)
    plain = run_id_for(tiny.rollouts, describe_local_model(model))
    assert run_id_for(tiny.rollouts, describe_local_model(model, chat_format=think)) != plain
    with_format = demo_config("tiny", model=model, chat_format=think).agent
    assert with_format.identity()["chat_format"] == "think_tag"
    assert demo_config("tiny", model=model).agent.identity() != with_format.identity()


def test_budgets_follow_the_chat_format(qwen3_tiny):
    think = chat_format_for(qwen3_tiny.tokenizer)  # Qwen3's template reads no effort
    model = str(qwen3_tiny.directory)
    assert demo_config("default", model=model).rollouts.max_new_tokens == 4096  # as harmony
    steered = demo_config("default", model=model, chat_format=think)
    assert steered.rollouts.max_new_tokens == steered.patching.patch.max_new_tokens == 32768
    oracle = demo_config("default", model=model, backend="oracle", chat_format=think)
    assert oracle.rollouts.max_new_tokens == 256  # the oracle writes a few dozen tokens
    assert oracle.patching.patch.max_new_tokens == 32768  # regenerations are the model's
    assert demo_config("default").rollouts.max_new_tokens == 256  # the bundled agent's


def test_demo_refuses_a_template_without_reasoning_delimiters(
    tmp_path, goalprobe_cli, qwen3_plain_dir
):
    for backend in ("local", "oracle"):
        run = tmp_path / backend
        result = goalprobe_cli(
            "demo", "--scale", "tiny", "--model", qwen3_plain_dir, "--backend", backend,
            "--run-dir", run, "--no-progress",
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), result.output
        assert "no reasoning delimiters" in lines[0] and "never writes </think>" in lines[0]
        assert "--model" in lines[0]
        assert not run.exists()  # refused before any stage (and any weights)
