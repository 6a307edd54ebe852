"""What computed a store's rows (issue 43): the weights' format, dtype and device in the store's
identity, the batches outside it, and extraction halving its batches on an out-of-memory error;
real tiny GPT-OSS, real trajectories, real HDF5 stores.

Properties checked: a store records its compute identity and each part's batches; shards
computed with other weights (bf16 against fp32) are refused by the merge, naming ``compute``;
an interrupted extraction resumes with another batch (a requeued shard on a card of another
size) and ends with the uninterrupted rows; an out-of-memory error halves the batches, writes
them where a rerun finds them, and the rows equal a run at the halved batches; the GPU's
memory size is not part of its identity; the provenance lists the GPU stack's packages.
"""

from __future__ import annotations

import copy
import json

import h5py
import numpy as np
import pytest
import torch
from agent_fixtures import replay_model
from goalprobe.activations.capture import make_backend
from goalprobe.activations.compute import compute_identity, gpu_model, weights_format
from goalprobe.activations.extract import BATCHING_FILE, ExtractConfig, extract
from goalprobe.activations.store import ActivationStore
from goalprobe.activations.store.merge import merge_shards
from goalprobe.activations.store.schema import StoreFormatError

LAYERS = (0, 2)


@pytest.fixture(scope="module")
def model(tokenizer):
    return replay_model(tokenizer)


def config(**overrides) -> ExtractConfig:
    fields = dict(layers=LAYERS, batch_size=4, rows_per_part=3)
    fields.update(overrides)
    return ExtractConfig(**fields)


def datasets(path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
            )
        )
    return out


def assert_same_rows(a, b, atol: float = 0.0) -> None:
    """Every dataset equal; the activations within ``atol`` (other batches: floating-point
    reassociation)."""
    got, want = datasets(a), datasets(b)
    assert got.keys() == want.keys()
    for name in want:
        if atol and name.startswith(("activations/", "reasoning/")) and "layer_" in name:
            np.testing.assert_allclose(
                got[name].astype(np.float32), want[name].astype(np.float32), atol=atol
            )
        else:
            assert np.array_equal(got[name], want[name]), name


class OomAbove:
    """The real capture backend, raising PyTorch's out-of-memory error on batches above
    ``limit`` rows (as a card would) and recording the batch sizes it ran."""

    def __init__(self, inner, limit: int) -> None:
        self.inner, self.limit, self.sizes, self.raised = inner, limit, [], 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def capture(self, batch, layers):
        if batch.size > self.limit:
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")
        self.sizes.append(batch.size)
        return self.inner.capture(batch, layers)


def test_compute_identity_and_part_batches_are_recorded(tmp_path, trajectories, tokenizer, model):
    capture = make_backend("hooks", model, tokenizer)
    out = tmp_path / "s.h5"
    extract(trajectories, out, capture, tokenizer, config(), model_id="tiny")
    with ActivationStore(out) as store:
        compute = store.attrs["compute"]
        assert compute == {
            "weights": "fp32",
            "dtype": "float32",
            "device": "cpu",
            "gpu": "",
            "driver": "",
            "cuda": "",
        }
        batches = store.attrs["part_batching"]
        assert len(batches) >= 2 and all(b["batch_size"] == 4 for b in batches)
        assert all(b["device"] == "cpu" for b in batches)
        for package in ("torch", "transformers", "accelerate", "openai-harmony"):
            assert package in store.attrs["software"]
    assert weights_format(model) == "fp32" and compute_identity(model) == compute


def test_a_merge_across_weight_formats_is_refused(tmp_path, trajectories, tokenizer, model):
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    paths = []
    for index, weights in enumerate((model, bf16)):
        path = tmp_path / f"shard{index}.h5"
        capture = make_backend("hooks", weights, tokenizer)
        extract(trajectories, path, capture, tokenizer, config(shard=f"{index}/2"), model_id="t")
        paths.append(path)
    with ActivationStore(paths[1]) as store:
        assert store.attrs["compute"]["weights"] == "bf16"
        assert store.attrs["compute"]["dtype"] == "bfloat16"
    with pytest.raises(StoreFormatError, match="attribute 'compute'.*not shards of one"):
        merge_shards(paths, tmp_path / "merged.h5")
    # the same shard computed in fp32 merges
    again = tmp_path / "shard1_fp32.h5"
    capture = make_backend("hooks", model, tokenizer)
    extract(trajectories, again, capture, tokenizer, config(shard="1/2"), model_id="t")
    merged = merge_shards([paths[0], again], tmp_path / "merged.h5")
    with ActivationStore(merged) as store:
        assert len(store.attrs["part_batching"]) >= 2


