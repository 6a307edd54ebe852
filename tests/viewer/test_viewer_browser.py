"""The viewer in a real headless browser against a real server on 127.0.0.1.

The server is ``goalprobe view RUN --port P`` in a subprocess (the command's own code path);
the browser is Debian's chromium driven by playwright. Screenshots go to
``test-artifacts/viewer/`` (gitignored). Skipped, saying why, without a chromium binary.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import playwright.sync_api as playwright_api
import pytest
from goalprobe.gridworld.core import Action
from viewer_fixtures import offline_page, shared_run

# The README's test command installs Chromium (scripts/setup_tests.sh) and playwright (test
# extras): a machine without them fails here rather than skipping the viewer's browser tests.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "viewer"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SERVE = (
    "import typer; from goalprobe.commands.view import command; "
    "app = typer.Typer(); app.command()(command); app()"
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def server(run_dir):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(run_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[2],
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 90
    try:
        while True:
            if proc.poll() is not None:
                output = proc.stdout.read().decode(errors="replace")
                pytest.fail(f"the viewer exited early with code {proc.returncode}:\n{output}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the viewer did not answer within 90 s")
            time.sleep(0.3)
        yield {"url": url, "port": port, "pid": proc.pid}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM, "no chromium on PATH: scripts/setup_tests.sh installs Debian's 'chromium'"
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser, server):
    """One page for the app tests, loaded once (they run in order on the same page: loading
    the app costs seconds of the browser's time on a small machine)."""
    context = browser.new_context(viewport={"width": 1600, "height": 1300})
    page = context.new_page()
    page.console_problems = []
    page.on(
        "console",
        lambda m: (
            page.console_problems.append(f"{m.type}: {m.text}") if m.type == "error" else None
        ),
    )
    page.on("pageerror", lambda e: page.console_problems.append(f"pageerror: {e}"))
    page.goto(server["url"])
    page.wait_for_selector("#g-decoded .js-plotly-plot .hm", timeout=30_000)
    _wait_header(page, "step 0 of")
    yield page
    page.context.close()


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _figure(page, graph_id: str) -> dict:
    """The data plotly drew in a dcc.Graph (heatmap z and hover text of the first trace)."""
    return page.evaluate(
        """(id) => {
            const plot = document.getElementById(id).querySelector('.js-plotly-plot');
            const t = plot.data[0];
            return {z: t.z, customdata: t.customdata || null, title: plot.layout.title.text};
        }""",
        graph_id,
    )


def _wait_header(page, text: str) -> None:
    page.wait_for_function(
        "(t) => document.querySelector('#step-header').textContent.includes(t)", arg=text
    )


def test_app_loads_and_lists_missing_artefacts(page):
    header = page.text_content(".gp-header")
    assert "cognitive-map viewer" in header and "8 episodes" in header
    notice = page.text_content("#missing-notice")
    assert "scoring/meg.json" in notice and "report.html" in notice
    assert "probe: mlp · pre · layer 5" in page.text_content("#step-header")
    decoded = _figure(page, "g-decoded")
    assert decoded["title"].startswith("Decoded cognitive map")
    assert "P(" in decoded["customdata"][1][1]
    _shot(page, "app_loaded")
    assert page.console_problems == []


def test_first_screen_has_a_decoded_map_in_every_map_panel(page):
    for graph in ("g-decoded", "g-prob"):
        assert page.locator(f"#{graph} .js-plotly-plot .hm").count() == 1
    assert "no decoded map" not in page.text_content("#step-header")
    why = page.text_content("#mapped-why")
    assert "test grids" in why
    overflow = page.evaluate(
        """() => [...document.querySelectorAll('.gp-side *, #step-header *')]
            .filter(e => e.children.length === 0 && e.scrollWidth > e.clientWidth + 1
                    && getComputedStyle(e).overflow !== 'visible')
            .map(e => e.textContent)"""
    )
    assert overflow == []


def test_plan_strip_colours_agree_with_its_caption(page):
    strip = page.evaluate(
        """() => {
            const plot = document.querySelector('#g-strip .js-plotly-plot');
            return {z: plot.data[0].z, title: plot.layout.title.text};
        }"""
    )
    from goalprobe.viewer.figures.plans import STRIP_COLOURS

    match = list(STRIP_COLOURS).index("match")
    green = strip["z"][0].count(match)
    m = re.search(r"the first (\d+) of (\d+) executed tokens", strip["title"])
    if m:
        assert green == int(m.group(1))
    else:
        m = re.search(r"all (\d+) executed tokens match", strip["title"])
        assert m and green == int(m.group(1))
    padding = list(STRIP_COLOURS).index("padding")
    executed = strip["z"][1]
    assert all(d != match for d, e in zip(strip["z"][0], executed, strict=True) if e == padding)


def test_arrow_keys_step_through_the_episode_and_the_url_keeps_the_selection(page, browser):
    page.locator(".gp-header h1").click()
    page.keyboard.press("ArrowRight")
    _wait_header(page, "step 1 of")
    page.wait_for_function("() => window.location.search.includes('step=1')")
    url = page.url
    assert "episode=" in url and "layer=5" in url and "family=mlp" in url
    page.keyboard.press("ArrowLeft")
    _wait_header(page, "step 0 of")
    page.wait_for_function("() => window.location.search.includes('step=0')")
    # a second page opened on the shared URL shows the same selection
    other = browser.new_page(viewport={"width": 1600, "height": 1300})
    shared = url.replace("layer=5", "layer=3")
    other.goto(shared)
    other.wait_for_selector("#g-decoded .js-plotly-plot .hm", timeout=30_000)
    _wait_header(other, "step 1 of")
    _wait_header(other, "probe: mlp · pre · layer 3")
    other.wait_for_function("() => window.location.search.includes('layer=3')")
    other.close()
    assert page.console_problems == []


def test_choosing_another_step_changes_the_rendered_map(page):
    before_true, before_decoded = _figure(page, "g-true"), _figure(page, "g-decoded")
    reasoning_before = page.text_content("#reasoning")
    page.click("#next")
    _wait_header(page, "step 1 of")
    page.wait_for_function(
        "(z) => JSON.stringify(document.querySelector('#g-true .js-plotly-plot').data[0].z) !== z",
        arg=json.dumps(before_true["z"]),
    )
    after_true, after_decoded = _figure(page, "g-true"), _figure(page, "g-decoded")
    assert after_true["z"] != before_true["z"]  # the agent moved
    assert after_decoded["customdata"] != before_decoded["customdata"]
    assert page.text_content("#reasoning") != reasoning_before
    # a click on the timeline selects that step
    page.locator("#timeline .nsewdrag").click(position={"x": 5, "y": 10})
    _wait_header(page, "step 0 of")
    _shot(page, "step_changed")
    assert page.console_problems == []


def test_layer_selector_switches_the_probe(page):
    before = _figure(page, "g-decoded")["customdata"]
    page.click("#layer")
    page.get_by_text("layer 3", exact=True).last.click()
    _wait_header(page, "probe: mlp · pre · layer 3")
    after = _figure(page, "g-decoded")["customdata"]
    assert after != before
    page.get_by_text("post-reasoning").click()
    _wait_header(page, "probe: mlp · post")
    _shot(page, "layer_selected")
    assert page.console_problems == []


def test_hovering_a_cell_shows_its_class_probabilities(page):
    box = page.locator("#g-decoded .nsewdrag").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    page.wait_for_selector("#g-decoded .hoverlayer .hovertext", timeout=10_000)
    text = page.text_content("#g-decoded .hoverlayer")
    assert re.search(r"row \d+, col \d+", text) and "P(" in text and "true:" in text
    _shot(page, "hover")


def test_run_overview_scores_the_plan_decoders(page):
    page.get_by_text("Run overview").click()
    page.wait_for_selector("#g-prefix .js-plotly-plot .scatterlayer", timeout=20_000)
    names = page.evaluate(
        "() => document.querySelector('#g-prefix .js-plotly-plot').data.map(t => t.name)"
    )
    # small multiples: one panel per stage (2) x layer (1), a 0.25^N baseline in each
    assert names.count("random 0.25^N") == 2
    assert sum(n.endswith("-layer decoder") for n in names) == 4
    assert "0.25^N" in page.text_content("#prefix-caption")
    probes = page.evaluate(
        "() => document.querySelector('#g-probes .js-plotly-plot').data.map(t => t.name)"
    )
    for control in ("majority class per cell", "prior by grid size", "same probe, shuffled labels"):
        assert control in probes
    overflow = page.evaluate(
        """() => [...document.querySelectorAll('#overview p, #overview h4, .gp-header *')]
            .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"""
    )
    assert overflow == []
    _shot(page, "overview")
    page.get_by_text("Episode explorer").click()
    assert page.console_problems == []


def test_overview_shows_true_shown_and_decoded_maps_of_false_belief_grids(page):
    page.get_by_text("Run overview").click()
    page.wait_for_selector("#g-false-belief-2 .js-plotly-plot .hm", timeout=20_000)
    for i in range(3):
        drawn = page.evaluate(
            """(id) => {
                const plot = document.getElementById(id).querySelector('.js-plotly-plot');
                return {
                    heatmaps: plot.data.filter(t => t.type === 'heatmap').map(t => t.z),
                    rings: plot.data.filter(t => t.type === 'scatter').length,
                    titles: (plot.layout.annotations || []).map(a => a.text),
                };
            }""",
            f"g-false-belief-{i}",
        )
        assert drawn["titles"][:3] == [
            "true grid",
            "shown to the agent (oracle belief)",
            "decoded map",
        ]
        true, shown, decoded = drawn["heatmaps"]
        assert true != shown  # the prompt drew another grid
        assert decoded == shown  # the fixture's stand-in probe reads the prompt
        assert drawn["rings"] == 3  # the differing cells are ringed in every panel
    overflow = page.evaluate(
        """() => [...document.querySelectorAll('#overview p')]
            .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"""
    )
    assert overflow == []
    _shot(page, "false_belief")
    page.get_by_text("Episode explorer").click()
    assert page.console_problems == []


def _false_belief_maps(page) -> dict:
    """What plotly drew in the false-belief tab's three-panel figure."""
    return page.evaluate(
        """() => {
            const plot = document.querySelector('#g-fb-maps .js-plotly-plot');
            const rings = plot.data.find(t => t.type === 'scatter');
            return {
                heatmaps: plot.data.filter(t => t.type === 'heatmap').map(t => t.z),
                rings: rings ? rings.y.map((r, i) => [r, rings.x[i]]) : [],
                titles: (plot.layout.annotations || []).map(a => a.text),
            };
        }"""
    )


def _wait_false_belief_step(page, grid_id: str, step: int) -> None:
    """Until the false-belief tab's header and figure both show ``step`` of a ``grid_id`` episode."""
    page.wait_for_function(
        """([title, header]) => {
            const plot = document.querySelector('#g-fb-maps .js-plotly-plot');
            const h = document.querySelector('#fb-header');
            return plot && h && (plot.layout.title.text || '').endsWith(title)
                && h.textContent.includes(header);
        }""",
        arg=[f"{grid_id}, step {step}", f"step {step} of"],
        timeout=20_000,
    )


def _check_false_belief_panels(drawn: dict, recorded: list, agent: int) -> None:
    assert drawn["titles"][:3] == ["true grid", "shown to the agent (oracle belief)", "decoded map"]
    true, shown, decoded = drawn["heatmaps"]  # three map panels
    assert sorted(map(tuple, drawn["rings"])) == sorted(recorded)  # the recorded cells, ringed
    for r, c in recorded:
        if true[r][c] != agent:  # the agent may stand on a phantom wall
            assert true[r][c] != shown[r][c]
    assert decoded == shown  # the fixture's stand-in probe decodes the prompt


def test_false_belief_tab_steps_through_an_episode_with_three_maps(page, browser, run_dir):
    from goalprobe.gridworld.core import CellType
    from goalprobe.gridworld.false_belief import FALSE_BELIEF, pair_facts
    from goalprobe.viewer.data import RunData

    fb = RunData(run_dir).false_belief_episodes()
    lying = [
        k
        for k, e in fb.episodes.items()
        if pair_facts(fb.grids[e.summary.grid_id])["role"] == FALSE_BELIEF
    ]
    key = lying[-1]  # not the tab's default (its first false-belief episode)
    recorded = [tuple(c) for c in pair_facts(fb.grids[key.split(":")[0]])["differs"]]
    page.get_by_text("False-belief episodes", exact=True).click()
    page.wait_for_selector("#g-fb-maps .js-plotly-plot .hm", timeout=20_000)
    page.click("#fb-episode")
    page.get_by_text(fb.label(key), exact=True).last.click()
    grid_id = key.split(":")[0]
    _wait_false_belief_step(page, grid_id, 0)
    page.wait_for_function(
        "(k) => new URLSearchParams(window.location.search).get('fb') === k", arg=key
    )
    header = page.text_content("#fb-header")
    assert "false belief:" in header
    assert "on the shown grid" in header and "on the true grid" in header
    _check_false_belief_panels(_false_belief_maps(page), recorded, int(CellType.AGENT))
    page.locator(".gp-header h1").click()
    page.keyboard.press("ArrowRight")
    _wait_false_belief_step(page, grid_id, 1)
    page.wait_for_function("() => window.location.search.includes('fb_step=1')")
    assert "view=false_belief" in page.url
    _check_false_belief_panels(_false_belief_maps(page), recorded, int(CellType.AGENT))
    _shot(page, "false_belief_episode")
    # the last step has no decoded map in the fixture: the third panel says why, inside it
    last = len(fb.episodes[key].steps) - 1
    other = browser.new_page(viewport={"width": 1600, "height": 1300})
    other.goto(re.sub(r"fb_step=\d+", f"fb_step={last}", page.url))
    _wait_false_belief_step(other, grid_id, last)
    drawn = _false_belief_maps(other)
    assert len(drawn["heatmaps"]) == 2
    assert any(t.startswith("No decoded map for this") for t in drawn["titles"])
    other.close()
    page.keyboard.press("ArrowLeft")
    _wait_false_belief_step(page, grid_id, 0)
    page.get_by_text("Episode explorer").click()
    assert page.console_problems == []


def test_reasoning_is_coloured_by_the_lens_chunk_by_chunk(browser, server, run_dir):
    # issue 30: the step view draws the reasoning in the decision stage's chunks, each coloured
    # by the action the lens names at its end, with the legend and the final action; a step the
    # stage did not read says so
    from goalprobe.probes.decision_steps import read_decision_steps
    from goalprobe.viewer.data import RunData
    from goalprobe.viewer.figures.style import ACTION_COLOURS

    run = RunData(run_dir)
    lens = read_decision_steps(run_dir / "decision" / "steps.jsonl")
    key = list(run.episodes)[0]
    steps = run.episode(key).steps
    read = [t for t, s in enumerate(steps) if (s.grid_id, s.episode, s.step) in lens.steps]
    t = read[-1]
    record = lens.steps[(steps[t].grid_id, steps[t].episode, steps[t].step)]
    page = browser.new_page(viewport={"width": 1600, "height": 1300})
    page.goto(f"{server['url']}?episode={key}&step={t}&stage=pre_reasoning&layer=5&family=mlp")
    page.wait_for_selector("#g-decoded .js-plotly-plot .hm", timeout=30_000)
    _wait_header(page, f"step {t} of")
    page.wait_for_selector("#reasoning .gp-chunk", timeout=20_000)
    chunks = page.evaluate(
        """() => [...document.querySelectorAll('#reasoning .gp-chunk')].map(s => ({
            text: s.textContent, action: s.dataset.action, end: s.dataset.end,
            background: getComputedStyle(s).backgroundColor, title: s.title}))"""
    )
    assert [c["text"] for c in chunks] == [c.text for c in record.chunks]
    assert "".join(c["text"] for c in chunks) == steps[t].reasoning
    # each chunk's colour is its decoded action's (the planted decision time: another action
    # on the first half of the chunks, the answered one after)
    assert [c["action"] for c in chunks] == [c.decoded().name for c in record.chunks]
    assert [int(c["end"]) for c in chunks] == [c.end for c in record.chunks]
    assert {c["action"] for c in chunks} == {record.action.name, record.chunks[0].decoded().name}
    for c in chunks:
        r, g, b = (int(ACTION_COLOURS[int(Action[c["action"]])][i : i + 2], 16) for i in (1, 3, 5))
        assert c["background"].replace(" ", "").startswith(f"rgba({r},{g},{b},")
        assert "lens after block 1" in c["title"]
    legend = page.text_content("#reasoning-legend")
    assert all(a.name in legend for a in Action)
    texts = page.text_content("#texts")
    assert f"final action {record.action.name}" in texts
    assert "agent and goal: position probes" in page.text_content("#step-header")
    _shot(page, "reasoning_lens")
    # the episode's last step was not read: plain text, and why
    last = len(steps) - 1
    page.goto(f"{server['url']}?episode={key}&step={last}&stage=pre_reasoning&layer=5&family=mlp")
    page.wait_for_selector("#g-decoded .js-plotly-plot .hm", timeout=30_000)
    _wait_header(page, f"step {last} of")
    page.wait_for_selector("#reasoning-why", timeout=20_000)
    assert "No logit lens for this step" in page.text_content("#reasoning-why")
    assert page.locator("#reasoning .gp-chunk").count() == 0
    assert page.text_content("#reasoning") == (steps[last].reasoning or "(none)")
    # the linear probe's maps carry no position read-out: the header says the cell probe
    page.goto(f"{server['url']}?episode={key}&step=0&stage=pre_reasoning&layer=5&family=linear")
    page.wait_for_selector("#g-decoded .js-plotly-plot .hm", timeout=30_000)
    _wait_header(page, "agent and goal: cell probe")
    page.close()


def test_fog_tab_says_the_run_has_no_fog_episodes(page):
    # the shared episode-tab layout (viewer.step_panels) in the tab whose stage did not run
    page.get_by_text("Fogged episodes", exact=True).click()
    page.wait_for_selector("#fog-why", timeout=20_000)
    assert "No fogged episodes in this run" in page.text_content("#fog-why")
    assert page.locator("#fog-episode").count() == 1 and page.locator("#fog-next").count() == 1
    page.get_by_text("Episode explorer").click()
    assert page.console_problems == []


def test_server_rejects_keys_outside_the_allow_list(server):
    deps = httpx.get(server["url"] + "_dash-dependencies", timeout=10).json()
    render = next(d for d in deps if "step-header.children" in d["output"])
    inputs = []
    for spec in render["inputs"]:
        value = {
            "episode": "../../../../etc/passwd",
            "step": 0,
            "stage": "pre_reasoning",
            "layer": 5,
            "family": "../../etc",
            "cell-class": "goal",
            "plan": "/etc/passwd",
        }[spec["id"]]
        inputs.append({**spec, "value": value})
    body = {
        "output": render["output"],
        "outputs": render["outputs"] if "outputs" in render else None,
        "inputs": inputs,
        "changedPropIds": ["episode.value"],
        "state": [],
    }
    if body["outputs"] is None:
        body["outputs"] = [
            {"id": part.split(".")[0], "property": part.split(".")[1]}
            for part in render["output"].strip(".").split("...")
        ]
    response = httpx.post(server["url"] + "_dash-update-component", json=body, timeout=20)
    assert response.status_code == 200
    assert "unknown episode" in response.text and "root:" not in response.text


def test_the_server_binds_loopback_only(server):
    table = Path("/proc/net/tcp")
    if not table.exists():
        pytest.skip("no /proc/net/tcp to inspect listening sockets")
    port_hex = f"{server['port']:04X}"
    listening = [
        line.split()[1]
        for line in table.read_text().splitlines()[1:]
        if line.split()[1].endswith(":" + port_hex) and line.split()[3] == "0A"
    ]
    assert listening == ["0100007F:" + port_hex]


def test_static_export_renders_without_network(browser, run_dir, tmp_path):
    from goalprobe.viewer.data import RunData
    from goalprobe.viewer.export import export_html

    first = next(iter(RunData(run_dir).episodes))
    out = export_html(run_dir, tmp_path / "export.html", episodes=[first])
    page, requests, problems = offline_page(browser, 1500, 1200)
    page.goto(out.as_uri())
    page.wait_for_selector("section.episode [data-panel=decoded] .hm", timeout=30_000)
    first = page.locator("section.episode").first
    assert first.locator(".stepinfo").text_content().startswith("step 0 of")
    first.locator(".next").click()
    assert first.locator(".stepinfo").text_content().startswith("step 1 of")
    first.locator("select.class-select").select_option("agent")
    page.wait_for_timeout(200)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "export.png"))
    page.context.close()
    assert requests == [] and problems == []
