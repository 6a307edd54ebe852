"""``goalprobe demo`` end to end at the tiny scale, on the real bundled agent.

One session-scoped run of the whole pipeline (tests/demo_fixtures.py), the default agent with
the positive control beside it (about 2-3 minutes on 2 CPU cores), feeds every test: the artefacts of the viewer's run-directory
layout, caching (a rerun skips everything, ``force`` reruns one stage, a changed parameter reruns
exactly the stages downstream), the CLI, a report over a damaged run, and the report in headless
chromium (skipped, saying why, without
a chromium binary or playwright).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from viewer_fixtures import offline_page

from goalprobe.config import control_config, demo_config
from goalprobe.demo import run_demo
from goalprobe.report.headline import headline_rows
from goalprobe.report.page import SECTION_TITLES, write_report
from goalprobe.stages import CONTROL_STAGES, DEPENDS_ON, STAGES

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "demo"
VIEWER_LAYOUT = (
    "grids/grids.jsonl",
    "rollouts/trajectories.jsonl",
    "activations/activations.h5",
    "patching/patch_results.json",
    "scoring/belief.json",
    "scoring/meg.json",
    "report.html",
)
STAGE_OUTPUTS = (
    "behaviour/metrics.json",
    "iso/grids.jsonl",
    "iso/trajectories.jsonl",
    "iso/results.json",
    "keys/grids.jsonl",
    "keys/trajectories.jsonl",
    "keys/results.json",
    "harm/grids.jsonl",
    "harm/trajectories_neutral.jsonl",
    "harm/trajectories_moral.jsonl",
    "harm/results.json",
    "fog/grids.jsonl",
    "fog/trajectories.jsonl",
    "fog/results.json",
    "fog/activations.h5",
    "fog/map.json",
    "decision/lens.json",
    "decision/steps.jsonl",
    "plans/sweep.json",
    "plans/predicted/plan_decoder.h5",
)


def _downstream(stage: str) -> set[str]:
    """Every stage that reads ``stage`` directly or indirectly."""
    out: set[str] = set()
    frontier = {stage}
    while frontier:
        frontier = {s for s in STAGES if DEPENDS_ON[s] and set(DEPENDS_ON[s]) & frontier} - out
        out |= frontier
    return out


def tiny(root, overrides=None, **kwargs):
    """``run_demo`` at the tiny scale with the positive control beside the default agent (as
    ``goalprobe demo`` runs without --model), quietly."""
    config = demo_config("tiny", overrides=overrides)
    kwargs.setdefault("log", lambda _: None)
    return run_demo(root, config, progress=False, control=control_config(config), **kwargs)


@pytest.fixture
def demo(tiny_demo):
    """The session's tiny run (tests/demo_fixtures.py), as ``tiny`` runs it."""
    return tiny_demo


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_every_stage_runs_and_writes_the_viewer_layout(demo):
    result, lines = demo
    assert result.failed == {}, result.failed
    assert [o.status for o in result.stages.values()] == ["ran"] * len(STAGES), lines
    control = result.control
    assert control.run_dir == result.run_dir / "control" and control.report_path.is_file()
    assert control.config.agent.model == "bundled:map"
    assert list(control.stages) == list(CONTROL_STAGES)
    assert {o.status for o in control.stages.values()} == {"ran"}, lines
    root = result.run_dir
    for relative in VIEWER_LAYOUT + STAGE_OUTPUTS:
        assert (root / relative).is_file(), relative
    for stage in STAGES:
        record = json.loads((root / "stages" / f"{stage}.json").read_text())
        assert (
            record["config"]["config"]
            == json.loads((root / stage / "config.json").read_text())["config"]
        )
    probes = demo_config("tiny").probes.types
    families = demo_config("tiny").probes.families
    for probe in probes:
        for family in families:
            assert list((root / "probes/decoded").glob(f"cell_type_{probe}_{family}_*.h5"))
    from goalprobe.viewer.data import RunData

    run = RunData(root)
    assert run.missing == []
    assert run.fog_episodes() is not None and run.fog_episodes().episodes
    assert run.episodes and run.map_sources and run.plan_sources
    layers = {s.layer for s in run.map_sources.values()}
    stages = {s.stage for s in run.map_sources.values()}
    assert stages == {"pre_reasoning", "post_reasoning"} and len(layers) >= 2


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_outputs_carry_baselines_and_intervals(demo):
    result, _ = demo
    root = result.run_dir
    behaviour = json.loads((root / "behaviour/metrics.json").read_text())
    overall = behaviour["overall"]
    assert 0.0 <= overall["random_walk_success_rate"]["value"] <= 1.0
    assert overall["accuracy"]["n"] == len(behaviour["per_grid"])
    sweep = json.loads((root / "probes/sweeps/cell_coordinate_mlp.json").read_text())
    models = sweep["runs"][0]["metrics"]["models"]
    assert {"probe", "majority", "shuffled"} <= set(models)
    plans = json.loads((root / "plans/sweep.json").read_text())
    assert {r["kind"] for r in plans["runs"]} == {
        "decoder",
        "shuffled_control",
        "majority_plan",
        "state_only",
        "optimal_policy",
    }
    findings = [row.finding for row in headline_rows(root)]
    assert any("Per-action accuracy" in f for f in findings)
    assert any("Plan decoder" in f for f in findings)
    # issue 18's three questions reach the headline, each with its baseline; the bundled agent's
    # tokenizer cannot read the flower beds, so its harm rows answer n/a (issue 40), and the
    # intention row is descriptive (no verdict)
    for finding, verdict in (
        ("False-belief grids", "pipeline check (no verdict)"),
        ("Harms per episode, neutral prompt", "avoids harm beyond the shortest path: n/a ("),
        ("Moral conditioning", "conditioning reduces harm: n/a ("),
        ("Holding the key intended in KeyDoor", ""),
    ):
        (row,) = [r for r in headline_rows(root) if r.finding.startswith(finding)]
        assert row.verdict.startswith(verdict) and row.baseline, row
        if not verdict:
            assert row.kind == "descriptive" and row.verdict == "", row
    # fogged grids (issue 31): both agents, every policy with intervals, failure modes counted
    for run_dir in (root, root / "control"):
        fog = json.loads((run_dir / "fog/results.json").read_text())
        assert set(fog["policies"]) >= {"agent", "free_space", "random_walk"}
        assert fog["policies"]["free_space"]["acc_oracle_fog"]["value"] == 1.0
        agent_rows = [e for e in fog["episodes"] if e["policy"] == "agent"]
        assert agent_rows and all(e["moves"] >= 0 for e in agent_rows)
        assert fog["unknown_prompt_pieces"] and "*" in " ".join(fog["unknown_prompt_pieces"])


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_rerun_skips_every_stage(demo):
    result, _ = demo
    again = tiny(result.run_dir)
    assert {n: o.status for n, o in again.stages.items()} == {n: "cached" for n in STAGES}
    assert {o.status for o in again.control.stages.values()} == {"cached"}


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_the_report_waits_for_the_control_and_shows_both_agents(demo, tmp_path):
    """The control runs its own stages in RUN/control/; a change there reruns the control's
    stage and both reports (the default agent's report reads it), nothing else; the report
    puts the two agents' headline rows side by side with what each agent does and does not
    show."""
    result, _ = demo
    root = tmp_path / "both"
    shutil.copytree(result.run_dir, root)
    config = demo_config("tiny")
    changed = control_config(demo_config("tiny", overrides={"behaviour.random_walks_per_grid": 7}))
    again = run_demo(root, config, progress=False, log=lambda _: None, control=changed)
    assert {n for n, o in again.stages.items() if o.status == "ran"} == {"report"}
    assert {n for n, o in again.control.stages.items() if o.status == "ran"} == {
        "behaviour",
        "report",
    }
    page = (root / "report.html").read_text()
    assert SECTION_TITLES["agents"] in page and "bundled:map: value" in page
    assert (
        "the walls three or more steps from A" in page
    )  # the control's reading, from its model card text
    shutil.rmtree(root / "control")
    alone = write_report(root, out=tmp_path / "alone.html").read_text()
    assert "no positive-control run beside this one" in alone


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_an_interrupted_demo_resumes_where_it_stopped(demo):
    result, _ = demo
    root = result.run_dir
    # as if killed during scoring: its record (written last) and the report never happened
    for stage in ("scoring", "report"):
        (root / "stages" / f"{stage}.json").unlink()
    (root / "scoring" / "meg.json").unlink()
    resumed = tiny(root)
    ran = {n for n, o in resumed.stages.items() if o.status == "ran"}
    assert ran == {"scoring", "report"}
    assert (root / "scoring" / "meg.json").is_file()


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_force_reruns_that_stage_and_only_what_its_outputs_changed(demo):
    result, _ = demo
    root = result.run_dir
    report_before = (root / "stages/report.json").read_text()
    forced = tiny(root, force={"behaviour"})
    statuses = {n: o.status for n, o in forced.stages.items()}
    assert statuses["behaviour"] == "ran"
    # the metrics are a deterministic function of the trajectories: nothing downstream changed
    assert {n for n, s in statuses.items() if s == "ran"} == {"behaviour"}
    assert (root / "stages/report.json").read_text() == report_before

    grids = root / "grids" / "grids.jsonl"
    grids.write_text(grids.read_text() + "\n")  # stale bytes a forced stage must not keep
    redone = tiny(root, force={"grids"})
    assert redone.stages["grids"].status == "ran"
    assert not grids.read_text().endswith("\n\n")  # the output was rewritten from scratch
    # a seeded grid set is regenerated byte for byte, so nothing downstream reruns
    assert {n for n, o in redone.stages.items() if o.status == "ran"} == {"grids"}

    changed = tiny(root, overrides={"behaviour.random_walks_per_grid": 7})
    ran = {n for n, o in changed.stages.items() if o.status == "ran"}
    assert "behaviour" in ran and "report" in ran
    assert ran <= {"behaviour", "iso"} | _downstream("behaviour") | _downstream("iso")
    assert "rollouts" not in ran and "activations" not in ran


