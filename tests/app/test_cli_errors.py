"""The command line's rules for bad inputs (issue 19): arguments checked before any model loads,
one rule for existing outputs (refused unless --overwrite; rollout, states --resume and a finished
extract resume), one rule for empty inputs (an error), token ids checked against the vocabulary,
and stores of another rollout refused by ``patch`` and flagged by ``view``.

Every error is one line ``error: ...`` with exit code 2. "Before the model loads" is tested by
naming a model that does not exist: the error must be about the argument, not the model.
"""

from __future__ import annotations

import json

import pytest
from goalprobe.agents.trajectories import TrajectoryFormatError, trajectory_stats
from store_fixtures import write_store
from typer.testing import CliRunner

NO_MODEL = "/nonexistent/model-that-would-take-long-to-load"


def one_error_line(result) -> str:
    """The single ``error: ...`` line of a failed call (exit code 2)."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def last_error_line(result) -> str:
    """The one ``error: ...`` line, last, of a call that loaded a model (transformers may draw
    a progress bar on stderr before it)."""
    errors = [line for line in result.output.splitlines() if line.startswith("error")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert result.output.strip().splitlines()[-1] == errors[0]
    return errors[0]


def not_about_the_model(line: str) -> None:
    assert "nonexistent" not in line and "Hugging Face" not in line, line


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Grids, two prompt-only trajectory files of different runs, and a store of the first."""
    from goalprobe.cli import app

    root = tmp_path_factory.mktemp("cli")
    runner = CliRunner()

    def ok(*args):
        result = runner.invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output

    ok(
        "grids",
        "--out",
        root / "grids.jsonl",
        "--sizes",
        "7",
        "--densities",
        "0.2",
        "--per-cell",
        2,
    )
    ok("states", root / "grids.jsonl", "--out", root / "a.jsonl", "--per-grid", 2)
    ok("states", root / "grids.jsonl", "--out", root / "b.jsonl", "--per-grid", 2, "--seed", 9)
    ok("extract", root / "a.jsonl", "--out", root / "a.h5", "--backend", "hooks", "--no-progress")
    lines = (root / "a.jsonl").read_text().splitlines()
    (root / "header_only.jsonl").write_text(lines[0] + "\n")
    (root / "empty.jsonl").write_text("")
    step = json.loads(lines[1])
    step["prompt_token_ids"][3] = 10**6
    (root / "foreign_ids.jsonl").write_text(
        "\n".join([lines[0], json.dumps(step), *lines[2:]]) + "\n"
    )
    write_store(root / "no_rows.h5", [])
    return root


EXTRACT_BAD = [
    (["--shard", "3/2"], "shard"),
    (["--stages", "nowhere"], "stages"),
    (["--rows-per-part", "0"], "rows_per_part"),
    (["--batch-size", "0"], "batch_size"),
    (["--layers", "1,x"], "--layers"),
    (["--layers", "-2"], "layers"),
    (["--compression", "zip"], "compression"),
    (["--backend", "jax"], "--backend"),
    (["--attn-implementation", "sdpa"], "--attn-implementation"),
    (["--attn-implementation", "flex_attention"], "needs a local model on --device cuda"),
]


@pytest.mark.parametrize(("args", "named"), EXTRACT_BAD)
def test_extract_checks_every_argument_before_loading_the_model(
    files, tmp_path, goalprobe_cli, args, named
):
    out = tmp_path / "x.h5"
    result = goalprobe_cli("extract", files / "a.jsonl", "--out", out, "--model", NO_MODEL, *args)
    line = one_error_line(result)
    assert named in line
    not_about_the_model(line)
    assert not out.exists() and not (tmp_path / "x.h5.parts").exists()


def test_extract_checks_the_input_and_the_output_before_loading_the_model(
    files, tmp_path, goalprobe_cli
):
    other = tmp_path / "notes.h5"
    other.write_text("keep me\n")
    for trajectories, out, named in [
        (files / "empty.jsonl", tmp_path / "x.h5", "empty.jsonl"),
        (files / "header_only.jsonl", tmp_path / "x.h5", "no finished episode"),
        (files / "grids.jsonl", tmp_path / "x.h5", "grids.jsonl"),  # not a trajectory file
        (files / "a.jsonl", other, "--overwrite"),  # an existing output of something else
        (files / "a.jsonl", tmp_path, "is a directory"),
    ]:
        line = one_error_line(
            goalprobe_cli("extract", trajectories, "--out", out, "--model", NO_MODEL)
        )
        assert named in line
        not_about_the_model(line)
    assert other.read_text() == "keep me\n"
    assert not (tmp_path / "x.h5").exists()


