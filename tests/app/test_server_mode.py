"""``goalprobe demo --backend server``: the order of its stages (generation before the stages
that load weights), its rollout stage keeping another run's trajectories, and its server
settings (token ids requested and required, requests in flight)."""

from __future__ import annotations

import pytest
from agent_fixtures import serving
from goalprobe.agents.agent_config import Agent, AgentConfig
from goalprobe.agents.rollout import RolloutConfig
from goalprobe.agents.trajectories import read_run_header, read_trajectories
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from vllm_fixtures import fake_vllm

from goalprobe.config import demo_config
from goalprobe.run_layout import RunLayout
from goalprobe.scheduler import StageBook
from goalprobe.stages import DEPENDS_ON, SERVER_STAGES, STAGES, WEIGHT_STAGES, server_first
from goalprobe.stages.context import StageContext
from goalprobe.stages.rollouts import rollouts_into


def test_server_mode_runs_every_generation_stage_before_any_weights(tmp_path):
    config = demo_config("tiny", backend="server", base_url="http://127.0.0.1:9/v1")
    book = StageBook(RunLayout(tmp_path), config, set(), False, print)
    order = book.stages
    assert sorted(order) == sorted(STAGES)
    last_server = max(order.index(s) for s in SERVER_STAGES)
    assert all(order.index(s) > last_server for s in WEIGHT_STAGES)
    for name in order:  # still a dependency order
        assert all(order.index(d) < order.index(name) for d in DEPENDS_ON[name]), name
    # the parallel scheduler: a weight stage waits for the server stages, a server stage not
    assert set(book.waits_for_server("activations")) == set(SERVER_STAGES)
    assert book.waits_for_server("false_belief_rollouts") == ()
    local = StageBook(RunLayout(tmp_path), demo_config("tiny"), set(), False, print)
    assert local.stages == STAGES and local.waits_for_server("activations") == ()
    assert server_first(STAGES).index("false_belief_rollouts") < server_first(STAGES).index(
        "probing"
    )


def test_demo_server_agent_requests_and_requires_ids_and_loads_no_weights_for_a_tokenizer(
    gptoss_dir,
):
    agent = Agent(AgentConfig(model=str(gptoss_dir), backend="server", base_url="http://h/v1"))
    backend, _ = agent.rollout_backend()
    assert backend.config.request_token_ids and backend.config.require_token_ids
    assert backend.config.max_concurrency >= 64
    assert backend.tokenizer is agent.tokenizer()
    assert agent._loaded is None  # the tokenizer came without the weights


@pytest.mark.slow
def test_switching_backend_keeps_the_servers_trajectories(gptoss_tiny, harmony_encoding, tmp_path):
    grids = generate_grid_set(GridSetConfig(sizes=(5,), densities=(0.5,), n_per_cell=1))
    config = RolloutConfig(episodes_per_grid=2, horizon_steps=2, max_new_tokens=24, retries=0)
    out = tmp_path / "rollouts" / "trajectories.jsonl"
    context = StageContext(RunLayout(tmp_path))
    model = str(gptoss_tiny.directory)
    with fake_vllm(gptoss_tiny, harmony_encoding) as (url, log):
        server = Agent(AgentConfig(model=model, backend="server", base_url=url))
        rollouts_into(grids, server, config, out, context)
        served = {e.key: e for e in read_trajectories(out)}
        server_run = read_run_header(out).run_id
        rollouts_into(grids, Agent(AgentConfig(model=model)), config, out, context)  # local
        assert read_run_header(out).run_id != server_run
        assert (out.parent / f"trajectories.{server_run}.jsonl").is_file()  # kept aside
        requests = len(log.requests)
        summary = rollouts_into(grids, server, config, out, context)  # back to the server
    assert len(log.requests) == requests  # nothing generated again
    assert summary["episodes_resumed"] == summary["episodes"] == len(served)
    assert {e.key: e for e in read_trajectories(out)} == served


def test_every_stage_that_loads_weights_or_generates_is_classified():
    """A stage whose module loads the weights (directly or through decode/extract helpers) is in
    WEIGHT_STAGES, one that generates with the rollout engine in SERVER_STAGES, and no stage
    does both (a server could then be needed while the weights are loaded)."""
    from pathlib import Path

    import goalprobe.stages as stages

    root = Path(stages.__file__).parent
    weights = ("loaded()", "extract_into(", "extract_headline(", "decode_prompt_states(")
    generates = ("rollouts_into(", "rollout_backend(")
    for name in STAGES:
        source = (root / f"{name}.py").read_text(encoding="utf-8")
        loads = any(marker in source for marker in weights)
        serves = any(marker in source for marker in generates)
        assert not (loads and serves), f"stage {name} both generates and loads weights"
        assert loads == (name in WEIGHT_STAGES), name
        assert serves == (name in SERVER_STAGES), name


