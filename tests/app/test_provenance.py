"""Provenance (issue 32): every stage record says which software produced it and, for a stage
that runs an agent, the model and its resolved commit (from the Hugging Face cache snapshot)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata

from goalprobe.agents.agent_config import AgentConfig

from goalprobe.runner import StageRunner


@dataclass(frozen=True)
class WithAgent:
    agent: AgentConfig
    size: int = 3


def test_stage_records_carry_versions_and_the_model_commit(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    commit = "fedcba9876543210fedcba9876543210fedcba98"
    snapshot = tmp_path / "hub" / "models--org--agent" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(commit)  # the cache's main branch
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    runner = StageRunner(tmp_path / "run")

    def stage(stage_dir):
        out = stage_dir / "x.txt"
        out.write_text("x")
        return {"x": out}, {}

    key = {"config": WithAgent(AgentConfig(model="org/agent")), "inputs": {}}
    runner.run("with_agent", key, stage)
    record = json.loads(runner.layout.stage_record("with_agent").read_text())
    provenance = record["provenance"]
    assert provenance["model"] == "org/agent" and provenance["model_commit"] == commit
    for name in ("torch", "transformers", "nnsight"):
        assert provenance["software"][name] == metadata.version(name)
    runner.run("plain", {"n": 1}, stage)  # a stage without an agent: versions only
    plain = json.loads(runner.layout.stage_record("plain").read_text())["provenance"]
    assert "model" not in plain and plain["software"]["torch"] == metadata.version("torch")