def test_a_finished_extraction_resumes_and_anything_else_needs_overwrite(
    files, tmp_path, goalprobe_cli
):
    out = tmp_path / "a.h5"
    out.write_bytes((files / "a.h5").read_bytes())
    again = goalprobe_cli("extract", files / "a.jsonl", "--out", out, "--backend", "hooks")
    assert again.exit_code == 0 and "already complete" in again.output, again.output
    # other stages: not this extraction's store, refused before the model
    line = one_error_line(
        goalprobe_cli(
            "extract",
            files / "a.jsonl",
            "--out",
            out,
            "--stages",
            "pre_reasoning",
            "--model",
            NO_MODEL,
        )
    )
    assert "--overwrite" in line
    not_about_the_model(line)


def test_token_ids_outside_the_vocabulary_name_file_line_and_step(files, tmp_path, goalprobe_cli):
    out = tmp_path / "x.h5"
    path = files / "foreign_ids.jsonl"
    line = last_error_line(goalprobe_cli("extract", path, "--out", out, "--backend", "hooks"))
    assert f"{path.name}:2:" in line and "step 0 of episode" in line and "1000000" in line
    assert "vocabulary" in line
    assert not out.exists()
    line = last_error_line(
        goalprobe_cli(
            "patch", "--trajectories", path, "--out", tmp_path / "p", "--backend", "hooks"
        )
    )
    assert f"{path.name}:2:" in line and "vocabulary" in line
    # a negative id is no token id for any model: the reader refuses it
    record = json.loads(path.read_text().splitlines()[1])
    record["generated_token_ids"] = [-1]
    bad = tmp_path / "negative.jsonl"
    lines = path.read_text().splitlines()
    bad.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    with pytest.raises(TrajectoryFormatError, match=r"negative\.jsonl:2: .*token id"):
        trajectory_stats(bad)


def test_patch_checks_its_arguments_before_loading_the_model(files, tmp_path, goalprobe_cli):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me\n")
    traj = ["--trajectories", files / "a.jsonl"]
    for args, named in [
        ([*traj, "--out", tmp_path / "p", "--layers", "thirds,x"], "--layers"),
        ([*traj, "--out", tmp_path / "p", "--backend", "jax"], "--backend"),
        ([*traj, "--out", busy], "--overwrite"),
        (["--trajectories", files / "empty.jsonl", "--out", tmp_path / "p"], "empty.jsonl"),
        (["--trajectories", files / "header_only.jsonl", "--out", tmp_path / "p"], "no finished"),
        (["--grids", files / "empty.jsonl", "--out", tmp_path / "p"], "no grids"),
    ]:
        line = one_error_line(goalprobe_cli("patch", *args, "--model", NO_MODEL))
        assert named in line
        not_about_the_model(line)
    assert (busy / "notes.txt").read_text() == "keep me\n"
    assert not (tmp_path / "p").exists()


def test_patch_refuses_a_store_of_another_rollout(files, tmp_path, goalprobe_cli):
    out = tmp_path / "p"
    line = one_error_line(
        goalprobe_cli(
            "patch",
            "--trajectories",
            files / "b.jsonl",
            "--store",
            files / "a.h5",
            "--out",
            out,
            "--model",
            NO_MODEL,
        )
    )
    run_a = trajectory_stats(files / "a.jsonl").run_id
    run_b = trajectory_stats(files / "b.jsonl").run_id
    assert "a.h5" in line and run_a in line and run_b in line and "--store" in line
    line = one_error_line(
        goalprobe_cli(
            "patch",
            "--grids",
            files / "grids.jsonl",
            "--store",
            files / "a.h5",
            "--out",
            out,
            "--model",
            NO_MODEL,
        )
    )
    assert "--trajectories" in line
    assert not out.exists()


def _run_dir(root, trajectories, store=None):
    (root / "grids").mkdir(parents=True)
    (root / "rollouts").mkdir()
    (root / "grids" / "grids.jsonl").write_bytes((trajectories.parent / "grids.jsonl").read_bytes())
    (root / "rollouts" / "trajectories.jsonl").write_bytes(trajectories.read_bytes())
    if store is not None:
        (root / "activations").mkdir()
        (root / "activations" / "activations.h5").write_bytes(store.read_bytes())
    return root


