"""Numbers do not depend on the number of workers or torch threads: the probe stages compute
with a constant thread count, and the tiny demo's probe stages give the same outputs with
``--jobs 1`` (in process, 2 threads) and ``--jobs 2`` (stage workers, 1 thread each)."""

from __future__ import annotations

import hashlib
import importlib

import numpy as np
import pytest
import torch
from goalprobe.probes.cell_probes import CoordinateCellProbe
from goalprobe.probes.wall_planting import planted_cell_data
from run_digests import probe_differences

from goalprobe.config import demo_config
from goalprobe.run_layout import RunLayout
from goalprobe.scheduler import StageBook, fixed_torch_threads, run_in_order
from goalprobe.stages import DEPENDS_ON, STAGES

NUMERIC_STAGES = (
    "probes",
    "distance",
    "plans",
    "intention_map",
    "false_belief",
    "scoring",
)
"""Stages that fit or apply probes (their outputs must not depend on the thread count; the
decode helpers run inside intention_map, false_belief, fog_map and probes)."""


def _fit_bytes(outer_threads: int) -> bytes:
    data = planted_cell_data(24, steps_per_grid=3, sizes=(5, 7), d_model=32, random_state=0)
    before = torch.get_num_threads()
    torch.set_num_threads(outer_threads)
    try:
        with fixed_torch_threads(1):
            probe = CoordinateCellProbe(
                hidden_size=32, max_epochs=3, batch_size=16, random_state=0
            ).fit(data.acts, data.labels, groups=data.grid_ids)
            probs = probe.predict_proba(data.acts)
    finally:
        torch.set_num_threads(before)
    return probs.astype(np.float32).tobytes()


def test_a_probe_fit_under_the_stage_pin_is_bytes_identical_with_1_and_2_threads():
    one, two = _fit_bytes(1), _fit_bytes(2)
    assert hashlib.sha256(one).hexdigest() == hashlib.sha256(two).hexdigest()
    assert torch.get_num_threads() >= 1  # restored


@pytest.mark.parametrize("stage", NUMERIC_STAGES)
def test_probe_stages_declare_a_constant_thread_count(stage):
    module = importlib.import_module(f"goalprobe.stages.{stage}")
    assert module.STAGE.torch_threads == 1


def _compared_stages() -> tuple[str, ...]:
    """The stages that write what :func:`run_digests.probe_outputs` compares (probing, probes, scoring)
    and every stage they read, in study order: the rest of the demo writes nothing compared."""
    needed, frontier = set(), {"probing", "probes", "scoring"}
    while frontier:
        needed |= frontier
        frontier = {d for s in frontier for d in DEPENDS_ON[s]} - needed
    return tuple(s for s in STAGES if s in needed)


@pytest.mark.slow  # the tiny demo's probe stages once more (~1 min on 2 cores)
def test_tiny_demo_probe_outputs_are_the_same_with_1_and_2_threads(tiny_demo, tmp_path):
    """The stages behind the compared outputs, in this process with every pool at 2 threads
    (``--jobs 1`` on 2 cores), give the outputs of the session's tiny run (``--jobs 1``, every
    pool at 1 thread: tests/conftest.py). With ``--jobs 2`` (stage workers, 1 thread each):
    test_demo.py's two-jobs test reruns the probing stage and its downstream in workers and
    compares the same outputs with the same run."""
    from threadpoolctl import threadpool_limits

    config = demo_config("tiny")
    stages = _compared_stages()
    assert {"grids", "rollouts", "activations", "probing", "probes", "scoring"} <= set(stages)
    result, _ = tiny_demo
    assert result.failed == {}, result.failed
    book = StageBook(RunLayout(tmp_path), config, set(), True, lambda _: None, stages=stages)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # the test session holds every pool to one thread (tests/conftest.py)
        with threadpool_limits(limits=2):
            run_in_order([book], progress=False)
    finally:
        torch.set_num_threads(before)
    assert {o.status for o in book.outcomes.values()} == {"ran"}, book.outcomes
    different, detail = probe_differences(tmp_path, result.run_dir)
    assert not different, (different, detail)
