"""A normal run prints no library warning: a tiny rollout of the bundled agent and the
extraction of its steps through nnsight (with the shared-prefix KV cache, where transformers'
``past_key_values`` deprecation used to print in the middle of the demo's progress)."""

from __future__ import annotations

import warnings

from goalprobe.activations.capture import make_backend
from goalprobe.activations.capture.backends import cache_name_accepted
from goalprobe.activations.extract import ExtractConfig, extract
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set


def test_tiny_rollout_and_extraction_emit_no_warnings(bundled_agent, tmp_path):
    model, tokenizer = bundled_agent
    grids = generate_grid_set(GridSetConfig(sizes=(7,), densities=(0.2,), n_per_cell=2, seed=3))
    trajectories = tmp_path / "trajectories.jsonl"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_rollouts(
            grids,
            LocalBackend(model, tokenizer),
            RolloutConfig(episodes_per_grid=1, seed=3),
            trajectories,
            progress=False,
        )
        capture = make_backend("nnsight", model, tokenizer, remote=False)
        assert capture.prefix_cache  # the path that passes a KV cache to the model
        stored = extract(
            trajectories,
            tmp_path / "activations.h5",
            capture,
            tokenizer,
            ExtractConfig(layers=(1,), batch_size=4),
            model_id="bundled",
        )
    assert report.steps > 0 and stored.rows == report.steps
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


def test_the_filter_silences_that_warning_only():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cache_name_accepted():
            warnings.warn(
                "`past_key_values` is deprecated and will be removed in version 5.40.0 for "
                "`forward`. Use `cache` instead.",
                FutureWarning,
                stacklevel=1,
            )
            warnings.warn("`past_key_values` is deprecated", UserWarning, stacklevel=1)
            warnings.warn("`use_cache` is deprecated", FutureWarning, stacklevel=1)
    assert [(w.category, str(w.message)) for w in caught] == [
        (UserWarning, "`past_key_values` is deprecated"),
        (FutureWarning, "`use_cache` is deprecated"),
    ]


def test_nnsight_backend_names_the_cache_as_nnsight_needs(bundled_agent):
    model, tokenizer = bundled_agent
    assert make_backend("nnsight", model, tokenizer).cache_keyword() == "past_key_values"
