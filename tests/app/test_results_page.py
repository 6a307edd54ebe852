"""``docs/results.md`` is what ``scripts/readme_assets.py`` renders (its parts read back and
rendered again give the same text), the README stays a manual of at most 150 lines, and each
question is described once."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_assets():
    """``scripts/readme_assets.py`` as a module (scripts are not a package)."""
    if "readme_assets" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "readme_assets", ROOT / "scripts" / "readme_assets.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["readme_assets"] = module
        spec.loader.exec_module(module)
    return sys.modules["readme_assets"]


def test_results_page_is_what_readme_assets_renders():
    assets = readme_assets()
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    page = assets.parse(text)
    assert assets.render(page) == text
    assert list(page.provenance)[:3] == ["commit", "command", "environment"]
    assert page.headline.startswith("| finding |") and page.headline.count("\n") >= 10
    assert (ROOT / "docs" / page.figure).is_file()
    assert page.readings and all(page.readings.values())


def test_each_question_is_described_once():
    assets = readme_assets()
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for title, description in assets.QUESTIONS:
        assert text.count(description) == 1, title
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for _, description in assets.QUESTIONS:
        assert description[:60] not in readme


def test_render_and_parse_are_inverse_on_constructed_parts():
    assets = readme_assets()
    page = assets.ResultsPage(
        provenance={"commit": "`abc`", "command": "`goalprobe demo`", "environment": "x"},
        headline="| a | b |\n|---|---|\n| 1 | 2 |",
        figure="",
        readings={"bundled": ["- **One.** text\n  continued", "- **Two.** more"], "m": ["- x"]},
    )
    assert assets.parse(assets.render(page)) == page


def test_readme_is_a_manual_of_at_most_150_lines():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    # the quick start, exactly
    assert "pip install torch==2.13.0 && pip install -e . && goalprobe demo" in readme
    assert "bash scripts/setup_tests.sh && python3 -m pytest" in readme
    for link in ("docs/results.md", "docs/gpu.md", "docs/architecture.md", "docs/formats.md"):
        assert link in readme and (ROOT / link).is_file(), link


def test_the_command_is_rebuilt_exactly_from_the_run_config(tmp_path):
    from goalprobe.commands.demo import parse_setting
    from goalprobe.config import demo_config

    assets = readme_assets()
    run = tmp_path / "run"
    run.mkdir()
    overrides = {"keys.episodes_per_grid": 5, "probing.grids.sizes": (7, 9, 11)}
    config = demo_config("tiny", seed=3, overrides=overrides)
    (run / "demo_config.json").write_text(json.dumps(config.to_dict()))
    command = assets.demo_command(run)
    assert command.startswith("goalprobe demo --scale tiny --model bundled --seed 3 ")
    words = command.split()
    settings = dict(
        parse_setting(words[i + 1].strip("'")) for i, w in enumerate(words) if w == "--set"
    )
    assert settings == overrides
    assert demo_config("tiny", seed=3, overrides=settings).to_dict() == config.to_dict()
    (run / "control" / "stages").mkdir(parents=True)  # both agents: no --model
    assert "--model" not in assets.demo_command(run)
    # `goalprobe demo` records the chat format it read off the tokenizer: no --set for it
    from goalprobe.agents.chat_format import model_chat_format

    recorded = demo_config(
        "tiny", seed=3, overrides=overrides, chat_format=model_chat_format("bundled")
    )
    assert recorded.agent.chat_format == "harmony"
    (run / "demo_config.json").write_text(json.dumps(recorded.to_dict()))
    assert "chat_format" not in assets.demo_command(run)
