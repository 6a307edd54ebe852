"""The attribution file's safetensors header is canonical: safetensors writes its metadata in
hash-map order (it differs between processes), so the same records must be re-ordered to give
the same bytes (the demo stage and ``goalprobe attribute`` are compared byte for byte)."""

from __future__ import annotations

import json
import struct

import numpy as np
from goalprobe.probes.attribution import _sorted_metadata
from safetensors.numpy import load, save


def _metadata_keys(data: bytes) -> list[str]:
    (length,) = struct.unpack("<Q", data[:8])
    return list(json.loads(data[8 : 8 + length])["__metadata__"])


def test_metadata_keys_come_out_sorted_and_the_file_reads_back():
    tensors = {"atp.0": np.arange(6, dtype=np.float32).reshape(2, 3)}
    for metadata in (
        {"zeta": "1", "alpha": "2", "mid": "3"},
        {"alpha": "2", "mid": "3", "zeta": "1"},
    ):
        data = save(tensors, metadata=metadata)
        out = _sorted_metadata(data)
        assert len(out) == len(data)
        assert _metadata_keys(out) == ["alpha", "mid", "zeta"]
        np.testing.assert_array_equal(load(out)["atp.0"], tensors["atp.0"])
    first = _sorted_metadata(save(tensors, metadata={"b": "1", "a": "2"}))
    second = _sorted_metadata(save(tensors, metadata={"a": "2", "b": "1"}))
    assert first == second
