"""The HDF5 activation store: round trip, selection and streaming, errors, splits, merging."""

from __future__ import annotations

import json
import shutil
from importlib import metadata

import h5py
import numpy as np
import pytest
from goalprobe.activations.store import (
    ActivationStore,
    IncompleteStoreError,
    RowBatch,
    StoreFormatError,
    StoreWriter,
    merge_shards,
    read_rows,
    shard_of,
)
from goalprobe.activations.store.schema import LABEL_FIELDS, Shard
from goalprobe.gridworld.core import CellType
from goalprobe.probes.splits import split_by_grid
from hypothesis import given, settings
from hypothesis import strategies as st
from store_fixtures import ATTRS, LAYOUT, make_batch, write_store


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize("compression", ["none", "lzf", "gzip"])
def test_round_trip_keeps_every_row_field_and_attribute(tmp_path, rng, compression):
    batches = [make_batch(rng, ["g0", "g1", "g1"], 0), make_batch(rng, ["g2", "g4"], 3)]
    path = write_store(tmp_path / "s.h5", batches, compression)
    with ActivationStore(path) as store:
        assert len(store) == 5
        assert store.stages == LAYOUT.stages and store.layers == LAYOUT.layers
        assert store.attrs["schema"] == "goalprobe.activations" and store.attrs["complete"]
        assert store.attrs["config"] == {"layers": [1, 3]}
        assert store.attrs["compression"] == compression
        software = store.attrs["software"]  # provenance: what wrote the store
        for name in ("torch", "transformers", "nnsight", "h5py"):
            assert software[name] == metadata.version(name)
        for stage in LAYOUT.stages:
            present = np.concatenate([b.present[stage] for b in batches])
            assert np.array_equal(store.present(stage), present)
            for layer in LAYOUT.layers:
                want = np.concatenate([b.acts[stage][layer] for b in batches]).astype(np.float16)
                want[~present] = 0
                got = read_rows(store._file["activations"][stage][f"layer_{layer}"], range(5))
                assert got.dtype == np.float16
                assert np.array_equal(got, want)
                assert np.array_equal(store.read(stage, layer), want[present])
        labels = store.labels()
        for name in LABEL_FIELDS:
            want = np.concatenate([b.labels[name] for b in batches])
            if LABEL_FIELDS[name].dtype is str:
                assert labels[name].tolist() == want.tolist()
            else:
                assert np.array_equal(labels[name], want), name
        vocab = json.loads(store._file["labels"]["cell_types"].attrs["vocabulary"])
        assert vocab["PADDING"] == CellType.PADDING


def test_reading_an_absent_stage_row_is_refused(tmp_path, rng):
    batch = make_batch(rng, ["g0"] * 6, 0)
    batch.present["post_reasoning"][:] = [True, False, True, True, False, True]
    path = write_store(tmp_path / "s.h5", [batch])
    with ActivationStore(path) as store:
        assert store.select("post_reasoning").tolist() == [0, 2, 3, 5]
        with pytest.raises(ValueError, match="row 1"):
            store.read("post_reasoning", 1, [0, 1])
        with pytest.raises(KeyError, match="no layer 2"):
            store.read("pre_reasoning", 2)
        assert store.stages_with_rows() == store.stages


def test_stages_with_rows_leaves_out_a_stage_no_row_holds(tmp_path, rng):
    batch = make_batch(rng, ["g0"] * 6, 0)
    batch.present["post_reasoning"][:] = False
    path = write_store(tmp_path / "s.h5", [batch])
    with ActivationStore(path) as store:
        assert "post_reasoning" in store.stages
        assert "post_reasoning" not in store.stages_with_rows()
        assert store.stages_with_rows() == tuple(s for s in store.stages if s != "post_reasoning")


