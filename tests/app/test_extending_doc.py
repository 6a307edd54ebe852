"""docs/extending.md's worked examples run as they stand: each section's ``python`` blocks, in
order, in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def sections() -> dict[str, str]:
    """The doc's ``## `` sections by title."""
    parts = re.split(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def code(section: str) -> str:
    """A section's ``python`` blocks, joined."""
    return "\n".join(re.findall(r"^```python\n(.*?)^```$", section, flags=re.M | re.S))


def run(source: str, tmp_path: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_guide_has_its_sections():
    assert list(sections()) == [
        "Add a demo stage",
        "Add an agent",
        "Add a probe family",
        "Add a chat format",
    ]


def test_the_stage_example_runs_under_the_scheduler(tmp_path):
    source = code(sections()["Add a demo stage"])
    assert "register(" in source and "run_in_order" in source
    out = run(source, tmp_path)
    count = re.search(r"\{'count': (\d+)\}", out)
    assert count and int(count.group(1)) > 0 and int(count.group(1)) % 2 == 0, out
    assert "[grid_count] done" in out


def test_the_agent_example_loads_the_registered_agent(tmp_path):
    source = code(sections()["Add an agent"])
    out = run(source, tmp_path)
    assert "'model': 'my-agent'" in out and "'weights_sha256'" in out, out
    assert "GptOssForCausalLM" in out


@pytest.mark.parametrize("title", ["Add a demo stage", "Add an agent"])
def test_each_example_is_code(title):
    assert code(sections()[title]).count("\n") > 10