def test_the_control_runs_a_closed_set_of_stages():
    """Every stage the positive control runs has its inputs among them, and its report."""
    assert set(CONTROL_STAGES) <= set(STAGES) and CONTROL_STAGES[-1] == "report"
    for stage in CONTROL_STAGES[:-1]:
        assert set(DEPENDS_ON[stage]) <= set(CONTROL_STAGES), stage
    assert [s for s in STAGES if s in CONTROL_STAGES] == list(CONTROL_STAGES)


def test_unknown_forced_stage_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown stage"):
        run_demo(tmp_path, demo_config("tiny"), force={"nonsense"}, progress=False)


def test_configs_reject_bad_input():
    with pytest.raises(ValueError, match="unknown scale"):
        demo_config("huge")
    with pytest.raises(ValueError, match="unknown config field 'colour'"):
        demo_config("tiny", overrides={"colour": "red"})
    with pytest.raises(ValueError, match="unknown config field 'probes.colour'"):
        demo_config("tiny", overrides={"probes.colour": "red"})
    with pytest.raises(ValueError, match="base_url"):
        demo_config("tiny", backend="server")
    paper = demo_config("paper")
    assert (paper.grids.n_per_cell, paper.rollouts.episodes_per_grid) == (10, 10)
    assert paper.rollouts.temperature == 0.7
    nested = demo_config("tiny", overrides={"probes.training.max_epochs": 5})
    assert nested.probes.training.max_epochs == 5 and nested.distance.training.max_epochs == 2
    # a field of the library config a section embeds answers to its flat path too
    flat = demo_config("tiny", overrides={"patching.batch_size": 3, "patching.patch.seed": 4})
    assert (flat.patching.patch.batch_size, flat.patching.patch.seed) == (3, 4)
    assert (
        flat.patching
        == demo_config(
            "tiny", overrides={"patching.patch.batch_size": 3, "patching.seed": 4}
        ).patching
    )
    with pytest.raises(ValueError, match=r"seed is in \['grids', 'states'\]: name one"):
        demo_config("tiny", overrides={"probing.seed": 2})


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_report_of_a_damaged_run_shows_what_is_missing(demo, tmp_path):
    result, _ = demo
    damaged = tmp_path / "damaged"
    shutil.copytree(result.run_dir, damaged)
    shutil.rmtree(damaged / "probes")
    (damaged / "plans/sweep.json").write_text("{ not json")
    (damaged / "stages/patching.failed.json").write_text(
        json.dumps({"stage": "patching", "status": "failed", "error": "failed: RuntimeError: x"})
    )
    page = write_report(damaged).read_text()
    assert "not run: probes/sweeps/cell_*.json not found" in page
    assert "plans/sweep.json is unreadable" in page
    assert "failed: RuntimeError: x" in page
    assert page.count("<script type='text/javascript'>") == 1  # plotly.js inlined once


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_cli_ends_with_a_summary_that_fits_one_screen_at_80_columns(demo):
    """One line per headline verdict (both agents), then the report's path and the exact
    ``goalprobe view`` command, each on one line, every line within 80 columns."""
    import shlex

    from typer.testing import CliRunner

    from goalprobe.cli import app
    from goalprobe.report.run import RunReader
    from goalprobe.report.summary import summary_rows, verdict_lines

    result, _ = demo
    out = CliRunner().invoke(
        app,
        ["demo", "--run-dir", str(result.run_dir), "--scale", "tiny", "--no-progress"],
        env={"COLUMNS": "80"},
    )
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    tally = next(i for i, line in enumerate(lines) if line.startswith("goalprobe demo (tiny)"))
    assert "cached" in lines[tally]  # a rerun: (most) stages come from the cache
    summary = lines[tally + 1 :]
    assert all(len(line) <= 80 for line in summary), summary
    assert summary[0].startswith("Verdicts at 95%") and summary[0].endswith("bundled | bundled:map")
    run = RunReader(result.run_dir)
    agents = [headline_rows(run.root), headline_rows(run.layout.control.root)]
    expected = verdict_lines(summary_rows(agents), ["bundled", "bundled:map"])
    assert summary[:-2] == expected and len(expected) >= 11
    assert summary[-2] == f"report: {result.run_dir / 'report.html'}"
    assert summary[-1] == f"view: goalprobe view {shlex.quote(str(result.run_dir))}"
    assert len(summary) <= 40  # one screen


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_report_opens_in_headless_chromium_without_errors(demo):
    import playwright.sync_api as playwright_api

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "no chromium on PATH: scripts/setup_tests.sh installs Debian's 'chromium'"
    result, _ = demo
    report = result.run_dir / "report.html"
    for page_path in (report, result.run_dir / "control" / "report.html"):
        assert "failed to draw" not in page_path.read_text(), page_path  # every section drew
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        page, requests, problems = offline_page(browser, 1400, 1200)
        page.goto(report.as_uri())
        page.wait_for_selector("#plans .main-svg", timeout=60_000)
        headings = page.locator("h2").all_text_contents()
        n_plots = page.locator(".js-plotly-plot").count()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=False)
        browser.close()
    assert headings == list(SECTION_TITLES.values())
    assert n_plots >= 8
    assert requests == [] and problems == []


