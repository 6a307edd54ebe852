"""``goalprobe extract`` end to end: real trajectories, a tiny GPT-OSS, SIGKILL and resume, shards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch
from agent_fixtures import replay_model
from goalprobe.activations.capture import make_backend
from goalprobe.activations.extract import ExtractConfig, default_layers, extract, sha256_file
from goalprobe.activations.store import ActivationStore, shard_of
from goalprobe.agents.harmony import (
    HarmonyTokenIds,
)
from goalprobe.agents.models import load_model
from goalprobe.agents.trajectories import read_steps, read_trajectories
from goalprobe.gridworld.core import LABEL_CANVAS, SYMBOLS, Action, CellType
from goalprobe.gridworld.text import padded_cell_types, parse
from goalprobe.probes.plan_metrics import encode_plans

LAYERS = (0, 2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """A tiny random GPT-OSS saved like a checkpoint (config, weights, tokenizer)."""
    model = replay_model(tokenizer)
    directory = tmp_path_factory.mktemp("model")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(str(model_dir), device="cpu")


CONFIG = ExtractConfig(layers=LAYERS, batch_size=2, rows_per_part=2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, trajectories, loaded):
    """An uninterrupted extraction (plain hooks)."""
    out = tmp_path_factory.mktemp("ref") / "reference.h5"
    capture = make_backend("hooks", loaded.model, loaded.tokenizer)
    extract(trajectories, out, capture, loaded.tokenizer, CONFIG, model_id=loaded.model_id)
    return out


def store_contents(path) -> dict[str, np.ndarray]:
    """Every dataset of a store (no attributes), for exact comparisons."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
            )
        )
    return out


def test_default_layers_spread():
    assert default_layers(24) == (7, 15, 23)
    assert default_layers(4) == (1, 2, 3)
    assert default_layers(3) == (0, 1, 2)


