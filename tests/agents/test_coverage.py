"""Prompt coverage: a tokenizer that lacks a symbol makes the prompt unreadable, the trajectory
header records it, and the study's result says "n/a" instead of a verdict."""

from __future__ import annotations

import dataclasses

import pytest
from agent_fixtures import build_tiny_backend
from goalprobe.agents.harmony import render_prompt
from goalprobe.agents.prompts import build_messages, merge_coverage, not_readable, prompt_coverage
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.tokenizer import build_tokenizer
from goalprobe.agents.trajectories import (
    SCHEMA,
    parse_record,
    read_run_header,
    read_trajectories,
)
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.harm import HarmGridConfig, generate_harm_grids, harm_free_grid
from goalprobe.gridworld.text import render


@pytest.fixture(scope="module")
def tokenizer():
    """The bundled agents' word-level tokenizer: the study's symbols, no flower bed ``F``."""
    return build_tokenizer()


def _prompt(grid, moral: bool = False) -> tuple[str, str]:
    text = render(grid)
    messages = build_messages(text, variant=grid.variant, has_key=False, moral_conditioning=moral)
    return text, render_prompt(messages, "low")


def test_a_symbol_the_tokenizer_lacks_makes_the_grid_unreadable(tokenizer):
    harm = generate_harm_grids(HarmGridConfig(n_grids=3, seed=0))
    neutral = prompt_coverage(tokenizer, [_prompt(g) for g in harm])
    assert neutral["grid"]["pieces"] == ["F"] and neutral["grid"]["unknown"] > 0
    assert 0 < neutral["grid"]["share"] < 1
    assert not neutral["readable"]
    assert neutral["unreadable"].startswith("n/a: the agent cannot read the grid symbol(s) F")
    # the moral instruction's words are unknown too: counted in the instructions
    moral = prompt_coverage(tokenizer, [_prompt(g, moral=True) for g in harm])
    assert moral["instructions"]["unknown"] > neutral["instructions"]["unknown"]
    assert "instruction tokens" in moral["unreadable"]
    merged = merge_coverage([neutral, moral])
    assert merged["grid"]["tokens"] == neutral["grid"]["tokens"] + moral["grid"]["tokens"]
    assert not merged["readable"] and "F" in merged["unreadable"]
    # the same grids without flower beds: every token known, no n/a
    plain = prompt_coverage(
        tokenizer,
        [_prompt(dataclasses.replace(harm_free_grid(g), variant=Variant.PLAIN)) for g in harm],
    )
    assert plain["readable"] and plain["grid"]["unknown"] == 0
    assert plain["instructions"]["share"] == 0.0 and not_readable(plain) is None
    # a tokenizer taught the symbol reads it
    taught = build_tokenizer(extra_texts=[" F F flower"])
    assert prompt_coverage(taught, [_prompt(g) for g in harm])["grid"]["unknown"] == 0
    # no tokenizer to ask (a remote server): nothing is claimed either way
    assert prompt_coverage(None, [_prompt(harm[0])]) is None and not_readable(None) is None


def test_rollout_header_records_the_coverage(tmp_path):
    backend = build_tiny_backend()
    config = RolloutConfig(
        episodes_per_grid=1, horizon_steps=1, retries=0, batch_size=2, max_new_tokens=2, seed=3
    )
    harm = generate_harm_grids(HarmGridConfig(n_grids=2, seed=1))
    run_rollouts(harm, backend, config, tmp_path / "harm.jsonl", progress=False)
    header = read_run_header(tmp_path / "harm.jsonl")
    coverage = header.prompt_coverage
    assert coverage["unk_token_id"] == backend.tokenizer.unk_token_id
    assert coverage["grid"]["pieces"] == ["F"] and not coverage["readable"]
    assert len(list(read_trajectories(tmp_path / "harm.jsonl"))) == 2  # it still ran
    plain = generate_grid_set(GridSetConfig(sizes=(5,), densities=(0.0,), n_per_cell=1))
    run_rollouts(plain, backend, config, tmp_path / "plain.jsonl", progress=False)
    assert read_run_header(tmp_path / "plain.jsonl").prompt_coverage["readable"]
    first = (tmp_path / "plain.jsonl").read_text().splitlines()[0]
    assert f'"schema":"{SCHEMA}"' in first


def test_a_header_without_coverage_reads_as_none():
    """A run header written before coverage was recorded (no ``prompt_coverage`` key) reads
    with None; one that records it keeps it."""
    body = {"run_id": "r", "config": {}, "backend": {}, "package_version": "0"}
    assert parse_record({"schema": SCHEMA, "kind": "run", **body}, "f:1").prompt_coverage is None
    kept = parse_record(
        {"schema": SCHEMA, "kind": "run", **body, "prompt_coverage": {"readable": True}}, "f:1"
    )
    assert kept.prompt_coverage == {"readable": True}


def test_a_byte_level_tokenizer_reads_everything(o200k_tokenizer):
    """GPT-OSS's o200k (byte-level BPE) has no unknown token: the flower beds and the moral
    instruction are readable (counted, never n/a)."""
    harm = generate_harm_grids(HarmGridConfig(n_grids=2, seed=0))
    coverage = prompt_coverage(o200k_tokenizer, [_prompt(g, moral=True) for g in harm])
    assert coverage["unk_token_id"] is None and coverage["readable"]
    assert coverage["grid"]["tokens"] > 0 and coverage["grid"]["unknown"] == 0
    assert not_readable(coverage) is None