def test_view_flags_a_store_of_another_rollout(files, tmp_path, goalprobe_cli):
    from goalprobe.viewer.data import RunData

    run = _run_dir(tmp_path / "run", files / "b.jsonl", files / "a.h5")
    page = tmp_path / "page.html"
    result = goalprobe_cli("view", run, "--export", page)
    assert result.exit_code == 0, result.output
    warning = [line for line in result.output.splitlines() if line.startswith("warning")]
    assert warning and "another rollout" in " ".join(result.output.split())
    assert page.is_file()
    data = RunData(run)
    notice = data.check_store()
    assert notice is not None and notice in data.missing
    assert trajectory_stats(files / "a.jsonl").run_id in notice.reason
    # the store of this run's own rollout raises no flag
    own = _run_dir(tmp_path / "own", files / "a.jsonl", files / "a.h5")
    assert RunData(own).check_store() is None


def test_view_refuses_empty_and_malformed_trajectories(files, tmp_path, goalprobe_cli):
    for name in ("empty.jsonl", "header_only.jsonl", "grids.jsonl"):
        run = _run_dir(tmp_path / name, files / name)
        line = one_error_line(goalprobe_cli("view", run, "--export", tmp_path / "page.html"))
        assert "trajectories.jsonl" in line
    assert not (tmp_path / "page.html").exists()


def test_existing_outputs_are_never_overwritten_without_overwrite(files, tmp_path, goalprobe_cli):
    taken = tmp_path / "taken.txt"
    taken.write_text("keep me\n")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me\n")
    run = _run_dir(tmp_path / "run", files / "a.jsonl", files / "a.h5")
    (run / "scoring").mkdir()
    (run / "scoring" / "belief.json").write_text("{}")
    for args in [
        ("merge", files / "a.h5", "--out", taken),
        ("extract", files / "a.jsonl", "--out", taken, "--model", NO_MODEL),
        ("states", files / "grids.jsonl", "--out", taken),
        ("grids", "--out", taken),
        ("view", run, "--export", taken),
        ("train-probe", files / "a.h5", "--out", busy),
        ("train-plan-decoder", files / "a.h5", "--out", busy),
        ("patch", "--trajectories", files / "a.jsonl", "--out", busy, "--model", NO_MODEL),
        ("score", run),
    ]:
        line = one_error_line(goalprobe_cli(*args))
        assert "--overwrite" in line, (args, line)
    assert taken.read_text() == "keep me\n" and (busy / "notes.txt").read_text() == "keep me\n"
    assert (run / "scoring" / "belief.json").read_text() == "{}"


def test_empty_stores_are_refused(files, tmp_path, goalprobe_cli):
    store = files / "no_rows.h5"
    for args in [
        ("merge", store, "--out", tmp_path / "m.h5"),
        ("train-probe", store, "--out", tmp_path / "o"),
        ("train-plan-decoder", store, "--out", tmp_path / "o"),
    ]:
        line = one_error_line(goalprobe_cli(*args))
        assert "no_rows.h5" in line and "no rows" in line
    assert not (tmp_path / "m.h5").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--d-bottleneck", "17", "--n-heads", "2"], "--n-heads"),
        (["--decoder-layers", "1,0"], "--decoder-layers"),
        (["--control-layers", "0"], "--control-layers"),
        (["--layers", "1,x"], "--layers"),
    ],
)
def test_plan_decoder_options_fail_in_one_line_before_training(
    files, tmp_path, goalprobe_cli, args, named
):
    out = tmp_path / "o"
    line = one_error_line(goalprobe_cli("train-plan-decoder", files / "a.h5", "--out", out, *args))
    assert named in line
    assert not out.exists()


def test_rollout_and_demo_check_their_output_before_the_model(files, tmp_path, goalprobe_cli):
    grids = files / "grids.jsonl"
    for out, named in [(tmp_path, "is a directory"), (files / "a.h5", "a.h5:1")]:
        line = one_error_line(goalprobe_cli("rollout", grids, "--out", out, "--model", NO_MODEL))
        assert named in line
        not_about_the_model(line)
    taken = tmp_path / "taken"
    taken.write_text("")
    line = one_error_line(goalprobe_cli("demo", "--run-dir", taken, "--model", NO_MODEL))
    assert "--run-dir" in line and "not a directory" in line
    assert taken.is_file() and not taken.read_text()