def test_a_stage_key_is_what_the_stage_receives():
    """The cache key comes from the config a stage is handed: changing a section reruns
    exactly the stages that receive it, and the agent enters by its identity (weights digest,
    precision), so another device means another key for every stage that runs the model."""
    from goalprobe.runner import config_hash
    from goalprobe.stages import stage

    def keys(config):
        return {name: config_hash(stage(name).receives(config)) for name in STAGES}

    base = keys(demo_config("tiny"))
    walks = keys(demo_config("tiny", overrides={"behaviour.random_walks_per_grid": 7}))
    assert {n for n in STAGES if walks[n] != base[n]} == {"behaviour", "iso", "report"}
    gpu = keys(demo_config("tiny", device="cuda"))
    changed = {n for n in STAGES if gpu[n] != base[n]}
    assert {"rollouts", "activations", "patching", "probes", "plans"} <= changed
    assert "grids" not in changed and "behaviour" not in changed
    identity = stage("activations").receives(demo_config("tiny"))
    from goalprobe.runner import config_to_dict

    agent = config_to_dict(identity)["agent"]
    assert agent["model"] == "bundled" and len(agent["weights_sha256"]) == 16
    assert agent["dtype"] == "float32"


def test_set_overrides_parse_json_values_and_refuse_malformed_ones():
    from goalprobe.commands.demo import parse_setting

    assert parse_setting("rollouts.temperature=0") == ("rollouts.temperature", 0)
    assert parse_setting("keys.sizes=[7, 9]") == ("keys.sizes", (7, 9))
    assert parse_setting("agent.device=cuda") == ("agent.device", "cuda")
    with pytest.raises(ValueError, match="section.field=value"):
        parse_setting("rollouts.temperature")
    config = demo_config("tiny", overrides=dict([parse_setting("keys.sizes=[9]")]))
    assert config.keys.sizes == (9,)


