"""``goalprobe attribute`` (issue 41, item 4): bad arguments are one ``error:`` line before any
model loads, an existing output is never overwritten unaided, and a run on the bundled agent
writes the versioned attribution file (read back by the Python API) and its heat map."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.probes.attribution import SCHEMA, SCHEMA_VERSION, read_attributions

NO_MODEL = "/nonexistent/model-that-would-take-long-to-load"


def error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "nonexistent" not in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def grids(tmp_path_factory):
    from typer.testing import CliRunner

    from goalprobe.cli import app

    path = tmp_path_factory.mktemp("attr") / "grids.jsonl"
    result = CliRunner().invoke(
        app, ["grids", "--out", str(path), "--sizes", "5", "--densities", "0.5", "--per-cell", "2"]
    )
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "exactly one of --trajectories and --grids"),
        (["--backend", "nnsight"], "--no-grad-drop"),
        (["--backend", "transformer_lens"], "--backend"),
        (["--metrics", "action,loss"], "--metrics"),
        (["--positions", "reasoning"], "--positions"),
        (["--reasoning", "recorded"], "needs --trajectories"),
        (["--moves", "key"], "moves"),
        (["--device", "gpu0"], "--device"),
        (["--pairs", "patch_pairs.jsonl"], "--pairs needs --trajectories"),
        (["--kinds", "disjoint,swap"], "kinds must be"),
        (["--backend", "nnsight", "--no-grad-drop", "--check-pairs", "-1"], "--check-pairs"),
    ],
)
def test_bad_arguments_are_refused_before_the_model_loads(
    goalprobe_cli, grids, tmp_path, args, expected
):
    source = [] if not args else ["--grids", grids]
    line = error_line(
        goalprobe_cli("attribute", *source, "--out", tmp_path / "o", "--model", NO_MODEL, *args)
    )
    assert expected in line
    assert not (tmp_path / "o").exists()


def test_a_run_writes_the_attribution_file_and_never_overwrites_it(goalprobe_cli, grids, tmp_path):
    out = tmp_path / "attr"
    result = goalprobe_cli(
        "attribute", "--grids", grids, "--out", out, "--max-bases", 1, "--moves", "agent",
        "--max-new-tokens", 160, "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records, card = read_attributions(out / "attribution")
    assert card["schema"] == SCHEMA and card["schema_version"] == SCHEMA_VERSION
    assert card["backend"] == "hooks" and card["n_layers"] == 4
    assert set(card["where"]) == {r.metric for r in records}
    assert {r.metric for r in records} <= {"action", "coordinates"} and records
    for r in records:
        assert r.atp.shape == (4, r.prompt_length) and r.graddrop.shape == r.atp.shape
        assert np.any(r.atp != 0) and r.cell_positions.shape == (5, 5)
    assert "plotly" in (out / "attribution_heatmap.html").read_text()
    again = goalprobe_cli("attribute", "--grids", grids, "--out", out, "--model", NO_MODEL)
    assert "--overwrite" in error_line(again)
