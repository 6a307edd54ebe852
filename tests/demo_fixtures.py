"""The tiny demo run shared by the whole session (registered in ``tests/conftest.py``).

``goalprobe demo --scale tiny`` as the command runs it without ``--model`` (the default agent
with the positive control beside it), once per session into a temporary directory, on first
use (about 2-3 minutes on 2 cores). The end-to-end tests of the demo (tests/e2e/test_demo.py:
caching, resuming, forcing a stage) rerun stages in it; the verbs' tests read it and write their
own outputs elsewhere.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory):
    """``(DemoResult, log lines)`` of a finished tiny demo run with its positive control."""
    from goalprobe.config import control_config, demo_config
    from goalprobe.demo import run_demo

    config = demo_config("tiny")
    root = tmp_path_factory.mktemp("demo") / "run"
    lines: list[str] = []
    result = run_demo(
        root, config, progress=False, control=control_config(config), log=lines.append
    )
    return result, lines