class Stop(Exception):
    """Stands for a preemption after the first part."""


def test_a_requeued_extraction_resumes_with_another_batch(tmp_path, trajectories, tokenizer, model):
    capture = make_backend("hooks", model, tokenizer)
    reference = tmp_path / "reference.h5"
    extract(trajectories, reference, capture, tokenizer, config(), model_id="tiny")
    out = tmp_path / "s.h5"

    def stop(index, computed):
        raise Stop

    with pytest.raises(Stop):
        extract(trajectories, out, capture, tokenizer, config(), model_id="tiny", on_part=stop)
    # requeued on a smaller card: the planner gives another batch and token budget
    smaller = config(batch_size=1, max_batch_tokens=5000)
    report = extract(trajectories, out, capture, tokenizer, smaller, model_id="tiny")
    assert report.parts_reused == 1 and report.parts_computed >= 1
    with ActivationStore(out) as store:
        batches = store.attrs["part_batching"]
    assert batches[0]["batch_size"] == 4 and batches[0]["max_batch_tokens"] == 0
    assert all(b["batch_size"] == 1 and b["max_batch_tokens"] == 5000 for b in batches[1:])
    assert_same_rows(out, reference, atol=2e-3)
    # a finished store is this extraction whatever the batch
    again = extract(trajectories, out, capture, tokenizer, config(batch_size=2), model_id="tiny")
    assert again.already_complete


def test_out_of_memory_halves_the_extraction_batches(tmp_path, trajectories, tokenizer, model):
    inner = make_backend("hooks", model, tokenizer)
    at_two = tmp_path / "at_two.h5"
    extract(trajectories, at_two, inner, tokenizer, config(batch_size=2), model_id="tiny")
    capture = OomAbove(inner, limit=2)
    out = tmp_path / "s.h5"
    extract(trajectories, out, capture, tokenizer, config(), model_id="tiny", keep_parts=True)
    assert max(capture.sizes) == 2
    recorded = json.loads((tmp_path / "s.h5.parts" / BATCHING_FILE).read_text())
    assert recorded == {"batch_size": 2, "max_batch_tokens": 0}
    with ActivationStore(out) as store:
        assert {b["batch_size"] for b in store.attrs["part_batching"]} == {2}
    assert_same_rows(out, at_two)
    assert capture.raised >= 1
    # a rerun (the parts gone, the record kept) starts from the halved batches: no OOM
    out.unlink()
    for part in (tmp_path / "s.h5.parts").glob("part_*.h5"):
        part.unlink()
    again = OomAbove(inner, limit=2)
    extract(trajectories, out, again, tokenizer, config(), model_id="tiny")
    assert again.raised == 0 and max(again.sizes) == 2
    assert_same_rows(out, at_two)
    # one step that does not fit alone is an error, not a loop
    from goalprobe.agents.oom import OutOfMemoryAtOneError

    with pytest.raises(OutOfMemoryAtOneError, match="one sequence of"):
        extract(
            trajectories, tmp_path / "t.h5", OomAbove(inner, 0), tokenizer, config(), model_id="t"
        )


def test_the_gpu_model_leaves_out_the_memory_size():
    assert gpu_model("NVIDIA A100-SXM4-80GB") == "NVIDIA A100-SXM4"
    assert gpu_model("NVIDIA A100-SXM4-40GB") == "NVIDIA A100-SXM4"
    assert gpu_model("NVIDIA A100-PCIE-40GB") == "NVIDIA A100-PCIE"
    assert gpu_model("NVIDIA H100 80GB HBM3") == "NVIDIA H100 HBM3"
    assert gpu_model("NVIDIA H200") == "NVIDIA H200"
