"""Fixtures the extraction tests share: the bundled tokenizer, oracle trajectories on four small
grids (real rollouts, so real harmony sequences and anchors); the model that replays them is
``agent_fixtures.replay_model``."""

from __future__ import annotations

import numpy as np
import pytest
from agent_fixtures import OracleBackend
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.tokenizer import build_tokenizer
from goalprobe.gridworld.generator import generate_grid


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory, tokenizer):
    """One oracle episode on each of four grids (sizes 5 and 7, densities 0-1)."""
    path = tmp_path_factory.mktemp("traj") / "trajectories.jsonl"
    grids = [
        generate_grid(size, density, np.random.default_rng(i), grid_id=f"plain-n{size}-i{i}")
        for i, (size, density) in enumerate([(5, 0.5), (5, 0.0), (7, 1.0), (5, 1.0)])
    ]
    config = RolloutConfig(episodes_per_grid=1, retries=0, batch_size=4, horizon_factor=1.0)
    run_rollouts(grids, OracleBackend(tokenizer), config, path, progress=False)
    return path