def test_float16_overflow_is_refused(tmp_path, rng):
    batch = make_batch(rng, ["g0", "g1"], 0)
    batch.acts["pre_reasoning"][3][1, 2, 5] = 1e6
    with pytest.raises(ValueError, match="float16"):
        write_store(tmp_path / "s.h5", [batch])
    assert not (tmp_path / "s.h5").exists()


def test_selection_and_streaming_by_size_density_and_grid(tmp_path, rng):
    grid_ids = [f"g{i % 9}" for i in range(60)]
    batches = [make_batch(rng, grid_ids[i : i + 20], i) for i in (0, 20, 40)]
    path = write_store(tmp_path / "s.h5", batches)
    with ActivationStore(path) as store:
        labels = store.labels(["grid_size", "density", "grid_id"])
        rows = store.select("post_reasoning", sizes=[7, 9], densities=[0.4, 1.0])
        present = store.present("post_reasoning")
        want = np.flatnonzero(
            present
            & np.isin(labels["grid_size"], [7, 9])
            & np.isin(np.round(labels["density"].astype(np.float64), 3), [0.4, 1.0])
        )
        assert rows.tolist() == want.tolist() and len(rows) > 0
        split = split_by_grid(labels["grid_id"], test_fraction=0.4, random_state=3)
        train_grids = np.unique(labels["grid_id"][split.train])
        train = store.select("pre_reasoning", grid_ids=train_grids)
        assert set(labels["grid_id"][train]) == set(train_grids)
        acts = store.read("pre_reasoning", 3, train)
        assert acts.shape == (len(train), 3, 8)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 9999), min_size=0, max_size=300))
def test_read_rows_matches_numpy_indexing(rows):
    data = np.arange(10000 * 2, dtype=np.int32).reshape(10000, 2)
    with h5py.File("mem.h5", "w", driver="core", backing_store=False) as f:
        ds = f.create_dataset("x", data=data, chunks=(64, 2))
        assert np.array_equal(read_rows(ds, np.asarray(rows, dtype=np.int64)), data[rows])


def test_foreign_truncated_incomplete_and_missing_files_fail_naming_the_file(tmp_path, rng):
    good = write_store(tmp_path / "good.h5", [make_batch(rng, ["g0", "g1", "g2"], 0)])

    truncated = tmp_path / "truncated.h5"
    data = good.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreFormatError, match="truncated.h5.*truncated or corrupt"):
        ActivationStore(truncated)

    header_only = tmp_path / "stub.h5"
    header_only.write_bytes(data[:4])
    with pytest.raises(StoreFormatError, match="stub.h5: not an HDF5 file"):
        ActivationStore(header_only)

    text = tmp_path / "notes.h5"
    text.write_text("hello")
    with pytest.raises(StoreFormatError, match="notes.h5: not an HDF5 file"):
        ActivationStore(text)

    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f.create_dataset("x", data=np.zeros(3))
    with pytest.raises(StoreFormatError, match="foreign.h5: not a goalprobe activation store"):
        ActivationStore(foreign)

    newer = tmp_path / "newer.h5"
    shutil.copy(good, newer)
    with h5py.File(newer, "a") as f:
        f.attrs["schema_version"] = 99
    with pytest.raises(StoreFormatError, match="newer.h5: store schema version 99"):
        ActivationStore(newer)

    writer = StoreWriter(tmp_path / "unfinished.h5", LAYOUT, ATTRS)
    writer.append(make_batch(rng, ["g0", "g1"], 0))
    writer._file.close()  # the process dies before finalize: only the temporary file exists
    assert not (tmp_path / "unfinished.h5").exists()
    with pytest.raises(IncompleteStoreError, match=r"\.unfinished\.h5\.tmp: incomplete.*2 rows"):
        ActivationStore(writer.tmp)

    with pytest.raises(FileNotFoundError, match="missing.h5"):
        ActivationStore(tmp_path / "missing.h5")


