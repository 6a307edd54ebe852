"""Each verb with a demo stage (train-probe, patch, extract, score) runs the stage's own task:
on the tiny run's inputs, with the stage's config, the verb writes the same files.

Files are compared byte for byte, except what names where, when or how fast a file was
written: JSON tables compare with the output directory's path replaced by a placeholder, the
``created`` time and the probes' per-epoch ``seconds`` left out; HDF5 files compare dataset by
dataset and attribute by attribute (the HDF5 container records its objects' modification
times), ``created`` aside.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from goalprobe.run_layout import RunLayout

pytestmark = pytest.mark.slow  # the session's tiny run (tests/demo_fixtures.py), a verb each


@pytest.fixture
def tiny_run(tiny_demo):
    """``(run directory, DemoConfig)`` of the default agent in the session's tiny run."""
    from goalprobe.config import demo_config

    result, _ = tiny_demo
    assert result.failed == {}, result.failed
    return result.run_dir, demo_config("tiny")


VOLATILE = ("created", "seconds")
"""Attributes and JSON keys that record when a file was written or how long a step took."""


def _json(path: Path, *where: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    for folder in where:
        text = text.replace(str(folder), "<out>")
    return _steady(json.loads(text))


def _steady(value):
    """``value`` without the :data:`VOLATILE` keys, at any depth."""
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    return value


def _h5_items(path: Path) -> dict:
    """Every dataset's values and every attribute of ``path``, by HDF5 path."""
    items: dict = {}
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            for key, value in obj.attrs.items():
                if key in VOLATILE:
                    continue
                if isinstance(value, str) and value.startswith("{"):  # a JSON card
                    value = _steady(json.loads(value))
                items[f"{name}@{key}"] = np.asarray(value, dtype=object).tolist()
            if isinstance(obj, h5py.Dataset):
                values = obj[()]
                if obj.dtype.kind == "O":  # variable-length strings: their text
                    values = np.asarray(obj.asstr()[()]).astype(str)
                items[name] = (obj.dtype.str, obj.shape, np.asarray(values).tobytes())

        visit("/", f)
        f.visititems(visit)
    return items


def _same_file(verb: Path, stage: Path, *where: Path) -> None:
    if verb.suffix == ".json":
        assert _json(verb, *where) == _json(stage, *where), verb.name
    elif verb.suffix == ".h5":
        assert _h5_items(verb) == _h5_items(stage), verb.name
    else:
        assert verb.read_bytes() == stage.read_bytes(), verb.name


def test_train_probe_is_the_probes_stage(tiny_run, tmp_path, goalprobe_cli):
    root, config = tiny_run
    layout, p = RunLayout(root), config.probes
    out = tmp_path / "probe"
    t = p.training
    result = goalprobe_cli(
        "train-probe", layout.store, "--out", out, "--probe", "coordinate", "--family", "mlp",
        "--stages", "pre_reasoning,post_reasoning", "--layers", "1,2,3",
        "--hidden-size", t.hidden_size, "--max-epochs", t.max_epochs, "--batch-size",
        t.batch_size, "--lr", t.learning_rate, "--class-balance", p.class_balance,
        "--coordinates", p.coordinates, "--test-fraction", p.test_fraction,
        "--n-bootstrap", p.n_bootstrap, "--seed", p.seed, "--device", "cpu", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    models = sorted((out / "models").iterdir())
    decoded = sorted((out / "decoded").iterdir())
    assert len(models) == 2 * 6 and len(decoded) == 6  # 2 stages x 3 layers, card + tensors
    for file in models:
        _same_file(file, layout.probe_models / file.name, out, root / "probes")
    for file in decoded:
        _same_file(file, layout.decoded_dir / file.name)
    _same_file(out / "sweep.json", layout.probe_sweep("cell_coordinate_mlp"), out, root / "probes")


def test_patch_is_the_patching_stage(tiny_run, tmp_path, goalprobe_cli, monkeypatch):
    root, _ = tiny_run
    layout = RunLayout(root)
    section = json.loads((root / "demo_config.json").read_text())["patching"]
    (tmp_path / "patching.json").write_text(json.dumps(section))
    out = tmp_path / "patch"
    monkeypatch.chdir(root)  # the stage records its input relative to the run
    result = goalprobe_cli(
        "patch", "--trajectories", layout.relative(layout.trajectories), "--config",
        tmp_path / "patching.json", "--decision-lens", layout.decision_lens, "--out", out,
        "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    written = sorted(out.iterdir())
    assert {f.name for f in written} >= {"patch_results.json", "patch_pairs.jsonl"}
    for file in written:
        _same_file(file, layout.patching_dir / file.name)


def test_extract_is_the_activations_stage(tiny_run, tmp_path, goalprobe_cli):
    root, config = tiny_run
    layout, a = RunLayout(root), config.activations.extract
    out = tmp_path / "activations.h5"
    result = goalprobe_cli(
        "extract", layout.trajectories, "--out", out, "--batch-size", a.batch_size,
        "--reasoning-every", a.reasoning_every, "--device", "cpu", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    _same_file(out, layout.store)


def test_score_is_the_scoring_stage(tiny_run, tmp_path, goalprobe_cli):
    root, config = tiny_run
    s = config.scoring
    copy = tmp_path / "run"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("scoring"))
    result = goalprobe_cli(
        "score", copy, "--n-bootstrap", s.n_bootstrap, "--confidence", s.confidence_level,
        "--seed", s.random_state, "--top-k", ",".join(map(str, s.top_k)), "--utility",
        s.utility, "--key-utility", s.key_utility, "--horizon", s.horizon, "--subjective-map",
        s.subjective_map, "--weighting", s.weighting, "--jobs", s.n_jobs, "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    stage_dir = RunLayout(root).scoring_dir
    written = sorted(p for p in (copy / "scoring").rglob("*") if p.is_file())
    assert {f.name for f in written} >= {"belief.json", "belief.csv", "meg.json", "meg.csv"}
    for file in written:
        _same_file(file, stage_dir / file.relative_to(copy / "scoring"), copy, root)