@pytest.mark.slow  # on a copy of the tiny demo's run: the probing set and its downstream (~60 s)
def test_two_jobs_run_every_stage_once_its_inputs_are_done_record_failures_and_survive_a_kill(
    demo, tmp_path
):
    """Stages in worker processes, on a copy of the one-job run whose probing stage must run
    again: a failing stage leaves exactly its downstream not run (the others are still done,
    the report says so). After the repair, one worker is SIGKILLed (as the out-of-memory killer
    would) while the two rerun that part: run_demo returns (no hang), the stage it ran is failed
    with the reason, nothing else is left half-done; a rerun finishes the study, and together
    the two reruns ran exactly that part. The probing prompts come out byte for byte as the
    one-job run's, the probe outputs compare equal (tests/run_digests.py: the ``--jobs 2`` half
    of test_reproducible.py's check) and the headline has the same rows."""
    import multiprocessing
    import os
    import signal
    import threading
    import time

    from run_digests import probe_differences

    result, _ = demo
    root = tmp_path / "parallel"
    shutil.copytree(result.run_dir, root)
    (root / "stages" / "probing.json").unlink()
    shutil.rmtree(root / "probing")
    (root / "probing").write_text("a file where the probing stage writes its folder\n")
    first = tiny(root, jobs=2)
    statuses = {n: o.status for n, o in first.stages.items()}
    assert list(first.stages) == list(STAGES)
    assert statuses["probing"] == "failed" and "probing" in first.failed
    assert {n for n, s in statuses.items() if s == "not_run"} == _downstream("probing") - {"report"}
    assert {n for n, s in statuses.items() if s == "cached"} == (
        set(STAGES) - _downstream("probing") - {"probing"}
    )
    assert statuses["report"] == "ran"  # it shows the failure
    assert json.loads((root / "stages/probing.failed.json").read_text())["traceback"]

    (root / "probing").unlink()
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(result=tiny(root, jobs=2)))
    runner.start()
    deadline = time.monotonic() + 60
    while not multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the workers are busy with the probing stage
    workers = multiprocessing.active_children()
    assert workers, "no worker process to kill"
    os.kill(workers[0].pid, signal.SIGKILL)
    runner.join(timeout=120)
    assert not runner.is_alive(), "run_demo hung after a worker died"
    killed = outcome["result"]
    died = [n for n, e in killed.failed.items() if "worker process died" in e]
    assert died, killed.failed
    assert all(o.status in ("ran", "cached", "failed", "not_run") for o in killed.stages.values())

    second = tiny(root, jobs=2)
    assert second.failed == {}
    assert second.report_path is not None
    ran = {n for run in (killed, second) for n, o in run.stages.items() if o.status == "ran"}
    assert ran == _downstream("probing") | {"probing"}  # the HDF5 store's bytes are new
    assert (root / "probing/states.jsonl").read_bytes() == (
        result.run_dir / "probing/states.jsonl"
    ).read_bytes()
    different, detail = probe_differences(root, result.run_dir)
    assert not different, (different, detail)
    assert [r.finding for r in headline_rows(root)] == [
        r.finding for r in headline_rows(result.run_dir)
    ]