def test_rows_labels_anchors_and_activations(tmp_path, trajectories, loaded):
    steps = list(read_steps(trajectories))
    config = ExtractConfig(layers=LAYERS, grid_cells=True, batch_size=3, rows_per_part=4)
    capture = make_backend("nnsight", loaded.model, loaded.tokenizer)
    report = extract(
        trajectories, tmp_path / "s.h5", capture, loaded.tokenizer, config, model_id="tiny"
    )
    assert report.rows == report.trajectory_steps == len(steps) and report.parts_computed == -(
        -len(steps) // 4
    )
    assert not (tmp_path / "s.h5.parts").exists()
    special = HarmonyTokenIds.from_tokenizer(loaded.tokenizer)
    with ActivationStore(tmp_path / "s.h5") as store:
        assert store.attrs["trajectory_sha256"] == sha256_file(trajectories)
        assert store.attrs["backend"] == "nnsight" and store.attrs["layers"].tolist() == [0, 2]
        assert store.attrs["anchor_token_ids"]["assistant"] == special.assistant
        labels = store.labels()
        assert labels["step_index"].tolist() == list(range(len(steps)))
        for i, s in enumerate(steps):
            assert (labels["grid_id"][i], labels["episode"][i], labels["step"][i]) == (
                s.grid_id,
                s.episode,
                s.step,
            )
            assert labels["action_valid"][i] == s.valid
            if s.valid:
                assert labels["action"][i] == Action[s.action]
            mask = [a.name in s.optimal_actions for a in Action]
            assert labels["optimal_actions"][i].tolist() == mask
            assert labels["distance_to_goal"][i] == s.distance_to_goal
            assert tuple(labels["agent_row_col"][i]) == s.agent_row_col
            assert np.array_equal(labels["cell_types"][i], padded_cell_types(*parse(s.grid_text)))
        episodes = list(read_trajectories(trajectories))
        remaining = [
            [Action[x.action] for x in ep.steps[t:] if x.valid]
            for ep in episodes
            for t in range(len(ep.steps))
        ]
        assert np.array_equal(labels["plan"], encode_plans(remaining))
        assert 0 < labels["action_valid"].sum() < len(steps)

        pre = store.positions("pre_reasoning")
        post = store.positions("post_reasoning")
        has_reasoning = np.asarray([bool(s.reasoning) for s in steps])
        assert np.array_equal(store.present("post_reasoning"), has_reasoning)
        assert 0 < has_reasoning.sum() < len(steps)
        model = loaded.model
        for i, s in enumerate(steps):
            ids = [*s.prompt_token_ids, *s.generated_token_ids]
            anchor = [special.end, special.start, special.assistant]
            assert [ids[p] for p in pre[i]] == anchor and pre[i][2] == len(s.prompt_token_ids) - 1
            if has_reasoning[i]:
                assert [ids[p] for p in post[i]] == anchor and post[i][0] > pre[i][2]
            # a full, uncut, unpadded forward of the whole recorded sequence; the block outputs
            # are read with hooks (hidden_states[-1] would be after the final norm)
            hidden = {}
            blocks = model.model.layers
            handles = [
                blocks[x].register_forward_hook(
                    lambda m, a, o, x=x, h=hidden: h.__setitem__(
                        x, o[0] if isinstance(o, tuple) else o
                    )
                )
                for x in LAYERS
            ]
            with torch.inference_mode():
                model(torch.tensor([ids]))
            for h in handles:
                h.remove()
            for layer in LAYERS:
                for stage, pos, here in (
                    ("pre_reasoning", pre, True),
                    ("post_reasoning", post, has_reasoning[i]),
                ):
                    if not here:
                        continue
                    want = hidden[layer][0, pos[i]].numpy().astype(np.float16)
                    got = store.read(stage, layer, [i])[0]
                    np.testing.assert_allclose(
                        got.astype(np.float32), want.astype(np.float32), atol=2e-3, rtol=2e-3
                    )
        # grid-cell tokens hold the symbol of their cell; cells off the grid are padding
        cells = store.positions("grid_cells")
        for i, s in enumerate(steps):
            kinds = labels["cell_types"][i].reshape(-1)
            for flat, kind in enumerate(kinds):
                if kind == CellType.PADDING:
                    assert cells[i, flat] == 0
                    continue
                piece = loaded.tokenizer.decode([s.prompt_token_ids[cells[i, flat]]])
                assert piece.strip() == SYMBOLS[CellType(kind)]
        assert store.read("grid_cells", 2, [0]).shape == (1, LABEL_CANVAS * LABEL_CANVAS, 32)


def _kill_when(proc: subprocess.Popen, condition, timeout: float = 120) -> bool:
    """SIGKILL ``proc`` as soon as ``condition()`` holds; False when it exited first (rc 0)."""
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            output = proc.stdout.read()
            assert proc.returncode == 0, output
            return False
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"condition not reached within {timeout} s")
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return True


