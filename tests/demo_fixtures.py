"""A tiny demo run shared by the whole session (registered in ``tests/conftest.py``).

``goalprobe demo --scale tiny`` for the default agent alone (no positive control), run once
into a temporary directory on first use (about a minute on 2 cores); tests read it and write
their own outputs elsewhere, never into it.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """``(run directory, DemoConfig)`` of a finished tiny demo run (every stage ran)."""
    from goalprobe.config import demo_config
    from goalprobe.demo import run_demo

    config = demo_config("tiny")
    root = tmp_path_factory.mktemp("tiny_demo") / "run"
    result = run_demo(root, config, progress=False, log=lambda _: None)
    assert result.failed == {}, result.failed
    return root, config