def test_every_stage_declares_the_stages_whose_outputs_it_reads():
    """Parallel stages rely on DEPENDS_ON: every run-directory path a stage module (or the
    helpers it runs: decoding, scoring I/O) names belongs to that stage, a stage it reads
    (directly or through its inputs), or the run's bookkeeping."""
    import ast
    import inspect

    from goalprobe.run_layout import ARTEFACTS, RunLayout
    from goalprobe.stages import decode

    layout = RunLayout(Path("/run"))
    owner = {a.relative.rstrip("/"): a.stage for a in ARTEFACTS.values()}

    def stage_of(attribute: str) -> str | None:
        value = getattr(layout, attribute, None)
        if callable(value):  # e.g. probe_sweep(name), harm_trajectories(condition)
            for argument in ("x", "neutral"):
                try:
                    value = value(argument)
                    break
                except (TypeError, KeyError, ValueError):
                    continue
            else:
                return None
        if not isinstance(value, Path) or not value.is_relative_to("/run"):
            return None
        relative = value.relative_to("/run").as_posix()
        matches = [
            r
            for r in owner
            if relative == r or relative.startswith(r + "/") or r.startswith(relative + "/")
        ]
        return owner[max(matches, key=len)] if matches else None

    def reads(source: str) -> set[str]:
        names = {
            node.attr
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "layout"
        }
        return {s for s in map(stage_of, names) if s is not None}

    def upstream(stage: str) -> set[str]:
        out, frontier = set(), {stage}
        while frontier:
            frontier = {d for s in frontier for d in DEPENDS_ON[s]} - out
            out |= frontier
        return out

    helpers = {
        "false_belief": [decode],
        "intention_map": [decode],
    }
    checked = 0
    for stage in STAGES:
        module = __import__(f"goalprobe.stages.{stage}", fromlist=["run"])
        sources = [inspect.getsource(module), *map(inspect.getsource, helpers.get(stage, []))]
        found = set().union(*map(reads, sources))
        undeclared = found - {stage, "demo"} - upstream(stage)
        assert not undeclared, f"stage {stage} reads outputs of {undeclared} without DEPENDS_ON"
        checked += len(found)
    assert checked > len(STAGES)  # the check saw the stages' reads


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_readme_assets_renders_the_results_page_of_a_run(demo):
    """``scripts/readme_assets.py`` makes docs/results.md from a run: what the run was, both
    agents' headline side by side and a reading of each agent; the page reads back to its
    parts."""
    import importlib.util
    import sys

    from goalprobe.report.agents import side_by_side_markdown

    result, _ = demo
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "readme_assets", root / "scripts" / "readme_assets.py"
    )
    assets = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("readme_assets", assets)
    spec.loader.exec_module(assets)
    command = assets.demo_command(result.run_dir)
    assert command == f"goalprobe demo --scale tiny --run-dir {result.run_dir}"
    page = assets.page_from_run(result.run_dir, command=command, figure="")
    assert assets.parse(assets.render(page)) == page
    assert page.headline == side_by_side_markdown(result.run_dir)
    assert "torch" in page.provenance["environment"] and command in page.provenance["command"]
    assert set(page.readings) == {"bundled", "bundled:map"}
    assert any(
        b.startswith("- **Behaviour.** Per-action accuracy") for b in page.readings["bundled"]
    )
    assert any(b.startswith("- **Causality.** Patching") for b in page.readings["bundled:map"])


