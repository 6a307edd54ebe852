"""The report package and the headline check, on small run directories written here.

The whole demo's report (every section, in headless Chromium) is tested in test_demo.py; these
tests are fast: a run directory holding only the behaviour, iso-difficulty and key-variant
results (drawn at random from a seeded generator), written through :class:`RunLayout`.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from goalprobe.report.blocks import stat_text
from goalprobe.report.headline import headline_rows
from goalprobe.report.page import SECTION_TITLES, write_report
from goalprobe.run_layout import RunLayout

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compare_headline.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("compare_headline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare_headline = _load_script()


def _stat(rng: np.random.Generator) -> dict:
    value = float(rng.uniform(0.2, 0.9))
    return {"value": value, "ci_low": value - 0.1, "ci_high": value + 0.05, "n": 6}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def make_run(root: Path, seed: int = 0, variant: str = "key_door") -> RunLayout:
    """A run directory with behaviour, iso and key-variant results (random, seeded)."""
    rng = np.random.default_rng(seed)
    layout = RunLayout(root)
    metrics = ("success_rate", "accuracy", "entropy", "jsd", "ece", "random_walk_success_rate")
    cells = [
        {"size": s, "density": d, "n_grids": 2, **{m: _stat(rng) for m in metrics}}
        for s in (7, 9)
        for d in (0.0, 0.3)
    ]
    overall = {
        "n_grids": 8,
        **{m: _stat(rng) for m in metrics},
        "random_walk_accuracy": _stat(rng),
        "random_action_accuracy": _stat(rng),
    }
    _write(
        layout.behaviour_metrics,
        {
            "overall": overall,
            "by_size_density": cells,
            "by_size": [
                {"size": s, "n_grids": 4, **{m: _stat(rng) for m in metrics}} for s in (7, 9)
            ],
            "by_distance": [
                {"distance": d, "accuracy": _stat(rng), "jsd": _stat(rng)} for d in (1, 2, 3)
            ],
        },
    )
    tests = [
        {
            "transform": t,
            "metric": "accuracy",
            "n_pairs": 8,
            "base_mean": float(rng.uniform()),
            "transformed_mean": float(rng.uniform()),
            "difference": _stat(rng),
            "statistic": float(rng.uniform(0, 20)),
            "p_value": float(rng.uniform()),
            "rank_biserial": float(rng.uniform(-1, 1)),
        }
        for t in ("reflect", "rotate", "transpose", "translate")
    ]
    _write(layout.iso_results, {"tests": tests})
    entry = {
        "n_trajectories": 4,
        "success_rate": float(rng.uniform()),
        "accuracy": _stat(rng),
        "key_pickup_rate": float(rng.uniform()),
        "key_attraction_bias": float(rng.uniform()),
        "stage_accuracy": {"to_key": 0.5, "to_door": None, "to_goal": 1.0},
    }
    _write(
        layout.keys_results,
        {"horizon": 12, "variants": {variant: entry}, "two_path_jaccard": _stat(rng)},
    )
    return layout


def test_the_report_shows_the_headline_rows_and_the_parser_reads_them_back(tmp_path):
    layout = make_run(tmp_path / "run")
    rows = headline_rows(layout.root)
    assert [r.id for r in rows] == ["behaviour.accuracy", "behaviour.success", "keys.key_door"]
    assert rows[0].finding == "Per-action accuracy (Fig. 4)"
    overall = json.loads(layout.behaviour_metrics.read_text())["overall"]
    assert rows[0].value == stat_text(overall["accuracy"])
    path = write_report(layout.root)
    assert path == layout.report
    read = compare_headline.headline_of_run(layout.root)
    # one line per question: its label, the value and the short answer, the baseline
    assert [line[:2] for line in read] == [(r.label, r.value) for r in rows]
    assert read[0][2].startswith(rows[0].answer)
    walk = overall["random_walk_accuracy"]["value"]
    expected = "yes" if overall["accuracy"]["ci_low"] > walk else "no"
    assert rows[0].verdict.startswith(f"above random walk: {expected}")
    assert " of 21 " in rows[0].verdict  # the default agent's whole family, fixed in advance
    page = path.read_text()
    # the headline (and its family) before any other section; run bookkeeping at the end
    assert page.index('id="headline"') < page.index("Holm family") < page.index("<table")
    assert page.index('id="behaviour"') < page.index('id="run"')


def test_a_report_without_inputs_says_what_is_missing(tmp_path):
    layout = RunLayout(tmp_path / "empty")
    layout.root.mkdir()
    page = write_report(layout.root).read_text()
    for title in SECTION_TITLES.values():
        assert title in page
    missing = layout.relative(layout.behaviour_metrics)
    assert f"not run: {missing} not found (stage behaviour)" in page
    assert "no stage produced a headline figure yet" in page
    assert page.count("<script type='text/javascript'>") == 1  # plotly.js inlined once
    assert compare_headline.main([str(layout.root), "--save", str(tmp_path / "h.json")]) == 2


def test_the_templates_escape_what_the_run_holds(tmp_path):
    layout = make_run(tmp_path / "run", variant="<script>alert(1)</script>")
    page = write_report(layout.root).read_text()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_compare_headline_finds_a_changed_number(tmp_path, capsys):
    a = make_run(tmp_path / "a")
    write_report(a.root)
    b = RunLayout(tmp_path / "b")
    shutil.copytree(a.root, b.root)
    saved = tmp_path / "headline.json"
    assert compare_headline.main([str(a.root), str(b.root)]) == 0
    assert compare_headline.main([str(a.root), "--save", str(saved)]) == 0
    assert compare_headline.main([str(b.root), "--against", str(saved)]) == 0

    metrics = json.loads(b.behaviour_metrics.read_text())
    metrics["overall"]["accuracy"]["value"] += 0.01
    b.behaviour_metrics.write_text(json.dumps(metrics))
    write_report(b.root)
    capsys.readouterr()
    assert compare_headline.main([str(a.root), str(b.root)]) == 1
    out = capsys.readouterr().out
    assert "Per-action accuracy" in out and "1 difference(s)" in out
    assert compare_headline.main([str(b.root), "--against", str(saved)]) == 1


def test_compare_headline_runs_as_a_script(tmp_path):
    a = make_run(tmp_path / "a")
    write_report(a.root)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(a.root), str(a.root)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert "headline tables identical" in done.stdout
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), str(a.root)], capture_output=True, text=True, cwd=ROOT
    )
    assert bad.returncode == 2 and "exactly one of" in bad.stderr


@pytest.mark.parametrize("template", sorted((ROOT / "goalprobe/report/templates").iterdir()))
def test_templates_ship_as_package_data(template):
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tools = config["tool"]["setuptools"]
    assert "goalprobe.report" in tools["packages"]
    globs = tools["package-data"]["goalprobe.report"]
    relative = template.relative_to(ROOT / "goalprobe/report").as_posix()
    assert any(fnmatch.fnmatch(relative, g) for g in globs), relative
    assert "jinja2" in " ".join(config["project"]["dependencies"]).lower()


def test_side_by_side_pairs_rows_by_id_and_shows_both_counts():
    """Two runs' headline rows pair up by their spec id; a count that differs shows as
    ``left / right``; a row of one run only gets ``-`` for the other."""
    from goalprobe.report.agents import side_by_side
    from goalprobe.report.headline import HeadlineRow

    def row(id_, finding, value, baseline="", verdict=""):
        return HeadlineRow(id_, id_, "test", finding, value, baseline, verdict)

    left = [
        row("a", "Accuracy (n=16)", "90%", "random 30%", "above: yes"),
        row("k", "Keys (n=70)", "25%"),
    ]
    right = [
        row("a", "Accuracy (n=14)", "80%", "random 31%", "above: yes"),
        row("r", "Recovery minus its null", "-5%", "null", "above the null: no"),
    ]
    assert side_by_side(left, right) == [
        ("Accuracy (n=16 / 14)", "90%", "random 30%", "above: yes", "80%", "random 31%",
         "above: yes"),
        ("Keys (n=70)", "25%", "", "", "-", "-", "-"),
        ("Recovery minus its null", "-", "-", "-", "-5%", "null", "above the null: no"),
    ]  # fmt: skip


def test_an_interval_of_equal_ends_is_said_not_printed():
    from goalprobe.report.blocks import stat_text

    assert stat_text({"value": 1.0, "ci_low": 1.0, "ci_high": 1.0}, percent=False) == (
        "1.000 (equal on every grid: no interval)"
    )
    assert stat_text({"value": 0.5, "ci_low": 0.25, "ci_high": 0.75}) == "50.0% [25.0%, 75.0%]"
