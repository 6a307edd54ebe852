"""Issue 31: the fog stage reports the episodes the token limit cut off (fog results schema 2),
in its result file, its report section and its headline row, never as the agent's failures.

The stage runs for real with the bundled agent at the tiny scale, whose 256-token budget cuts
off one of its two fogged episodes (the same seed gives the same cut)."""

from __future__ import annotations

import json

import pytest
from goalprobe.agents.trajectories import read_trajectories

from goalprobe.config import demo_config
from goalprobe.report.blocks import Table, Text
from goalprobe.report.fog import fog as fog_section
from goalprobe.report.fog import reading
from goalprobe.report.headline import headline_rows
from goalprobe.report.run import RunReader
from goalprobe.run_layout import RunLayout
from goalprobe.stages import fog
from goalprobe.stages.context import StageContext


@pytest.fixture(scope="module")
def fog_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fog-cut") / "run"
    config = fog.STAGE.receives(demo_config("tiny"))
    _, summary = fog.run(StageContext(RunLayout(root)), config, root / "fog")
    return root, config, summary


def test_the_result_file_counts_the_truncated_episodes_apart(fog_run):
    root, config, summary = fog_run
    layout = RunLayout(root)
    episodes = list(read_trajectories(layout.fog_trajectories))
    cut = [e for e in episodes if e.truncated]
    assert cut and len(cut) < len(episodes), "the tiny budget should cut some episodes, not all"
    data = json.loads(layout.fog_results.read_text())
    assert data["schema"] == "goalprobe.demo.fog/2"
    truncation = data["truncation"]
    assert truncation["episodes"] == len(episodes)
    assert truncation["truncated_episodes"] == len(cut) == summary["truncated_episodes"]
    assert truncation["max_new_tokens"] == config.rollout.max_new_tokens
    assert truncation["steps_before_truncation"] == sum(e.summary.length - 1 for e in cut)
    # left out of every score, not counted as failures: the agent is scored on the others only
    agent = data["policies"]["agent"]
    assert agent["episodes"] == len(episodes) - len(cut)
    scored = [e for e in data["episodes"] if e["policy"] == "agent"]
    assert len(scored) == len(episodes) - len(cut)
    finished = [e for e in episodes if not e.truncated]
    successes = sum(e.summary.success for e in finished)
    assert agent["success"]["value"] == pytest.approx(successes / len(finished))


def test_the_report_section_and_the_headline_row_say_so(fog_run):
    root, config, _ = fog_run
    data = json.loads(RunLayout(root).fog_results.read_text())
    n, total = data["truncation"]["truncated_episodes"], data["truncation"]["episodes"]
    budget = config.rollout.max_new_tokens
    blocks = fog_section(RunReader(root), None)
    text = " ".join(b.text for b in blocks if isinstance(b, Text))
    assert (
        f"{n} of the agent's {total} episodes were cut off by the token limit at {budget} tokens"
        in text
    )
    assert "not counted as failures" in text
    rows = next(b for b in blocks if isinstance(b, Table)).rows
    cut_row = next(r for r in rows if r[0].startswith("episodes cut off by the token limit"))
    assert cut_row[1] == str(n) and set(cut_row[2:]) == {"-"}
    (row,) = [r for r in headline_rows(root) if r.finding.startswith("Fogged grids")]
    assert f"{n} of {total} episodes truncated at {budget} tokens (left out, not failures)" in (
        row.baseline
    )


def test_a_version_1_file_and_an_uncut_run_say_nothing_of_truncation(fog_run):
    root, _, _ = fog_run
    data = json.loads(RunLayout(root).fog_results.read_text())
    old = {k: v for k, v in data.items() if k != "truncation"}
    for payload in (old, {**data, "truncation": {**data["truncation"], "truncated_episodes": 0}}):
        assert "cut off by the token limit" not in reading(payload)