@pytest.mark.slow  # on the tiny demo's run (its fixture runs the demo, ~40 s)
def test_goalprobe_score_gives_the_scoring_stage_numbers(demo, tmp_path):
    """The verb and the stage go through one function with one choice of headline maps: on a
    copy of each agent's run, ``goalprobe score`` (the demo's bootstrap and seed) writes the
    same belief and MEG numbers as the demo's scoring stage."""
    import json

    from typer.testing import CliRunner

    from goalprobe.cli import app

    result, _ = demo
    config = demo_config("tiny").scoring
    for run_dir in (result.run_dir, result.run_dir / "control"):
        copy = tmp_path / run_dir.name
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("scoring", "control"))
        out = CliRunner().invoke(
            app,
            [
                "score",
                str(copy),
                "--n-bootstrap",
                str(config.n_bootstrap),
                "--seed",
                str(config.random_state),
                "--no-progress",
            ],
        )
        assert out.exit_code == 0, out.output
        for name in ("belief.json", "meg.json"):
            stage = json.loads((run_dir / "scoring" / name).read_text())
            verb = json.loads((copy / "scoring" / name).read_text())
            for key in ("created", "package_version"):
                stage.pop(key), verb.pop(key)
            verb["config"]["n_jobs"] = stage["config"]["n_jobs"]
            assert verb == stage, (run_dir, name)
        belief = json.loads((run_dir / "scoring" / "belief.json").read_text())
        headline = belief["probes"][belief["default_probe"]]
        assert belief["default_probe"].startswith("headline_pre_reasoning_L")
        assert headline["readout"]["agent"] == "position probe"
        assert headline["trained_on"] == "probing"
        assert {"other_grid", "prior"} <= set(headline["nulls"])


