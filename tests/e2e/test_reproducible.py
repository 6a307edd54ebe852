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
from goalprobe.probes.synthetic import planted_cell_data

from goalprobe.config import demo_config
from goalprobe.run_layout import RunLayout
from goalprobe.scheduler import StageBook, fixed_torch_threads, run_in_order, run_parallel
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


def _h5_digest(path) -> str:
    """sha256 over every dataset's name and contents (HDF5 files also hold creation times)."""
    import h5py

    digest = hashlib.sha256()
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                values = obj[()]
                digest.update(name.encode())
                if obj.dtype.kind == "O":  # strings: their text, not object pointers
                    digest.update(repr(values.tolist()).encode())
                else:
                    digest.update(np.ascontiguousarray(values).tobytes())

        f.visititems(visit)
    return digest.hexdigest()


def _h5_datasets_differing(a, b) -> list[str]:
    """The datasets of two HDF5 files whose contents differ (what a failure reports)."""
    import h5py

    out = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                other = fb.get(name)
                if other is None or not np.array_equal(obj[()], other[()]):
                    out.append(name)

        fa.visititems(visit)
    return out


def _probe_outputs(root) -> dict[str, str]:
    """sha256 of the probe stages' numeric outputs: the stored arrays of the decoded maps and
    model weights, and the score tables."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or not rel.startswith(("probing/", "probes/", "scoring/")):
            continue
        if path.suffix == ".h5":
            out[rel] = _h5_digest(path)
        elif path.suffix in (".safetensors", ".csv"):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _compared_stages() -> tuple[str, ...]:
    """The stages that write what :func:`_probe_outputs` compares (probing, probes, scoring)
    and every stage they read, in study order: the rest of the demo writes nothing compared."""
    needed, frontier = set(), {"probing", "probes", "scoring"}
    while frontier:
        needed |= frontier
        frontier = {d for s in frontier for d in DEPENDS_ON[s]} - needed
    return tuple(s for s in STAGES if s in needed)


@pytest.mark.slow  # the tiny demo's probe stages twice (~1-2 min on 2 cores)
def test_tiny_demo_probe_outputs_are_the_same_with_jobs_1_and_2(tmp_path):
    """The stages behind the compared outputs, in this process with every pool at 2 threads
    (``--jobs 1`` on 2 cores) and in 2 stage workers at 1 thread each (``--jobs 2``)."""
    from threadpoolctl import threadpool_limits

    config = demo_config("tiny")
    stages = _compared_stages()
    assert {"grids", "rollouts", "activations", "probing", "probes", "scoring"} <= set(stages)

    def book(root):
        return StageBook(RunLayout(root), config, set(), True, lambda _: None, stages=stages)

    one, two = book(tmp_path / "one"), book(tmp_path / "two")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # the test session holds every pool to one thread (tests/conftest.py)
        with threadpool_limits(limits=2):
            run_in_order([one], progress=False)
    finally:
        torch.set_num_threads(before)
    run_parallel([two], jobs=2, progress=False)
    for ran in (one, two):
        assert {o.status for o in ran.outcomes.values()} == {"ran"}, ran.outcomes
    one, two = _probe_outputs(tmp_path / "one"), _probe_outputs(tmp_path / "two")
    assert one, "no probe outputs found"
    different = sorted(k for k in one if one[k] != two.get(k))
    detail = {
        k: _h5_datasets_differing(tmp_path / "one" / k, tmp_path / "two" / k)
        for k in different
        if k.endswith(".h5")
    }
    assert not different, (different, detail)
