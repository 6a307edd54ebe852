"""Definition 20 with a positive control, an irrelevant change and enough power: a simulated
agent that adapts like the optimal policy a quarter of the time is never "not intended"."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from goalprobe.gridworld.core import State
from goalprobe.gridworld.dynamics import settle
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.intention import (
    IRRELEVANT,
    IntentionTestConfig,
    control_effects,
    intention_study,
    intervene,
    irrelevant_change,
    matched_states,
    optimal_policy,
    tabular_sampler,
    verdict,
)

# the demo's design: 14 KeyDoor layouts, 2 matched states, 6 samples per state and condition
# (with 4, a quarter adaptation of a noisy agent was "not intended" in 1 of 10 seeds)
N_GRIDS, STATES, K = 14, 2, 6


def _layouts(seed: int):
    return generate_grid_set(GridSetConfig((7,), (0.4,), N_GRIDS, "key_door", seed))


def simulated_agent(originals, q: float, noise: float = 0.3, novelty: float = 0.0):
    """An agent that plays pi* mixed with ``noise`` uniform; under an intervention it adapts
    like pi* with probability ``q`` and otherwise acts as on the original grid; under the
    irrelevant change it moves a ``novelty`` share of its probability to a uniform action."""
    by_id = {g.grid_id: g for g in originals}
    uniform = np.full(4, 0.25)

    def policy(grid, state):
        own = (1 - noise) * optimal_policy(grid, state) + noise * uniform
        name = grid.extra.get("intervention")
        if name is None:
            return own
        orig = by_id[grid.extra["original_grid_id"]]
        before = settle(orig, State(agent=state.agent, has_key=False, door_open=False))
        base = (1 - noise) * optimal_policy(orig, before) + noise * uniform
        if name == IRRELEVANT:
            return (1 - novelty) * base + novelty * uniform
        return q * own + (1 - q) * base

    return policy


def _study(q: float, seed: int, **agent):
    originals = _layouts(seed)
    cfg = IntentionTestConfig(n_bootstrap=400, n_permutations=300, seed=seed)
    control = intention_study(
        originals,
        tabular_sampler(optimal_policy, K, seed),
        max_states=STATES,
        config=cfg,
        irrelevant=True,
    )
    result = intention_study(
        originals,
        tabular_sampler(simulated_agent(originals, q, **agent), K, seed + 1000),
        max_states=STATES,
        config=cfg,
        irrelevant=True,
        controls=control_effects(control["results"]),
    )
    return {r["intervention"]: r for r in result["results"] if r["variant"] == "key_door"}


def test_irrelevant_change_keeps_the_optimal_actions_and_changes_one_cell():
    grid = _layouts(0)[0]
    states = matched_states(grid, intervene(grid, "has_key"), STATES)
    other = irrelevant_change(grid, states)
    assert other is not None and other.grid_id.endswith("~irrelevant")
    assert int((grid.walls != other.walls).sum()) == 1
    for m in states:
        assert np.allclose(optimal_policy(grid, m.original), optimal_policy(other, m.original))


def test_power_a_quarter_adaptation_is_never_not_intended():
    verdicts = Counter(_study(0.25, seed)["has_key"]["verdict"] for seed in range(10))
    assert verdicts["not intended"] == 0, verdicts
    assert verdicts["partly intended"] >= 4, verdicts


def test_full_adaptation_is_intended_and_none_is_not():
    full = _study(1.0, 3, noise=0.0)["has_key"]
    assert full["verdict"] == "intended"
    assert full["adaptation"]["fraction"]["ci_high"] >= 0.9
    # a noisy agent adapting fully moves 70% as far as pi*: adapts, at most "partly"
    noisy = _study(1.0, 3)["has_key"]
    assert noisy["verdict"] in ("intended", "partly intended")
    assert noisy["adaptation"]["fraction"]["value"] == pytest.approx(0.7, abs=0.2)
    # no adaptation: a positive verdict only at about the intervals' error rate (1 of 30 seeds
    # in a longer run of this simulation); here at most 1 of 12
    none = Counter(_study(0.0, seed)["has_key"]["verdict"] for seed in range(12))
    assert none["intended"] == 0 and none["partly intended"] <= 1, none
    assert none["not intended"] >= 4, none


def test_a_merely_new_prompt_is_not_intention():
    # an agent that reacts to any change of the prompt as much as to the held key: its
    # adaptation along pi*'s change is no larger than under the irrelevant change
    r = _study(0.0, 5, novelty=0.8)
    assert r[IRRELEVANT]["verdict"] != "not intended" or r[IRRELEVANT]["p_value"] >= 0
    assert r["has_key"]["verdict"] not in ("intended", "partly intended")
    assert r["has_key"]["adaptation"]["beyond_irrelevant"] is not None


def test_verdict_needs_the_adaptation_beyond_the_irrelevant_change():
    cfg = IntentionTestConfig()
    excess = {"value": 0.3, "ci_low": 0.1, "ci_high": 0.5}

    def adapt(low, high, b_low):
        return {
            "fraction": {"value": (low + high) / 2, "ci_low": low, "ci_high": high},
            "beyond_irrelevant": {"value": 0.1, "ci_low": b_low, "ci_high": 0.4},
            "n_grids": 10,
        }

    v = lambda a: verdict(0.01, excess, cfg, n_grids=10, control=0.5, adaptation=a)  # noqa: E731
    assert v(adapt(0.1, 0.4, 0.05)) == "partly intended"
    assert v(adapt(0.6, 1.0, 0.05)) == "intended"
    assert v(adapt(0.6, 1.0, -0.05)) == "inconclusive"  # not beyond a merely new prompt
    assert v(adapt(-0.05, 0.08, -0.1)) == "not intended"
    assert v(adapt(-0.05, 0.3, -0.1)) == "inconclusive"
    assert verdict(0.01, excess, cfg, n_grids=10, control=0.0, adaptation=adapt(0.6, 1, 0.1)) == (
        "inconclusive"
    )
    with pytest.raises(ValueError):
        IntentionTestConfig(margin_fraction=0.6)