def _run_cli(args, env):
    code = "import typer; from goalprobe.commands.extract import command; typer.run(command)"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_sigkill_then_rerun_gives_exactly_the_uninterrupted_rows(
    tmp_path, trajectories, model_dir, reference, capsys
):
    out = tmp_path / "killed.h5"
    parts = tmp_path / "killed.h5.parts"
    args = [
        str(trajectories),
        "--out",
        str(out),
        "--model",
        str(model_dir),
        "--device",
        "cpu",
        "--backend",
        "hooks",
        "--layers",
        "0,2",
        "--batch-size",
        "2",
        "--rows-per-part",
        "2",
        "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # 1. killed while computing parts (as soon as the second part is on disk)
    proc = _run_cli(args, env)
    assert _kill_when(proc, lambda: (parts / "part_000001.h5").exists())
    assert not out.exists()
    done_before = sorted(p.name for p in parts.glob("part_*.h5"))
    assert done_before[:2] == ["part_000000.h5", "part_000001.h5"]

    # 2. rerun, killed while it assembles the store from the parts (if it gets that far first)
    proc = _run_cli(args, env)
    killed_in_assembly = _kill_when(proc, lambda: (tmp_path / ".killed.h5.tmp").exists())
    if killed_in_assembly:
        assert not out.exists() and parts.exists()

    # 3. the rerun (in-process, same command) finishes from whatever the killed runs left
    from goalprobe.commands.extract import command

    command(
        trajectories,
        out=out,
        model=str(model_dir),
        device="cpu",
        backend="hooks",
        layers="0,2",
        batch_size=2,
        rows_per_part=2,
        progress=False,
    )
    output = capsys.readouterr().out
    assert "0 part(s) computed" in output or not killed_in_assembly, output
    assert not parts.exists()
    got, want = store_contents(out), store_contents(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def test_resume_refuses_parts_or_outputs_of_another_extraction(tmp_path, trajectories, loaded):
    capture = make_backend("hooks", loaded.model, loaded.tokenizer)
    out = tmp_path / "s.h5"
    parts = tmp_path / "s.h5.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text(
        json.dumps({"schema": "goalprobe.extract_parts/1", "config": {}, "model_id": "x"})
    )
    with pytest.raises(ValueError, match=r"s\.h5\.parts holds parts of another extraction.*config"):
        extract(trajectories, out, capture, loaded.tokenizer, CONFIG, model_id="tiny")
    (parts / "manifest.json").unlink()
    extract(trajectories, out, capture, loaded.tokenizer, CONFIG, model_id="tiny")
    again = extract(trajectories, out, capture, loaded.tokenizer, CONFIG, model_id="tiny")
    assert again.already_complete and again.parts_computed == 0
    other = ExtractConfig(layers=(1,), batch_size=2, rows_per_part=2)
    with pytest.raises(ValueError, match="another extraction"):
        extract(trajectories, out, capture, loaded.tokenizer, other, model_id="tiny")
    report = extract(
        trajectories, out, capture, loaded.tokenizer, other, model_id="tiny", overwrite=True
    )
    with ActivationStore(report.output) as store:
        assert store.layers == (1,)


def test_shards_partition_grids_and_merge_to_the_unsharded_store(
    tmp_path, trajectories, loaded, reference, capsys
):
    capture = make_backend("hooks", loaded.model, loaded.tokenizer)
    paths = []
    for index in range(2):
        config = ExtractConfig(layers=LAYERS, batch_size=2, rows_per_part=2, shard=f"{index}/2")
        path = tmp_path / f"shard{index}.h5"
        extract(trajectories, path, capture, loaded.tokenizer, config, model_id=loaded.model_id)
        with ActivationStore(path) as store:
            grids = set(store.labels(["grid_id"])["grid_id"])
            assert all(shard_of(g, 2) == index for g in grids)
        paths.append(path)
    from goalprobe.commands.merge import command as merge_command

    merged = tmp_path / "merged.h5"
    merge_command(list(reversed(paths)), out=merged)
    assert "rows from 2 shard(s)" in capsys.readouterr().out
    got, want = store_contents(merged), store_contents(reference)
    for name in want:
        if name.startswith("activations/") and "/layer_" in name:
            np.testing.assert_allclose(
                got[name].astype(np.float32), want[name].astype(np.float32), atol=2e-3
            )
        else:
            assert np.array_equal(got[name], want[name]), name


def test_a_step_without_anchors_is_named(tmp_path, trajectories, loaded):
    lines = trajectories.read_text().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    for i, line in enumerate(lines):
        record = json.loads(line)
        if record["kind"] == "step":
            record["prompt_token_ids"] = record["prompt_token_ids"][:-3]
            record["generated_token_ids"] = []
            lines[i] = json.dumps(record) + "\n"
            where = f"step {record['step']} of episode {record['episode']} on grid {record['grid_id']!r}"
            break
    bad.write_text("".join(lines))
    capture = make_backend("hooks", loaded.model, loaded.tokenizer)
    with pytest.raises(ValueError, match=rf"bad\.jsonl: {where}: no pre-reasoning anchor"):
        extract(bad, tmp_path / "s.h5", capture, loaded.tokenizer, CONFIG, model_id="tiny")
    assert not (tmp_path / "s.h5").exists()


def test_the_attention_kernel_is_recorded_and_never_mixed(tmp_path, trajectories, loaded):
    """A store says which kernel computed its rows; resuming or merging across kernels is
    refused (their rows differ in the last digits, flex attention's by far more)."""
    from goalprobe.activations.store.merge import merge_shards
    from goalprobe.activations.store.schema import StoreFormatError
    from goalprobe.agents.attention import SINK_ATTENTION, set_attention

    model = loaded.model
    kernel = model.config._attn_implementation
    try:
        stores = {}
        for name in ("eager", SINK_ATTENTION):
            set_attention(model, name, "cpu")
            capture = make_backend("hooks", model, loaded.tokenizer)
            assert capture.attention == name
            config = ExtractConfig(layers=(1,), batch_size=2, rows_per_part=2, shard="0/2")
            stores[name] = tmp_path / f"{name}.h5"
            extract(trajectories, stores[name], capture, loaded.tokenizer, config, model_id="t")
            with ActivationStore(stores[name]) as store:
                assert store.attrs["attention"] == name
        # the same extraction resumed under the other kernel is another extraction
        with pytest.raises(ValueError, match="another extraction"):
            extract(trajectories, stores["eager"], capture, loaded.tokenizer, config, model_id="t")
        # shard 1 of 2 under the other kernel does not merge with shard 0
        set_attention(model, "eager", "cpu")
        other = tmp_path / "shard1.h5"
        config = ExtractConfig(layers=(1,), batch_size=2, rows_per_part=2, shard="1/2")
        capture = make_backend("hooks", model, loaded.tokenizer)
        extract(trajectories, other, capture, loaded.tokenizer, config, model_id="t")
        with pytest.raises(StoreFormatError, match="attribute 'attention'"):
            merge_shards([stores[SINK_ATTENTION], other], tmp_path / "merged.h5")
        merge_shards([stores["eager"], other], tmp_path / "merged.h5")
    finally:
        model.set_attn_implementation(kernel)


def test_an_extraction_names_its_layers(tmp_path):
    """Empty layers mean the default spread in a config (the demo's section), resolved by the
    caller once the model's depth is known; the extraction itself refuses them."""
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text("")
    assert ExtractConfig().layers == ()
    with pytest.raises(ValueError, match="layers is empty"):
        extract(trajectories, tmp_path / "store.h5", None, None, ExtractConfig(), model_id="m")
    with pytest.raises(ValueError, match="non-negative"):
        ExtractConfig(layers=(-1,))


@pytest.mark.parametrize("backend", ["hooks", "nnsight"])
def test_the_shared_prefix_cache_gives_the_same_rows_for_fewer_tokens(
    tmp_path, trajectories, loaded, backend
):
    """Extraction with the backends' shared-prefix KV cache (their default, on every device:
    the system and developer messages run once per prompt template and every batch continues
    from their cache) stores the rows whole-sequence replay stores, to float16 rounding, and
    the model runs fewer token positions than it is handed."""
    stores, counts = {}, {}
    for cached in (True, False):
        capture = make_backend(backend, loaded.model, loaded.tokenizer, prefix_cache=cached)
        assert capture.prefix_cache is cached
        stores[cached] = tmp_path / f"{cached}.h5"
        extract(trajectories, stores[cached], capture, loaded.tokenizer, CONFIG, model_id="t")
        counts[cached] = capture.capture_tokens
    assert counts[True]["replayed"] == counts[False]["replayed"] > 0
    assert counts[False]["run"] == counts[False]["replayed"]  # whole sequences
    assert counts[True]["run"] < 0.9 * counts[True]["replayed"], counts
    cached, whole = store_contents(stores[True]), store_contents(stores[False])
    assert cached.keys() == whole.keys()
    compared = 0
    for name, values in whole.items():
        if values.dtype == np.float16:
            compared += values.size
            np.testing.assert_allclose(
                cached[name].astype(np.float32), values.astype(np.float32), rtol=2e-3, atol=2e-3
            )
        else:
            np.testing.assert_array_equal(cached[name], values, err_msg=name)
    assert compared > 0
