"""Shared test fixtures.

Fixture modules live beside the tests (``tests/*_fixtures.py``) and are registered here, so
every test sees the same session-scoped models, runs and servers.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from typer.testing import CliRunner, Result

# as the CLI does (goalprobe.cli.main): OpenMP threads that busy-wait collapse on a shared CPU;
# set before any test module imports torch
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

pytest_plugins: list[str] = [
    "demo_fixtures",
    "gptoss_fixtures",
    "server_fixtures",
    "thinktag_fixtures",
]


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Every test runs torch on one thread: the tiny models are fastest that way, and the CI
    machine is a shared 2-core box where intra-op threads only add contention."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def bundled_agent():
    """The shipped bundled agent ``(model, tokenizer)``, loaded once (eval mode; tests that
    change a model work on their own copy)."""
    from goalprobe.agents.bundled import load_bundled_agent

    return load_bundled_agent()


@pytest.fixture
def goalprobe_cli() -> Callable[..., Result]:
    """Run the real ``goalprobe`` command line in-process: ``goalprobe_cli("grids", "--out",
    path)`` returns click's ``Result`` (``exit_code``, ``output`` with stderr included)."""
    from goalprobe.cli import app

    runner = CliRunner()

    def invoke(*args: object) -> Result:
        return runner.invoke(app, [str(a) for a in args])

    return invoke
