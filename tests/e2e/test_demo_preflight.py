"""A pre-flight refusal stops the whole demo (issue 43): with a model that truncates every step
(the tiny random GPT-OSS never stops within its budget), ``goalprobe demo`` exits 2 with one
``error:`` line at the pre-flight, within 2 minutes on a CPU, and no other generation stage runs
(in both schedulers: in order, and in worker processes where the other generation stages wait
for the pre-flight's stage).
"""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from goalprobe.cli import app
from goalprobe.run_layout import RunLayout
from goalprobe.stages import SERVER_STAGES


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_preflight_refusal_stops_every_generation_stage(gptoss_dir, tmp_path, jobs):
    run_dir = tmp_path / "run"
    args = ["demo", "--scale", "tiny", "--model", str(gptoss_dir), "--run-dir", str(run_dir)]
    args += ["--set", "rollouts.temperature=0", "--jobs", str(jobs), "--no-progress"]
    started = time.perf_counter()
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    seconds = time.perf_counter() - started
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert errors[0].startswith("error: rollouts: ") and "pre-flight steps" in errors[0]
    assert "--allow-truncation" in errors[0]
    assert seconds < 120, seconds
    layout = RunLayout(run_dir)
    assert (layout.stage_dir("rollouts") / "preflight.json").is_file()
    assert not layout.trajectories.exists()
    for name in SERVER_STAGES:
        assert not layout.stage_record(name).exists(), name  # none finished
        if name == "rollouts":
            continue
        failure = json.loads(layout.stage_failure(name).read_text())
        assert failure["status"] == "not_run"
        assert failure["error"] == "not run: stage rollouts stopped the run"
    # no stage after the refusal ran (no report either)
    assert not layout.report.exists()