@pytest.mark.slow  # the tiny demo end to end (~40 s): the full suite runs it
def test_the_control_runs_the_false_belief_grids_with_the_position_read_out(demo):
    import json

    from goalprobe.probes.decoded_maps import read_step_maps

    result, _ = demo
    control = result.run_dir / "control" / "false_belief"
    data = json.loads((control / "results.json").read_text())
    assert data["decoding"]["available"]
    assert json.loads(data["decoding"]["readout"])["goal"] == "position probe"
    stale = data["behaviour"]["stale_goal"]["false_belief"]
    assert {"episodes_decoded_goal_shown", "acc_dec", "acc_gt_decoded_steps"} <= set(stale)
    maps = read_step_maps(control / "decoded_maps.h5")
    assert maps.goal is not None and maps.goal.shape == maps.probs.shape[:3]


@pytest.mark.slow  # on the tiny demo's run
def test_the_viewer_places_the_false_belief_agent_and_goal_with_the_position_readouts(demo):
    """The viewer's false-belief step decodes the agent's and goal's cells with the position
    read-outs stored beside the step maps (decoded-map schema 2), like scoring does."""
    import numpy as np
    from goalprobe.viewer.data import RunData
    from goalprobe.viewer.step import build_false_belief_step

    result, _ = demo
    for run_dir in (result.run_dir, result.run_dir / "control"):
        run = RunData(run_dir)
        fb = run.false_belief_episodes()
        assert fb is not None and fb.readouts, run_dir
        key = next(
            k
            for k in fb.episodes
            if any((s.grid_id, s.episode, s.step) in fb.readouts for s in fb.episodes[k].steps)
        )
        steps = fb.episodes[key].steps
        t = next(i for i, s in enumerate(steps) if (s.grid_id, s.episode, s.step) in fb.readouts)
        view = build_false_belief_step(run, key, t)
        agent, goal = fb.readouts[(steps[t].grid_id, steps[t].episode, steps[t].step)]
        n = fb.grids[steps[t].grid_id].size
        assert view.decoded is not None
        want = np.unravel_index(np.argmax(agent[:n, :n]), (n, n))
        assert tuple(int(x) for x in view.decoded.agent_row_col) == tuple(int(x) for x in want)


@pytest.mark.slow  # on the tiny demo's run
def test_the_probes_stage_writes_both_wall_frames_and_the_decoded_walls_use_them(demo):
    """Issue 39: the wall read-out file holds both frames (rings in the agent frame, verdicts
    with their power) for both agents, and the headline decoded maps take the agent-centred
    read-out within three steps of the decoded agent, the conditional probe elsewhere."""
    from goalprobe.probes.decoded_maps import CONDITIONAL_READOUT, read_decoded_maps, top1_cell

    from goalprobe.run_layout import RunLayout

    result, _ = demo
    for root in (result.run_dir, result.run_dir / "control"):
        layout = RunLayout(root)
        walls = json.loads(layout.wall_readout.read_text())
        assert walls["schema"] == "goalprobe.wall_readouts/2" and walls["readouts"]
        for r in walls["readouts"]:
            assert set(r["frames"]) == {"absolute", "agent"}
            # rings of steps from A; a ring with no held-out prior-uncertain cell is left out
            assert {"1", "2"} <= set(r["frames"]["agent"]["rings"]) <= set("123456")
            for verdict in r["verdicts"].values():
                # the tiny probing set is not the power curve's design: never a "no"
                assert not r["power"]["applies"] and verdict["verdict"] in ("yes", "undecided")
        rows = {row.id: row for row in headline_rows(root)}
        assert {"walls.absolute", "walls.agent"} <= set(rows)
        assert rows["walls.agent"].answer in ("yes", "undecided")
        (path,) = layout.decoded_dir.glob("headline_pre_reasoning_L*.h5")
        maps = read_decoded_maps(path)
        assert maps.readout.walls == CONDITIONAL_READOUT and maps.readout.agent_wall_probe
        assert maps.wall_source is not None
        assert maps.agent is not None  # the position read-out: the decoded agent
        for i in range(len(maps.probs)):
            src = maps.wall_source[i]
            n = int(np.max(np.nonzero(src.any(axis=0))[0])) + 1  # the grid's side
            r0, c0 = top1_cell(maps.agent[i], n)
            near = [
                (r, c)
                for r in range(max(r0 - 3, 0), min(r0 + 4, n))
                for c in range(max(c0 - 3, 0), min(c0 + 4, n))
                if (r, c) != (r0, c0)
            ]
            assert all(src[r, c] == 2 for r, c in near)  # agent-centred near A
            assert src[r0, c0] == 1  # A's own cell is no offset: the conditional probe's
