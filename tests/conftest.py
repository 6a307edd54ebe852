"""Shared test fixtures.

Fixture modules live beside the tests (``tests/*_fixtures.py``) and are registered here, so
every test sees the same session-scoped models, runs and servers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

# as the CLI does (goalprobe.cli.main): OpenMP threads that busy-wait collapse on a shared CPU;
# set before any test module imports torch
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Bytecode is cached while the suite runs, in this process and the subprocesses it starts (the
# CLI, spawned stage workers, fresh interpreters): with PYTHONDONTWRITEBYTECODE=1 (the project's
# sandbox sets it) every xdist worker and every subprocess compiled the library from source and
# pytest re-rewrote the asserts of every test module and plugin package (dash's 202 modules):
# about 5 of the 17 s a worker spent collecting the fast loop. Caches go to __pycache__/
# (git-ignored), keyed by the sources' size and time as Python's own.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

pytest_plugins: list[str] = [
    "demo_fixtures",
    "gptoss_fixtures",
    "server_fixtures",
    "thinktag_fixtures",
]


SHARED_RUN_MODULES = (
    "tests/e2e/test_verbs_match_stages.py",
    "tests/e2e/test_reproducible.py",
    "tests/e2e/test_demo.py",
)
"""The modules that read the session's tiny demo run (tests/demo_fixtures.py), in the order they
run: they form one xdist work unit, so one worker runs the demo once for all of them (it cost
about 140 CPU s a worker). The readers go first, test_demo's tests that rerun stages in the run
(force, resume, a changed parameter) after them."""

HEAVY_FIRST = (
    # the longest modules of the whole suite (their slow tests)
    *SHARED_RUN_MODULES,
    "tests/e2e/test_demo_server.py",
    "tests/agents/test_gptoss_o200k.py",
    "tests/e2e/test_server_vllm_e2e.py",
    "tests/probes/test_wall_test.py",
    "tests/e2e/test_map_agent.py",
    "tests/activations/test_extract.py",
    "tests/agents/test_bundled_agent.py",
    "tests/probes/test_score_nulls.py",
    "tests/e2e/test_demo_thinktag.py",
    # the longest modules of the fast loop (``-m "not slow"``)
    "tests/viewer/test_viewer_browser.py",
    "tests/agents/test_server_vllm.py",
    "tests/probes/test_cell_probes.py",
    "tests/app/test_extending_doc.py",
    "tests/app/test_thinktag_rollout_cli.py",
    "tests/app/test_stage_registry.py",
    "tests/probes/test_patching.py",
    "tests/agents/test_chat_format.py",
    "tests/app/test_architecture.py",
    "tests/activations/test_gpu_check.py",
    "tests/probes/test_patching_memory.py",
    "tests/probes/test_plan_baselines.py",
    "tests/agents/test_server_hardening.py",
    "tests/probes/test_patching_chunks.py",
    "tests/probes/test_wall_readout.py",
    "tests/agents/test_thinktag_rollout.py",
    "tests/probes/test_plan_decoder.py",
    "tests/activations/test_compute_identity.py",
    "tests/activations/test_gradients.py",
    "tests/agents/test_intention.py",
    "tests/probes/test_decision_time.py",
    "tests/app/test_cli_errors.py",
    "tests/app/test_scheduler_threads.py",
    "tests/probes/test_harm_metrics.py",
    "tests/viewer/test_viewer_figures.py",
)
"""Modules handed to the workers first, most test seconds first (measured with
``--durations=0`` on 2 idle cores, 2026-11-28): with one module per worker, a long module
handed out last bounds the wall time while the other worker idles (the greedy longest-first
order). The others follow, most tests first, as xdist orders them. A stale entry costs
balance, never a test."""


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items):
    """Order the session: :data:`HEAVY_FIRST` modules first, in that order, then the others by
    their number of tests (stable). A worker reports its collection in this order, which the
    scheduler below keeps."""
    count: dict[str, int] = {}
    for item in items:
        count[_module(item.nodeid)] = count.get(_module(item.nodeid), 0) + 1
    rank = {m: i for i, m in enumerate(HEAVY_FIRST)}
    items.sort(
        key=lambda item: (
            rank.get(_module(item.nodeid), len(rank)),
            -count[_module(item.nodeid)],
            _module(item.nodeid),
        )
    )


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist does not know it
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (pyproject's addopts) with the :data:`SHARED_RUN_MODULES` as one work
    unit and the units in collection order (``pytest_collection_modifyitems``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedRunScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return "tiny-demo-run" if module in SHARED_RUN_MODULES else module

    config.option.loadscopereorder = False
    return SharedRunScheduling(config, log)


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_pool():
    """Every test runs torch, and numpy's, scipy's and scikit-learn's native pools (OpenBLAS,
    OpenMP), on one thread: the tiny models are fastest that way, and the CI machine is a
    shared 2-core box (one pytest-xdist worker a core) where more threads only add contention.
    The BLAS pools matter most: with two workers each running scikit-learn's small L-BFGS fits
    on a 2-thread OpenBLAS, the planted-walls test took 104 CPU s against 13 s on one thread
    (as goalprobe.scheduler.fixed_torch_threads found for the decision stage). Subprocesses
    (the CLI, spawned stage workers) start with the library's own settings, not these."""
    import scipy.linalg  # noqa: F401  (numpy's and scipy's OpenBLAS loaded, so the limit covers them)
    import sklearn.utils.extmath  # noqa: F401  (scikit-learn's OpenMP)
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def tokenizer_loads_once_per_directory():
    """``AutoTokenizer.from_pretrained`` of a local directory parses its ``tokenizer.json`` once
    per session and process: a later load of the same unchanged directory (same files, sizes
    and modification times, same arguments) returns the tokenizer the first load built.

    Loading GPT-OSS's o200k tokenizer costs about 2.3 CPU seconds (Qwen3's about as much), and
    every in-process verb on a model directory loads it once or twice: the eleven modules that
    use these tokenizers took 1,125 s of test time before and 418 s after (load average ~20,
    2026-11-28; a fifth of the fast loop's test time). The first load of each directory still runs the real loader, the
    library holds a loaded tokenizer for a model's life anyway (it never changes one), and a
    directory rewritten by a test is a new key; the CLI tests run in subprocesses load for
    real. A hub id, or a call with positional options, goes to the loader as before."""
    from transformers import AutoTokenizer

    load = AutoTokenizer.from_pretrained
    loaded: dict[tuple, object] = {}

    def from_pretrained(name, *args, **kwargs):
        directory = Path(str(name)).expanduser()
        if args or not directory.is_dir():
            return load(name, *args, **kwargs)
        files = tuple(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.iterdir())
            if p.is_file()
        )
        key = (
            str(directory.resolve()),
            files,
            tuple(sorted((k, repr(v)) for k, v in kwargs.items())),
        )
        if key not in loaded:
            loaded[key] = load(name, **kwargs)
        return loaded[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AutoTokenizer, "from_pretrained", staticmethod(from_pretrained))
        yield


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
