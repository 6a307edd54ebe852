"""Patching along the reasoning (issue 30): reasoning chunks of the counterfactual's run
written into the base run, the rest of the reasoning regenerated, on the real bundled agent.

Properties checked: chunks tile the reasoning and align by relative position; a chunk patched
from the base's own run is a no-op (the regenerated action is the base's greedy one) and the
verdict on such records says "no"; the experiment runs end to end with the random-grid and
no-change controls and writes the chunk verdicts beside the anchors'.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from goalprobe.activations.capture import make_backend
from goalprobe.gridworld.generator import generate_grid
from goalprobe.probes.patching.counterfactuals import (
    CounterfactualConfig,
    base_from_grid,
    build_counterfactuals,
)
from goalprobe.probes.patching.experiment import (
    PatchConfig,
    PatchingContext,
    PreparedPair,
    prepare_pairs,
)
from goalprobe.probes.patching.patched_runs import run_patching
from goalprobe.probes.patching.results import anchor_verdicts
from goalprobe.probes.patching.run import run_experiment
from goalprobe.probes.patching.sites import (
    SequenceError,
    chunk_bounds,
    chunk_positions,
    chunk_site,
)

N_CHUNKS = 3


def chunk_config(**overrides) -> PatchConfig:
    fields = dict(
        sites=("pre_reasoning",),
        layers=("all",),
        directions=("cf_to_base",),
        reasoning="greedy",
        require_optimal=False,
        anchor_sites=("pre_reasoning",),
        reasoning_chunks=N_CHUNKS,
        chunk_layers=("1",),
        max_new_tokens=160,
    )
    fields.update(overrides)
    return PatchConfig(**fields)


@pytest.fixture(scope="module")
def grids():
    return [
        generate_grid(7, 0.5, np.random.default_rng(seed), grid_id=f"c{seed}", min_distance=3)
        for seed in range(4)
    ]


@pytest.fixture(scope="module")
def prepared(bundled_agent, grids):
    model, tokenizer = bundled_agent
    context = PatchingContext(make_backend("nnsight", model, tokenizer), chunk_config())
    pairs = build_counterfactuals(
        [base_from_grid(g) for g in grids], CounterfactualConfig(moves=("goal",))
    )
    items, report = prepare_pairs(pairs, context)
    assert report.n_kept >= 4, report.to_dict()
    return context, items


def test_chunk_site_names():
    assert chunk_site(0, 4) == "reasoning_chunk_1of4"
    with pytest.raises(ValueError):
        chunk_site(4, 4)


def test_chunks_tile_the_reasoning_and_align_by_relative_position(prepared):
    _, items = prepared
    item = items[0]
    base, cf = item.base.sequence, item.cf.sequence
    begin, end = base.reasoning_span
    # the body lies between <|channel|>analysis<|message|> and the <|end|> closing it
    assert base.anchors.post_reasoning[0] == end and begin > base.prompt_length
    bounds = [chunk_bounds(base, i, N_CHUNKS) for i in range(N_CHUNKS)]
    assert bounds[0][0] == begin and bounds[-1][1] == end
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    for i in range(N_CHUNKS):
        src, tgt = chunk_positions(cf, base, i, N_CHUNKS)
        s0, s1 = chunk_bounds(cf, i, N_CHUNKS)
        assert np.array_equal(tgt, np.arange(*bounds[i]))
        assert src[0] == s0 and src.max() < s1 and np.all(np.diff(src) >= 0)
    # a reasoning shorter than the number of chunks leaves a chunk empty: an error, not a guess
    with pytest.raises(SequenceError, match="no token in chunk"):
        chunk_bounds(base, 0, end - begin + 1)


def test_a_chunk_patched_from_the_base_itself_changes_nothing(prepared):
    context, items = prepared
    # every pair's counterfactual side replaced by its base side: the patch writes the base's
    # own residual stream back into the base run
    selves = [PreparedPair(item.pair, item.base, item.base) for item in items]
    records, skipped = run_patching(selves, context)
    chunks = [r for r in records if r.site.startswith("reasoning_chunk_")]
    own = [r for r in chunks if r.kind != "random_grid"]
    assert len(own) == N_CHUNKS * len(items) and not skipped
    assert {r.site for r in own} == {chunk_site(i, N_CHUNKS) for i in range(N_CHUNKS)}
    assert all(r.mode == "regenerated" and r.direction == "cf_to_base" for r in own)
    assert all(r.patched_action == r.target_action is not None for r in own)
    assert not any(r.action_changed or r.invalid for r in own)
    # a patch that cannot move anything: the verdict says "no" at every chunk
    verdicts = anchor_verdicts(
        [r for r in chunks if r.kind == "disjoint" or r.kind == "random_grid"],
        layers="1",
        n_resamples=200,
    )
    assert verdicts and all(v["verdict"] in ("no", "undecided") for v in verdicts)
    assert any(v["verdict"] == "no" for v in verdicts)


def test_chunk_patching_end_to_end_with_controls(tmp_path, bundled_agent, grids):
    model, tokenizer = bundled_agent
    bases = [base_from_grid(g) for g in grids]
    config = chunk_config(require_optimal=True, chunk_pairs=3)
    outcome = run_experiment(
        bases,
        make_backend("nnsight", model, tokenizer),
        config,
        CounterfactualConfig(moves=("goal",), disjoint_per_move=1, control_per_move=1),
        n_resamples=200,
    )
    chunks = [r for r in outcome.records if r.site.startswith("reasoning_chunk_")]
    kinds = {r.kind for r in chunks}
    assert {"disjoint", "control", "random_grid"} <= kinds
    for kind in ("disjoint", "control"):
        pairs = {r.pair_id for r in chunks if r.kind == kind}
        assert 0 < len(pairs) <= 3
    # the patched runs regenerate: the outcome is a parsed answer, scored with invalid apart
    assert all(r.mode == "regenerated" and r.layers == "1" for r in chunks)
    assert all(r.invalid == (r.patched_action is None) for r in chunks)
    meta = outcome.meta["reasoning_chunks"]
    assert meta["n_chunks"] == N_CHUNKS and meta["layer_sets"] == {"1": [1]}
    assert "relative" in meta["alignment"]
    # the chunk verdicts are one family: Bonferroni-adjusted intervals
    assert meta["family"] == N_CHUNKS and meta["confidence"] == pytest.approx(1 - 0.05 / N_CHUNKS)
    assert {v["site"] for v in meta["verdicts"]} <= set(meta["sites"])
    assert all(v["verdict"] in ("yes", "no", "undecided") for v in meta["verdicts"])
    paths = outcome.write(tmp_path)
    written = json.loads(paths["results_json"].read_text())
    assert written["reasoning_chunks"]["sites"] == meta["sites"]
