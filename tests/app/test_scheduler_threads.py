"""Stage workers and the stages that pin their threads hold every native pool (torch, OpenMP
and each BLAS: numpy's and scipy's OpenBLAS) to their share: two workers each running a
2-thread OpenBLAS on 2 cores ran the decision stage 11 times slower (docs/benchmarks.md)."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from goalprobe.scheduler import _init_worker, fixed_torch_threads


def _pools() -> list[tuple[str, int]]:
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_info

    return [(p["internal_api"], p["num_threads"]) for p in threadpool_info()]


def test_a_pinned_stage_holds_every_blas_pool_to_its_threads():
    import torch
    from threadpoolctl import threadpool_limits

    torch_before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # the test session holds every pool to one thread (tests/conftest.py): two here
        with threadpool_limits(limits=2):
            before = _pools()
            assert all(n == 2 for _, n in before), before
            with fixed_torch_threads(1):
                inside = _pools()
                assert torch.get_num_threads() == 1
            assert any(api == "openblas" for api, _ in inside)
            assert all(n == 1 for _, n in inside), inside
            assert _pools() == before and torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(torch_before)


def test_a_stage_worker_starts_with_its_share_of_every_pool():
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        1, mp_context=context, initializer=_init_worker, initargs=(1,)
    ) as pool:
        pools = pool.submit(_pools).result(timeout=120)
    assert any(api == "openblas" for api, _ in pools)
    assert all(n == 1 for _, n in pools), pools
