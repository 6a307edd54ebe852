"""The worked examples in ``examples/`` run as plain scripts, on the tiny scale, and use only
the public API (``import goalprobe as gp``)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import goalprobe

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ALLOWED_IMPORTS = {"json", "os", "tempfile", "pathlib", "numpy", "goalprobe"}


def run_example(name: str, out: Path) -> list[str]:
    env = {**os.environ, "GOALPROBE_EXAMPLE_OUT": str(out), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True, text=True, env=env, cwd=out.parent, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Warning" not in done.stderr, done.stderr[-3000:]  # a normal run prints no warning
    return done.stdout.splitlines()


@pytest.mark.parametrize("name", ["probe_anchors.py", "score_against_belief.py"])
def test_examples_use_only_the_public_api(name):
    tree = ast.parse((EXAMPLES / name).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {a.name.split(".")[0] for a in node.names} <= ALLOWED_IMPORTS, ast.dump(node)
            assert all(
                a.name == "goalprobe" or not a.name.startswith("goalprobe") for a in node.names
            )
        elif isinstance(node, ast.ImportFrom):
            assert node.module.split(".")[0] in ALLOWED_IMPORTS - {"goalprobe"}, node.module
        elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "gp":
            assert node.attr in goalprobe.__all__, node.attr
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    assert "# %%" in text and "format_name: percent" in text  # jupytext percent format


@pytest.mark.slow  # the bundled agent on 80 prompt-only states (~15 s on one idle core)
def test_probe_anchors_example(tmp_path):
    out = tmp_path / "anchors"
    lines = run_example("probe_anchors.py", out)
    assert lines[0].startswith(f"goalprobe {goalprobe.__version__}")
    assert "20 grids, 80 prompt-only states" in lines
    for prefix in ("agent position, top-1: probe", "goal position, top-1: probe", "cell types"):
        (line,) = [x for x in lines if x.startswith(prefix)]
        assert line.endswith((": yes", ": no")), line
    summary = json.loads((out / "anchors_summary.json").read_text())
    assert summary["states"] == 80
    for stat in (*summary["positions"].values(), summary["cell_accuracy"]):
        assert 0 <= stat["ci_low"] <= stat["value"] <= stat["ci_high"] <= 1
    assert (out / "anchors.h5").is_file() and list((out / "probes" / "models").glob("*.json"))


@pytest.mark.slow  # rollouts, extraction, a probe and scoring (~25 s on one idle core)
def test_score_against_belief_example(tmp_path):
    out = tmp_path / "run"
    lines = run_example("score_against_belief.py", out)
    layout = goalprobe.RunLayout(out)
    assert layout.belief.is_file() and layout.meg.is_file() and layout.decoded_maps()
    summary = json.loads((out / "belief_summary.json").read_text())
    assert 0 < summary["grids"] <= 8 and summary["steps"] >= summary["grids"]
    for name in ("acc_gt", "acc_dec"):
        stat = summary[name]
        assert 0 <= stat["ci_low"] <= stat["value"] <= stat["ci_high"] <= 1
        assert any(line.startswith(f"{name}: {stat['value']:.1%}") for line in lines)
    assert any(line.startswith("MEG on the true grid:") for line in lines)
    assert "scoring/belief.json" in summary["outputs"]
