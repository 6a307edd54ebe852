"""``goalprobe demo --backend server``: the whole tiny study with rollouts served over HTTP.

The bundled agent is served by the project's OpenAI-compatible app (``goalprobe serve``'s
``create_app``) under uvicorn on 127.0.0.1; the demo's rollout stages talk to it through
``ServerBackend``, and extraction replays the recorded token ids on the local copy.
"""

from __future__ import annotations

import json

import pytest
from agent_fixtures import serving
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.server_app import ServeConfig, create_app

from goalprobe.config import demo_config
from goalprobe.demo import run_demo


@pytest.mark.slow
def test_demo_with_server_backend_runs_every_stage(tmp_path, bundled_agent):
    model, tokenizer = bundled_agent
    app = create_app(LocalBackend(model, tokenizer), ServeConfig(model_name="bundled"))
    with serving(app) as url:
        config = demo_config("tiny", backend="server", base_url=f"{url}/v1")
        # two stages at a time: their worker processes share the one server
        result = run_demo(tmp_path / "run", config, progress=False, jobs=2)
    assert result.failed == {}, result.failed
    assert result.report_path is not None and result.report_path.is_file()
    with (tmp_path / "run" / "rollouts" / "trajectories.jsonl").open(encoding="utf-8") as f:
        header = json.loads(f.readline())
        step = json.loads(f.readline())
    assert header["kind"] == "run" and "Server" in json.dumps(header["backend"])
    assert step["token_ids_source"] == "model"  # the server returned the sampled ids
    assert step["generated_token_ids"] and step["prompt_token_ids"]
