"""The DAS card shipped beside a named agent's weights and the report's table of it (issue 41)."""

from __future__ import annotations

import json
import shutil

import pytest
from goalprobe.agents.bundled import named_agent, register_agent, unregister_agent

from goalprobe.report.attribution import DAS_CARD_SCHEMA, das_blocks, das_card, weights_sha256
from goalprobe.report.run import MissingInput


def test_the_control_ships_a_card_of_its_own_weights():
    card = das_card("bundled:map")
    assert card is not None and card["schema"] == DAS_CARD_SCHEMA
    # a new control's weights must come with a card measured on them (scripts/das_anchors.py)
    assert not card["stale"], "agents/bundled_map/das.json describes other weights: re-measure it"
    ranks = [r["rank"] for r in card["rows"]]
    assert card["smallest_rank_reaching_90pct_of_full"] in ranks
    (block,) = das_blocks("bundled:map")
    assert "STALE" not in block.caption and len(block.rows) == len(ranks)
    assert das_card("bundled") is None and das_blocks("bundled") == []


@pytest.fixture
def toy_agent(tmp_path):
    source = named_agent("bundled:map").directory
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    shutil.copy(source / "das.json", tmp_path / "das.json")
    register_agent("toy-das", tmp_path)
    yield tmp_path
    unregister_agent("toy-das")


def test_a_card_of_other_weights_is_shown_as_stale_and_another_schema_refused(toy_agent):
    assert das_card("toy-das")["stale"]
    (block,) = das_blocks("toy-das")
    assert "STALE" in block.caption
    data = json.loads((toy_agent / "das.json").read_text())
    data["weights_sha256"] = weights_sha256(toy_agent)
    (toy_agent / "das.json").write_text(json.dumps(data))
    assert not das_card("toy-das")["stale"]
    data["schema"] = "goalprobe.das_card/0"
    (toy_agent / "das.json").write_text(json.dumps(data))
    with pytest.raises(MissingInput, match="schema"):
        das_card("toy-das")