@pytest.mark.parametrize(
    ("verb", "args", "named"),
    [
        ("rollout", ["--device", "gpu0"], "--device"),
        ("rollout", ["--template-dir", "/missing/templates"], "--template-dir"),
        ("rollout", ["--developer-role", "boss"], "--developer-role"),
        ("states", ["--template-dir", "/missing/templates"], "--template-dir"),
        ("extract", ["--device", "cuda:x"], "--device"),
        ("patch", ["--device", "gpu0"], "--device"),
        ("patch", ["--sizes", "7,x"], "--sizes"),
    ],
)
def test_device_and_directories_are_checked_before_the_model(
    files, tmp_path, goalprobe_cli, verb, args, named
):
    out = tmp_path / "out"
    inputs = {
        "rollout": [files / "grids.jsonl", "--out", out],
        "states": [files / "grids.jsonl", "--out", out],
        "extract": [files / "a.jsonl", "--out", out],
        "patch": ["--trajectories", files / "a.jsonl", "--out", out],
    }[verb]
    line = one_error_line(goalprobe_cli(verb, *inputs, "--model", NO_MODEL, *args))
    assert named in line
    not_about_the_model(line)
    assert not out.exists()


def test_a_failed_sweep_leaves_no_output_directory(files, tmp_path, goalprobe_cli):
    out = tmp_path / "o"
    result = goalprobe_cli(
        "train-plan-decoder", files / "a.h5", "--out", out, "--max-epochs", 1, "--n-bootstrap", 0,
        "--test-fraction", 0.9, "--validation-fraction", 0.9, "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 2 and "error: " in result.output, result.output
    assert not out.exists()


ABSURD_COUNTS = [
    (["grids", "--per-cell", "100000000000", "--out", "{tmp}/g.jsonl"], "--per-cell"),
    (["grids", "--per-cell", "40000", "--out", "{tmp}/g.jsonl"], "1,000,000"),
    (
        ["states", "{files}/grids.jsonl", "--per-grid", "100000", "--out", "{tmp}/s.jsonl"],
        "per-grid",
    ),
    (
        ["rollout", "{files}/grids.jsonl", "--episodes", "10000000", "--out", "{tmp}/r.jsonl"],
        "episodes",
    ),
    (["score", "{tmp}", "--n-bootstrap", "100000000"], "bootstrap"),
]


@pytest.mark.parametrize(("args", "named"), ABSURD_COUNTS)
def test_absurd_counts_are_refused_before_any_work(files, tmp_path, goalprobe_cli, args, named):
    """A count that would run for days or fill the disk is one error line, and nothing is
    written (the grid set of 40,000 per cell x 5 sizes x 6 densities would be 1.2 M grids)."""
    call = [a.format(tmp=tmp_path, files=files) for a in args]
    line = one_error_line(
        goalprobe_cli(*call, "--model", NO_MODEL) if call[0] == "rollout" else goalprobe_cli(*call)
    )
    assert named in line, line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "0.0.0.256", "no such host.invalid"])
def test_serve_and_view_refuse_a_host_they_cannot_bind_before_loading(
    files, tmp_path, goalprobe_cli, host
):
    line = one_error_line(goalprobe_cli("serve", "--host", host, "--model", NO_MODEL))
    assert "--host" in line and repr(host) in line, line
    not_about_the_model(line)
    (tmp_path / "run").mkdir()
    line = one_error_line(goalprobe_cli("view", tmp_path / "run", "--host", host))
    assert "--host" in line, line


