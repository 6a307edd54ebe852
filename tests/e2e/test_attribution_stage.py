"""The ``attribution`` demo stage (issue 41) on a real tiny run of the bundled agent: the stage
runs under the scheduler after ``patching`` on its pairs, ``goalprobe attribute`` on the same
pairs writes the same bytes (one task function), the report shows where the coordinates are
read from with its headline row, and the viewer's step view draws the step's heat map."""

from __future__ import annotations

import json

import pytest
from goalprobe.probes.attribution import REGIONS, read_attributions

from goalprobe.config import demo_config
from goalprobe.run_layout import RunLayout
from goalprobe.scheduler import StageBook, run_in_order
from goalprobe.stages.attribution import read_check

pytestmark = pytest.mark.slow

STAGES = ("grids", "rollouts", "activations", "decision", "patching", "attribution")
FILES = (
    "attribution.json",
    "attribution.safetensors",
    "attribution_check.json",
    "attribution_heatmap.html",
)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny scale's stages up to ``attribution`` for the default agent, under the
    scheduler."""
    root = tmp_path_factory.mktemp("attr_stage") / "run"
    config = demo_config("tiny")
    book = StageBook(RunLayout(root), config, set(), True, lambda _: None, stages=STAGES)
    run_in_order([book], progress=False)
    return root, config


def test_the_stage_attributes_the_patching_pairs(tiny_run):
    root, config = tiny_run
    records, card = read_attributions(root / "attribution" / "attribution")
    kept = [json.loads(line) for line in (root / "patching" / "patch_pairs.jsonl").open()]
    wanted = [p["pair_id"] for p in kept if p["kind"] == "disjoint"][: config.attribution.max_pairs]
    assert wanted and [r.pair_id for r in records if r.metric == records[0].metric] == wanted
    assert card["pairs"] == "patching/patch_pairs.jsonl"
    assert card["input"] == "rollouts/trajectories.jsonl" and card["counterfactuals"] is None
    assert card["config"] == {"metrics": ["action", "coordinates"], "positions": "prompt",
                              "grad_drop": True}  # fmt: skip
    top = card["top_region"]["coordinates"]
    assert top["region"] in REGIONS and 0 <= top["share"]["value"] <= 1
    if top["n_grids"] > 1:
        assert top["share"]["ci_low"] <= top["share"]["value"] <= top["share"]["ci_high"]
    assert top["n_pairs"] == len(wanted)
    check = read_check(root / "attribution" / "attribution_check.json")
    assert {e["pair_id"] for entries in check["metrics"].values() for e in entries} == {wanted[0]}


def test_the_verb_writes_the_stage_bytes(tiny_run, goalprobe_cli, monkeypatch, tmp_path):
    root, config = tiny_run
    a, p = config.attribution, config.patching.patch
    monkeypatch.chdir(root)
    result = goalprobe_cli(
        "attribute", "--trajectories", "rollouts/trajectories.jsonl",
        "--pairs", "patching/patch_pairs.jsonl", "--out", tmp_path / "verb",
        "--reasoning", p.reasoning,
        "--require-optimal" if p.require_optimal else "--no-require-optimal",
        "--max-new-tokens", p.max_new_tokens, "--kinds", ",".join(a.kinds),
        "--max-pairs", a.max_pairs, "--check-pairs", a.check_pairs, "--top-k", a.top_k,
        "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in FILES:
        stage_bytes = (root / "attribution" / name).read_bytes()
        assert (tmp_path / "verb" / name).read_bytes() == stage_bytes, name


def test_the_report_says_where_the_coordinates_are_read_from(tiny_run):
    from goalprobe.report.headline import headline_rows
    from goalprobe.report.page import SECTION_TITLES, write_report

    root, _ = tiny_run
    page = write_report(root).read_text(encoding="utf-8")
    assert SECTION_TITLES["attribution"] in page
    section = page[page.index(SECTION_TITLES["attribution"]) :]
    assert "Default agent" in section and "read most from" in section
    assert "rho GradDrop vs |effect|" in section  # the check against real patches
    row = next(r for r in headline_rows(root) if r.id == "attribution.where_read")
    top = json.loads((root / "attribution" / "attribution.json").read_text())["top_region"]
    assert row.kind == "descriptive" and not row.verdict
    assert row.value.startswith(top["coordinates"]["region"].replace("_", " "))


def test_the_step_view_draws_the_steps_heat_map(tiny_run):
    from goalprobe.viewer.data import RunData
    from goalprobe.viewer.step import build_step_view, step_figures

    root, _ = tiny_run
    records, _ = read_attributions(root / "attribution" / "attribution")
    run = RunData(root)
    base = records[0].pair_id.rsplit("/", 1)[0]
    episode = next(
        key
        for key, info in run.episodes.items()
        if base.startswith(f"{run.header.run_id}/{info.grid_id}/{info.episode}/")
    )
    step = int(base.rsplit("/", 1)[1])
    view = build_step_view(run, episode, step)
    assert {r.pair_id for r in view.attribution} >= {records[0].pair_id}
    figure = step_figures(view)["attribution"]
    heat = [t for t in figure.data if t.type == "heatmap"]
    assert heat and records[0].pair_id in figure.layout.title.text
    other = build_step_view(run, episode, step + 1) if step + 1 < view.n_steps else None
    if other is not None and not other.attribution:
        assert not [t for t in step_figures(other)["attribution"].data if t.type == "heatmap"]


def test_the_viewer_shows_the_heat_map_in_a_browser(tiny_run, tmp_path):
    """``goalprobe view`` on the tiny run, in headless chromium: the step of the first
    attributed pair shows the attribution card with a drawn heat map of that pair."""
    import shutil
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path
    from urllib.parse import quote

    import httpx
    import playwright.sync_api as playwright_api
    from goalprobe.viewer.data import RunData

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "no chromium on PATH: scripts/setup_tests.sh installs Debian's 'chromium'"
    root, _ = tiny_run
    records, _ = read_attributions(root / "attribution" / "attribution")
    run = RunData(root)
    base = records[0].pair_id.rsplit("/", 1)[0]
    episode = next(
        key
        for key, info in run.episodes.items()
        if base.startswith(f"{run.header.run_id}/{info.grid_id}/{info.episode}/")
    )
    step = int(base.rsplit("/", 1)[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = (
        "import typer; from goalprobe.commands.view import command; "
        "app = typer.Typer(); app.command()(command); app()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", serve, str(root), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[2],
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "the viewer exited early"
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the viewer did not answer within 90 s"
            time.sleep(0.3)
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1600, "height": 1300})
            problems: list[str] = []
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{url}?episode={quote(episode)}&step={step}")
            page.wait_for_selector("#g-attribution .js-plotly-plot", timeout=60_000)
            page.wait_for_function(
                "(id) => { const p = document.querySelector('#g-attribution .js-plotly-plot');"
                " return p && p.layout && p.layout.title && p.layout.title.text.includes(id); }",
                arg=records[0].pair_id,
                timeout=60_000,
            )
            drawn = page.evaluate(
                "() => document.querySelector('#g-attribution .js-plotly-plot').data"
                ".filter(t => t.type === 'heatmap').length"
            )
            assert drawn > 0
            assert page.locator("#attribution-card").is_visible()
            assert problems == []
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
