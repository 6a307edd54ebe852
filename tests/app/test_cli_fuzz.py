"""Fuzz: malformed grid sets and activation stores fed to every verb that reads them.

The property (issue 19): exit code 2 and one line ``error: ...`` naming the file; never a
traceback, and never an output left behind as if complete. Each example first asks the
library's own reader whether the mutated file is still valid; a mutation that left it valid
is discarded (those files are the other tests' business), so every verb call here is on a
file the toolkit must refuse.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from goalprobe.activations.store import ActivationStore
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import read_grid_set, write_grid_set
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from store_fixtures import make_batch, write_store

FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)


def assert_one_error_line(result, path) -> None:
    """Exit code 2 and exactly one non-empty line, ``error: ...``, that names ``path``."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert path.name in lines[0], lines[0]


def test_a_bad_file_is_one_line_and_exit_2(tmp_path, goalprobe_cli):
    missing = tmp_path / "missing.h5"
    assert_one_error_line(goalprobe_cli("train-probe", missing, "--out", tmp_path / "o"), missing)
    text = tmp_path / "notes.h5"
    text.write_text("not a store\n")
    assert_one_error_line(goalprobe_cli("merge", text, "--out", tmp_path / "m.h5"), text)
    assert not (tmp_path / "m.h5").exists() and not (tmp_path / "o").exists()


# -- activation stores -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "valid.h5"
    rng = np.random.default_rng(0)
    return write_store(path, [make_batch(rng, [f"g{i % 6}" for i in range(24)], 0)])


ROOT_ATTRS = ("schema", "schema_version", "complete", "committed_rows", "stages", "layers",
              "d_model")  # fmt: skip
BAD_VALUES = ("", "[]", "[1, 2]", '["nowhere"]', "{}", -1, 10**9, 3.5)


def _datasets(path) -> list[str]:
    names: list[str] = []
    with h5py.File(path, "r") as f:
        f.visit(lambda name: names.append(name) if isinstance(f[name], h5py.Dataset) else None)
    return sorted(names)


store_mutation = st.one_of(
    st.tuples(st.just("drop_attr"), st.sampled_from(ROOT_ATTRS)),
    st.tuples(st.just("set_attr"), st.sampled_from(ROOT_ATTRS), st.sampled_from(BAD_VALUES)),
    st.tuples(st.just("drop_dataset"), st.integers(0, 10**6)),
    st.tuples(st.just("truncate"), st.floats(0.0, 0.95)),
    st.tuples(st.just("overwrite_bytes"), st.floats(0.0, 0.3), st.binary(min_size=8, max_size=64)),
)


def _mutate_store(source, target, mutation) -> None:
    shutil.copy(source, target)
    kind = mutation[0]
    if kind in ("drop_attr", "set_attr"):
        with h5py.File(target, "a") as f:
            if kind == "drop_attr":
                del f.attrs[mutation[1]]
            else:
                f.attrs[mutation[1]] = mutation[2]
    elif kind == "drop_dataset":
        names = _datasets(target)
        with h5py.File(target, "a") as f:
            del f[names[mutation[1] % len(names)]]
    else:
        data = bytearray(target.read_bytes())
        at = int(len(data) * mutation[1])
        if kind == "truncate":
            data = data[:at]
        else:
            data[at : at + len(mutation[2])] = mutation[2]
        target.write_bytes(bytes(data))


def _store_is_readable(path) -> bool:
    try:
        with ActivationStore(path):
            return True
    except (OSError, ValueError):
        return False


@FUZZ
@given(
    mutation=store_mutation, verb=st.sampled_from(("train-probe", "train-plan-decoder", "merge"))
)
def test_malformed_stores_fail_in_one_line(tmp_path, goalprobe_cli, valid_store, mutation, verb):
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    store = case / "store.h5"
    _mutate_store(valid_store, store, mutation)
    assume(not _store_is_readable(store))
    out = case / ("merged.h5" if verb == "merge" else "out")
    result = goalprobe_cli(verb, store, "--out", out)
    assert_one_error_line(result, store)
    assert not out.exists()


# -- grid sets -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_grid_lines(tmp_path_factory):
    path = tmp_path_factory.mktemp("grids") / "grids.jsonl"
    write_grid_set(path, generate_grid_set(GridSetConfig((7,), (0.2,), 3, seed=1)))
    return path.read_text().splitlines()


grid_mutation = st.one_of(
    st.tuples(st.just("drop_field"), st.integers(0, 2), st.integers(0, 50)),
    st.tuples(
        st.just("set_field"),
        st.integers(0, 2),
        st.integers(0, 50),
        st.sampled_from((None, -3, "x", [], {}, 99, 2.5)),
    ),  # fmt: skip
    st.tuples(st.just("garbage_line"), st.integers(0, 3), st.text(min_size=1, max_size=20)),
    st.tuples(st.just("truncate"), st.floats(0.05, 0.95)),
    st.tuples(st.just("duplicate"), st.integers(0, 2)),
    st.just(("empty",)),
)


def _mutate_grids(lines: list[str], mutation) -> str:
    kind = mutation[0]
    lines = list(lines)
    if kind in ("drop_field", "set_field"):
        record = json.loads(lines[mutation[1]])
        key = sorted(record)[mutation[2] % len(record)]
        if kind == "drop_field":
            del record[key]
        else:
            record[key] = mutation[3]
        lines[mutation[1]] = json.dumps(record)
    elif kind == "garbage_line":
        lines.insert(mutation[1], mutation[2].replace("\n", " "))
    elif kind == "duplicate":
        lines.append(lines[mutation[1]])
    elif kind == "empty":
        return ""
    text = "".join(line + "\n" for line in lines)
    if kind == "truncate":
        text = text[: int(len(text) * mutation[1])]
    return text


