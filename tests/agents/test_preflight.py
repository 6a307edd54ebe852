"""Token budgets that fit the model and the pre-flight before a long generation (issue 32, item 2):
GPT-OSS gets at least 4,096 new tokens at low effort and 8-16k at medium while the bundled agents
keep their small budgets; the probing prompts use the rollouts' effort; the pre-flight measures a
sample of steps on the real (tiny, random) GPT-OSS with the o200k tokenizer and on the bundled
agent, and refuses a budget that cuts more than 5% of them, naming the flag that overrides."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from goalprobe.agents.bundled import REASONING_MODEL_BUDGETS, token_budget
from goalprobe.agents.preflight import (
    OVERRIDE_FLAG,
    PreflightConfig,
    PreflightRefused,
    run_preflight,
    sample_grids,
)
from goalprobe.agents.rollout import RolloutConfig
from goalprobe.gridworld.generator import GridSetConfig, generate_grid, generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.gridworld.optimal import solve


def _grids(n: int = 4):
    return [
        generate_grid(7, 0.5, np.random.default_rng(s), grid_id=f"pf-{s}", min_distance=2)
        for s in range(n)
    ]


def test_budgets_fit_the_model(gptoss_dir):
    assert token_budget("bundled", "low", 96) == 96
    assert token_budget("bundled:map", "medium", 256) == 256
    assert token_budget(str(gptoss_dir), "low", 256) == 4_096
    assert 8_192 <= token_budget(str(gptoss_dir), "medium", 256) <= 16_384
    assert token_budget(str(gptoss_dir), "high", 256) >= REASONING_MODEL_BUDGETS["medium"]
    assert token_budget(str(gptoss_dir), "low", 20_000) == 20_000  # never lowered
    with pytest.raises(ValueError, match="reasoning_effort"):
        token_budget("bundled", "extreme", 96)


def test_demo_budgets_follow_the_model_and_the_effort(gptoss_dir):
    from goalprobe.config import demo_config

    bundled = demo_config("default")
    assert bundled.rollouts.max_new_tokens == 256 and bundled.patching.patch.max_new_tokens == 256
    gptoss = demo_config("default", model=str(gptoss_dir))
    assert gptoss.rollouts.max_new_tokens == 4_096 == gptoss.patching.patch.max_new_tokens
    medium = demo_config(
        "paper", model=str(gptoss_dir), overrides={"rollouts.reasoning_effort": "medium"}
    )
    assert 8_192 <= medium.rollouts.max_new_tokens == medium.patching.patch.max_new_tokens <= 16_384
    fixed = demo_config(
        "default", model=str(gptoss_dir), overrides={"rollouts.max_new_tokens": 2_000}
    )
    assert fixed.rollouts.max_new_tokens == 2_000  # what the user sets stays
    assert fixed.patching.patch.max_new_tokens == 4_096
    # the flat path of the PatchConfig the section embeds is the user's too
    flat = demo_config("default", model=str(gptoss_dir), overrides={"patching.max_new_tokens": 300})
    assert flat.patching.patch.max_new_tokens == 300
    # tiny (CI) keeps its budgets whatever the model
    assert demo_config("tiny", model=str(gptoss_dir)).rollouts.max_new_tokens == 96


def test_probing_prompts_use_the_rollouts_effort():
    from goalprobe.config import demo_config
    from goalprobe.stages import probing

    config = demo_config("tiny", overrides={"rollouts.reasoning_effort": "medium"})
    assert config.probing.states.reasoning_effort == "low"  # the section's own default ...
    received = probing.STAGE.receives(config).probing
    assert received.states.reasoning_effort == "medium"  # ... is not used
    same = demo_config("tiny")
    assert probing.STAGE.receives(same).probing == same.probing  # the default key unchanged


def test_preflight_refuses_a_budget_that_cuts_the_reasoning(gptoss_model, o200k_tokenizer):
    from goalprobe.agents.local_backend import LocalBackend

    backend = LocalBackend(gptoss_model, o200k_tokenizer)
    grids = _grids()
    config = RolloutConfig(episodes_per_grid=3, max_new_tokens=3, temperature=0.0, batch_size=2)
    report = run_preflight(grids, backend, config, PreflightConfig(steps=4))
    assert report.steps == 4 and report.truncated == 4 and report.truncation_rate == 1.0
    assert report.truncation_ci[1] == 1.0 and report.truncation_ci[0] > 0.4
    assert report.generated_tokens_p95 == 3 == report.generated_tokens_mean
    expected = sum(3 * config.horizon(solve(g).shortest_path_length) for g in grids)
    assert report.projected_steps == expected and report.projected_tokens == 3 * expected
    assert report.tokens_per_second > 0 and math.isfinite(report.projected_hours)
    with pytest.raises(PreflightRefused, match=OVERRIDE_FLAG) as refused:
        report.check(PreflightConfig())
    assert "4 of 4" in str(refused.value) and "max_new_tokens" in str(refused.value)
    report.check(PreflightConfig(allow_truncation=True))  # overridden: no error
    json.dumps(report.to_dict())


@pytest.mark.slow
def test_preflight_passes_the_bundled_agent_at_its_budget(bundled_agent):
    from goalprobe.agents.local_backend import LocalBackend

    backend = LocalBackend(*bundled_agent)
    config = RolloutConfig(max_new_tokens=256, temperature=0.0, batch_size=8)
    report = run_preflight(_grids(8), backend, config, PreflightConfig(steps=8))
    assert report.truncated == 0 and report.generated_tokens_p95 < 256
    report.check(PreflightConfig())


def test_sample_grids_spreads_over_the_set():
    grids = generate_grid_set(GridSetConfig(sizes=(5, 7, 9), densities=(0.0,), n_per_cell=4))
    chosen = sample_grids(grids, 3)
    assert [g.size for g in chosen] == [5, 7, 9]
    assert sample_grids(grids[:2], 16) == grids[:2]


def test_rollout_command_refuses_before_the_run_and_the_flag_overrides(
    gptoss_dir, tmp_path, goalprobe_cli
):
    grids = tmp_path / "grids.jsonl"
    write_grid_set(grids, _grids(2))
    out = tmp_path / "traj.jsonl"
    args = ["rollout", grids, "--out", out, "--model", gptoss_dir, "--episodes", 1]
    args += ["--max-new-tokens", 3, "--temperature", 0, "--horizon", 1, "--no-progress"]
    result = goalprobe_cli(*args)
    errors = [line for line in result.output.splitlines() if line.startswith("error")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert "2 of 2 pre-flight steps" in errors[0] and OVERRIDE_FLAG in errors[0]
    assert not out.exists()  # nothing ran
    result = goalprobe_cli(*args, "--allow-truncation")
    assert result.exit_code == 0, result.output
    assert "2 episode(s) cut off by the token limit" in result.output