def test_demo_with_a_model_that_cannot_load_is_one_error_before_any_stage(
    tmp_path, goalprobe_cli, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub cannot be used
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # nothing cached
    for model, named in [(NO_MODEL, "no such model directory"), ("nobody/no-such-model", "cache")]:
        run_dir = tmp_path / model.replace("/", "_")
        line = one_error_line(goalprobe_cli("demo", "--run-dir", run_dir, "--model", model))
        assert "--model" in line and named in line
        assert not run_dir.exists()  # no stage ran, no report of nothing


def test_model_commit_is_read_from_a_cached_snapshot(tmp_path, monkeypatch):
    from goalprobe.agents.models import check_model_available, model_commit

    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "models--org--tiny" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert model_commit("org/tiny") == commit  # cached: offline is fine
    check_model_available("org/tiny")
    assert model_commit(str(snapshot)) == commit  # the snapshot directory itself
    assert model_commit("bundled") == "" and model_commit("org/other") == ""


def test_demo_flex_attention_without_cuda_is_one_error_before_any_stage(tmp_path, goalprobe_cli):
    run_dir = tmp_path / "run"
    for value, named in [
        ("flex_attention", "needs --device cuda"),
        ("sdpa", "expected 'agent', 'eager'"),
    ]:
        line = one_error_line(
            goalprobe_cli(
                "demo", "--run-dir", run_dir, "--set", f"activations.attn_implementation={value}"
            )
        )
        assert "attn_implementation" in line and named in line, line
        assert not run_dir.exists()


def test_the_replay_attention_is_restored_after_extraction():
    """The demo's extraction switches the shared model's attention only while it runs."""
    from goalprobe.agents.bundled import load_bundled_agent

    from goalprobe.stages.activations import attention

    model, _ = load_bundled_agent()
    assert model.config._attn_implementation == "eager"
    with attention(model, "flex_attention"):  # switched (not run: sinks need CUDA)
        assert model.config._attn_implementation == "flex_attention"
    assert model.config._attn_implementation == "eager"
    with attention(model, "agent"):  # the loaded kernel, untouched
        assert model.config._attn_implementation == "eager"
    with pytest.raises(RuntimeError, match="inside"):
        with attention(model, "flex_attention"):
            raise RuntimeError("inside")
    assert model.config._attn_implementation == "eager"


def test_a_server_failure_in_any_verb_is_one_line_and_exit_2():
    """A server that is down or answers no completion is the environment, not a bug: under the
    command group (every verb: rollout, demo) its ServerError is one ``error: server: <what,
    URL>`` line and exit 2, while any other RuntimeError still shows its traceback.

    ``goalprobe patch`` itself sends no request (it replays server trajectories on the local
    model), so the rule is tested on the group, with a real client against a closed port."""
    import socket

    import typer
    from goalprobe.agents.backend import SamplingConfig
    from goalprobe.agents.harmony import Message
    from goalprobe.agents.server_backend import ServerBackend, ServerConfig

    from goalprobe.cli import OneLineErrors

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = typer.Typer(cls=OneLineErrors)

    @app.command()
    def ask() -> None:
        config = ServerConfig(
            base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=0, api_key_env=None
        )
        ServerBackend(config).generate([[Message("user", "hi")]], SamplingConfig())

    @app.command()
    def bug() -> None:
        raise RuntimeError("a bug")

    line = one_error_line(CliRunner().invoke(app, ["ask"]))
    assert line.startswith("error: server: ") and f"127.0.0.1:{port}" in line, line
    result = CliRunner().invoke(app, ["bug"])
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)


def test_extract_max_batch_tokens_is_checked_before_the_model_and_bounds_the_batches(
    files, tmp_path, goalprobe_cli
):
    """``--max-batch-tokens N``: a negative N is refused before any model loads; a given N is
    the store's token budget (its identity records it) and changes no row; without it, the
    planner's budget is used."""
    import numpy as np
    from goalprobe.activations.store import ActivationStore

    out = tmp_path / "x.h5"
    line = one_error_line(
        goalprobe_cli(
            "extract",
            files / "a.jsonl",
            "--out",
            out,
            "--model",
            NO_MODEL,
            "--max-batch-tokens",
            "-1",
        )  # fmt: skip
    )
    assert "Invalid value for '--max-batch-tokens'" in line, line
    not_about_the_model(line)
    assert not out.exists()

    result = goalprobe_cli(
        "extract", files / "a.jsonl", "--out", out, "--backend", "hooks", "--no-progress",
        "--max-batch-tokens", 600,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "batches of <= 8 steps and 600 tokens" in result.output
    with ActivationStore(out) as given, ActivationStore(files / "a.h5") as planned:
        assert given.attrs["config"]["max_batch_tokens"] == 600
        assert "max_batch_tokens" not in planned.attrs["config"]  # planned: all 8 fit on a CPU
        assert len(given) == len(planned) > 0
        for stage in given.stages_with_rows():
            for layer in given.attrs["layers"]:
                np.testing.assert_allclose(
                    given.read(stage, layer), planned.read(stage, layer), atol=1e-3
                )