def _grids_are_readable(path) -> bool:
    try:
        return bool(read_grid_set(path))
    except (OSError, ValueError):
        return False


@FUZZ
@given(mutation=grid_mutation)
def test_malformed_grid_sets_fail_in_one_line(tmp_path, goalprobe_cli, valid_grid_lines, mutation):
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    grids = case / "grids.jsonl"
    grids.write_text(_mutate_grids(valid_grid_lines, mutation))
    assume(not _grids_are_readable(grids))
    out = case / "trajectories.jsonl"
    assert_one_error_line(goalprobe_cli("rollout", grids, "--out", out), grids)
    assert not out.exists()


# -- trajectory files ------------------------------------------------------------------------

NO_MODEL = "/nonexistent/model"  # every verb must refuse the file before it loads a model


@pytest.fixture(scope="module")
def valid_trajectory(tmp_path_factory):
    """A run directory whose trajectory file (prompt-only states) is valid: its lines, and the
    run directory's grid set and (placeholder) store for `score`."""
    from typer.testing import CliRunner

    from goalprobe.cli import app

    root = tmp_path_factory.mktemp("trajectories")
    grids = root / "grids.jsonl"
    write_grid_set(grids, generate_grid_set(GridSetConfig((5,), (0.2,), 3, seed=2)))
    path = root / "trajectories.jsonl"
    result = CliRunner().invoke(app, ["states", str(grids), "--out", str(path), "--per-grid", "2"])
    assert result.exit_code == 0, result.output
    return path.read_text().splitlines(), grids


BAD_FIELD_VALUES = (None, -1, "x", [], {}, [-5], [1.5], ["a"], 10**20, 2.5, True)

trajectory_mutation = st.one_of(
    st.tuples(st.just("drop_field"), st.integers(0, 10**6), st.integers(0, 50)),
    st.tuples(
        st.just("set_field"),
        st.integers(0, 10**6),
        st.integers(0, 50),
        st.sampled_from(BAD_FIELD_VALUES),
    ),
    st.tuples(st.just("bad_token_id"), st.integers(1, 10**6), st.sampled_from((-1, 2.5, "7"))),
    st.tuples(st.just("garbage_line"), st.integers(0, 10**6), st.text(min_size=1, max_size=20)),
    st.tuples(st.just("drop_line"), st.integers(0, 10**6)),
    st.tuples(st.just("duplicate"), st.integers(0, 10**6)),
    st.tuples(st.just("swap"), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.tuples(st.just("truncate"), st.floats(0.0, 0.95)),
    st.sampled_from((("empty",), ("header_only",), ("blank_line",))),
)


def _mutate_trajectory(lines: list[str], mutation) -> str:
    kind, lines = mutation[0], list(lines)
    if kind == "empty":
        return ""
    if kind == "header_only":
        return lines[0] + "\n"
    if kind in ("drop_field", "set_field", "bad_token_id"):
        at = mutation[1] % len(lines)
        if kind == "bad_token_id":
            at = max(at, 1)  # a step or episode line
        record = json.loads(lines[at])
        if kind == "bad_token_id":
            ids = record.get("prompt_token_ids")
            if ids is None:  # an episode line: no ids; break its length instead
                record["length"] = mutation[2]
            else:
                ids[len(ids) // 2] = mutation[2]
        else:
            key = sorted(record)[mutation[2] % len(record)]
            if kind == "drop_field":
                del record[key]
            else:
                record[key] = mutation[3]
        lines[at] = json.dumps(record)
    elif kind == "garbage_line":
        lines.insert(mutation[1] % (len(lines) + 1), mutation[2].replace("\n", " "))
    elif kind == "drop_line":
        del lines[mutation[1] % len(lines)]
    elif kind == "duplicate":
        lines.append(lines[mutation[1] % len(lines)])
    elif kind == "swap":
        i, j = mutation[1] % len(lines), mutation[2] % len(lines)
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "blank_line":
        lines.insert(1, "")
    text = "".join(line + "\n" for line in lines)
    if kind == "truncate":
        text = text[: int(len(text) * mutation[1])]
    return text


def _trajectory_is_usable(path) -> bool:
    from goalprobe.agents.trajectories import trajectory_stats

    try:
        return trajectory_stats(path).episodes > 0
    except (OSError, ValueError):
        return False


@FUZZ
@given(mutation=trajectory_mutation, verb=st.sampled_from(("extract", "patch", "score", "view")))
def test_malformed_trajectories_fail_in_one_line(
    tmp_path, goalprobe_cli, valid_trajectory, valid_store, mutation, verb
):
    lines, grids = valid_trajectory
    run = Path(tempfile.mkdtemp(dir=tmp_path))
    path = run / "rollouts" / "trajectories.jsonl"
    path.parent.mkdir()
    path.write_text(_mutate_trajectory(lines, mutation))
    assume(not _trajectory_is_usable(path))
    (run / "grids").mkdir()
    shutil.copy(grids, run / "grids" / "grids.jsonl")
    (run / "activations").mkdir()
    shutil.copy(valid_store, run / "activations" / "activations.h5")
    out = run / "out"
    args = {
        "extract": ("extract", path, "--out", out, "--model", NO_MODEL),
        "patch": ("patch", "--trajectories", path, "--out", out, "--model", NO_MODEL),
        "score": ("score", run, "--no-progress"),
        "view": ("view", run, "--export", out),
    }[verb]
    assert_one_error_line(goalprobe_cli(*args), path)
    assert not out.exists() and not (run / "out.parts").exists()
    assert not (run / "scoring").exists()