@pytest.mark.parametrize("shape", ["no_ids", "prompt_ids_only"])
def test_demo_server_mode_without_ids_is_one_error_before_any_stage(
    goalprobe_cli, gptoss_tiny, harmony_encoding, tmp_path, shape
):
    from vllm_fixtures import NO_IDS, PROMPT_IDS_ONLY

    chosen = {"no_ids": NO_IDS, "prompt_ids_only": PROMPT_IDS_ONLY}[shape]
    run_dir = tmp_path / "run"
    with fake_vllm(gptoss_tiny, harmony_encoding, chosen) as (url, log):
        result = goalprobe_cli(
            "demo", "--scale", "tiny", "--run-dir", run_dir, "--model", gptoss_tiny.directory,
            "--backend", "server", "--base-url", url, "--no-progress",
        )  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --base-url: "), result.stderr
    assert ("28246" if shape == "prompt_ids_only" else "0.10.2") in lines[0]
    assert len(log.requests) == 1 and log.requests[0]["return_token_ids"] is True
    assert not (run_dir / "stages").exists()


def test_generation_keys_do_not_depend_on_where_the_weight_stages_run():
    """The one-GPU workflow's second call (``--device cuda`` after the server's generation)
    must find the generation stages cached: their keys leave the device out with a server, and
    keep it with the local engine (there the device generates); the weight stages' keep it."""
    from goalprobe.runner import config_hash
    from goalprobe.stages import stage

    def key(name: str, backend: str, device: str) -> str:
        url = "http://127.0.0.1:9/v1" if backend == "server" else None
        config = demo_config("tiny", backend=backend, base_url=url, device=device)
        return config_hash(stage(name).receives(config))

    for name in SERVER_STAGES:
        assert key(name, "server", "cpu") == key(name, "server", "cuda"), name
        assert key(name, "local", "cpu") != key(name, "local", "cuda"), name
    for name in WEIGHT_STAGES:
        assert key(name, "server", "cpu") != key(name, "server", "cuda"), name


def test_a_generation_stages_agent_loads_no_weights():
    config = AgentConfig(backend="server", base_url="http://h/v1", device="cuda")
    generating = config.for_generation()
    assert not generating.local_weights and "device" not in generating.identity()
    assert config.identity()["device"] == "cuda"
    with pytest.raises(ValueError, match="loads no weights"):
        Agent(generating).loaded()
    local = AgentConfig(device="cuda")
    assert local.for_generation() is local


def test_stages_to_run_in_a_fresh_run_is_every_stage_asked_and_writes_nothing(tmp_path):
    from goalprobe.demo import stages_to_run

    config = demo_config("tiny", backend="server", base_url="http://127.0.0.1:9/v1")
    assert stages_to_run(tmp_path / "run", config, SERVER_STAGES) == SERVER_STAGES
    assert not (tmp_path / "run").exists()


def test_a_stage_that_generated_on_a_server_records_the_servers_version(
    gptoss_tiny, harmony_encoding, tiny_backend
):
    """vLLM answers GET /version, and so does ``goalprobe serve``; a generation stage's record
    carries it beside the library versions, a weight stage's (no server used) does not."""
    from goalprobe.agents.server_app import ServeConfig, create_app
    from goalprobe.agents.server_backend import ServerBackend, ServerConfig
    from server_fixtures import TINY_MODEL
    from vllm_fixtures import VLLM_VERSION

    from goalprobe.runner import provenance
    from goalprobe.stages import stage
    from goalprobe.version import package_version

    model = str(gptoss_tiny.directory)
    with fake_vllm(gptoss_tiny, harmony_encoding) as (url, _):
        config = demo_config("tiny", model=model, backend="server", base_url=url)
        generated = provenance({"config": stage("rollouts").receives(config), "inputs": {}})
        extracted = provenance({"config": stage("activations").receives(config)})
    assert generated["software"]["server"] == VLLM_VERSION
    assert {"torch", "transformers"} <= set(generated["software"])
    assert generated["server"] == url
    assert "server" not in extracted["software"] and extracted["server"] == url

    with serving(create_app(tiny_backend, ServeConfig(model_name=TINY_MODEL))) as served:
        ours = ServerBackend(ServerConfig(base_url=f"{served}/v1", model=TINY_MODEL))
        assert ours.server_versions() == {f"{served}/v1": f"goalprobe {package_version()}"}
        # an endpoint without the route says nothing: unknown, not guessed
        bare = ServerBackend(ServerConfig(base_url=f"{served}/nothing/v1", model=TINY_MODEL))
        assert bare.server_versions() == {f"{served}/nothing/v1": None}