def test_writer_replaces_the_destination_only_when_complete(tmp_path, rng):
    path = write_store(tmp_path / "s.h5", [make_batch(rng, ["g0"], 0)])
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="boom"):
        with StoreWriter(path, LAYOUT, ATTRS) as writer:
            writer.append(make_batch(rng, ["g1", "g2"], 1))
            raise RuntimeError("boom")
    assert path.read_bytes() == before and not writer.tmp.exists()


def shard_stores(tmp_path, rng, count, n_rows=40, attrs=ATTRS):
    """Shard files built as `extract --shard i/N` would: rows of a grid in its hash's shard."""
    grid_ids = [f"g{i % 11}" for i in range(n_rows)]
    full = make_batch(rng, grid_ids, 0)
    paths = []
    for index in range(count):
        keep = np.asarray([shard_of(g, count) == index for g in grid_ids])
        part = RowBatch(
            acts={s: {x: a[keep] for x, a in d.items()} for s, d in full.acts.items()},
            positions={s: a[keep] for s, a in full.positions.items()},
            present={s: a[keep] for s, a in full.present.items()},
            labels={k: a[keep] for k, a in full.labels.items()},
        )
        shard_attrs = {
            **attrs,
            "shard_index": index,
            "shard_count": count,
            "trajectory_steps": n_rows,
        }
        paths.append(write_store(tmp_path / f"shard{index}.h5", [part], attrs=shard_attrs))
    return full, paths


def test_merge_joins_shards_in_trajectory_order(tmp_path, rng):
    full, paths = shard_stores(tmp_path, rng, 3)
    out = merge_shards(list(reversed(paths)), tmp_path / "merged.h5")
    with ActivationStore(out) as store:
        assert len(store) == 40 and store.attrs["shard_count"] == 1
        assert store.labels(["step_index"])["step_index"].tolist() == list(range(40))
        present = full.present["post_reasoning"]
        want = full.acts["post_reasoning"][3].astype(np.float16)[present]
        assert np.array_equal(store.read("post_reasoning", 3), want)
        assert store.attrs["merged_from"] == ["shard0.h5", "shard1.h5", "shard2.h5"]


def test_merge_checks_coverage(tmp_path, rng):
    _, paths = shard_stores(tmp_path, rng, 3)
    with pytest.raises(StoreFormatError, match="shard.*2/3 missing"):
        merge_shards(paths[:2], tmp_path / "m.h5")
    with pytest.raises(StoreFormatError, match="given twice"):
        merge_shards([paths[0], paths[0], paths[1]], tmp_path / "m.h5")
    other = shard_stores(tmp_path / "b", rng, 3, attrs={**ATTRS, "trajectory_sha256": "cd" * 32})[1]
    with pytest.raises(StoreFormatError, match="trajectory_sha256"):
        merge_shards([paths[0], paths[1], other[2]], tmp_path / "m.h5")
    # a shard that lost rows: steps are missing
    with ActivationStore(paths[1]) as store:
        rows = store.row_batch(np.arange(len(store) - 1))
        attrs = {k: store.attrs[k] for k in ATTRS}
    write_store(tmp_path / "short.h5", [rows], attrs=attrs)
    with pytest.raises(StoreFormatError, match="hold 3[0-9] of the 40 steps"):
        merge_shards([paths[0], tmp_path / "short.h5", paths[2]], tmp_path / "m.h5")
    assert not (tmp_path / "m.h5").exists()


def test_shards_partition_grids():
    ids = [f"plain-n07-d0.20-s0-i{i:03d}" for i in range(200)]
    counts = np.bincount([shard_of(g, 4) for g in ids], minlength=4)
    assert counts.sum() == 200 and (counts > 20).all()
    shard = Shard.parse("2/4")
    assert [shard.holds(g) for g in ids] == [shard_of(g, 4) == 2 for g in ids]
    with pytest.raises(ValueError, match="i/N"):
        Shard.parse("2-4")
    with pytest.raises(ValueError, match="0 <= i < N"):
        Shard.parse("4/4")
