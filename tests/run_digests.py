"""Digests of a run's probe outputs, to compare two runs of the same stages (shared by
tests/e2e/test_reproducible.py and tests/e2e/test_demo.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def probe_differences(one: Path, two: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The probe outputs (:func:`probe_outputs`) of run ``one`` that differ in run ``two``, and
    for each differing HDF5 file its differing datasets (what a failure reports)."""
    a, b = probe_outputs(one), probe_outputs(two)
    assert a, f"no probe outputs found in {one}"
    different = sorted(k for k in a if a[k] != b.get(k))
    detail = {k: h5_datasets_differing(one / k, two / k) for k in different if k.endswith(".h5")}
    return different, detail


def h5_digest(path) -> str:
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


def h5_datasets_differing(a, b) -> list[str]:
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


def probe_outputs(root) -> dict[str, str]:
    """sha256 of the probe stages' numeric outputs: the stored arrays of the decoded maps and
    model weights, and the score tables."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or not rel.startswith(("probing/", "probes/", "scoring/")):
            continue
        if path.suffix == ".h5":
            out[rel] = h5_digest(path)
        elif path.suffix in (".safetensors", ".csv"):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out
