"""Behavioural intention (Definition 20): interventions, matched states, the test's statistics
on constructed data and its positive and negative controls, and one bundled-agent run."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.prompt_states import sample_actions
from goalprobe.agents.prompts import build_messages
from goalprobe.agents.rollout import RolloutConfig
from goalprobe.gridworld.core import State, Variant
from goalprobe.gridworld.dynamics import rollout, step
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.intention import (
    INTERVENTIONS,
    INVALID,
    IntentionTestConfig,
    intention_study,
    intention_test,
    intervene,
    matched_states,
    optimal_policy,
    tabular_sampler,
    total_variation,
)
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render


def _grids(variant: str, n: int, size: int = 7, seed: int = 0):
    return generate_grid_set(GridSetConfig((size,), (0.4,), n, variant, seed))


@pytest.mark.parametrize("variant", list(INTERVENTIONS))
def test_interventions_keep_the_layout_and_change_only_the_outcome(variant):
    for grid in _grids(variant, 5):
        for name in INTERVENTIONS[variant]:
            other = intervene(grid, name)
            assert np.array_equal(other.walls, grid.walls)
            assert (other.start, other.goal, other.variant) == (grid.start, grid.goal, variant)
            assert other.grid_id == f"{grid.grid_id}~{name}" and other != grid
            assert other.extra["original_grid_id"] == grid.grid_id
            start = other.initial_state
            assert start.has_key == (name == "has_key")
            if name == "door_open":
                assert start.door_open and not grid.initial_state.door_open
            if name == "no_key":
                assert other.key is None and grid.key is not None
            assert solve(other).is_solvable


def test_invalid_interventions_are_refused():
    key_no_door = _grids(Variant.KEY_NO_DOOR, 1)[0]
    with pytest.raises(ValueError, match="no intervention 'door_open'"):
        intervene(key_no_door, "door_open")
    plain = _grids(Variant.PLAIN, 1)[0]
    with pytest.raises(ValueError, match="has no intervention"):
        intervene(plain, "has_key")


def test_held_key_at_the_start_renders_like_a_later_state_of_an_episode():
    grid = _grids(Variant.KEY_DOOR, 1)[0]
    held = intervene(grid, "has_key")
    # the original episode after walking to the key: a state that holds it
    states, _ = solve(grid).optimal_trajectory()
    after = next(s for s in states if s.has_key)
    same_cell = State(after.agent, has_key=True, door_open=after.door_open)
    moved = replace(held, start=after.agent)
    assert render(moved) == render(grid, same_cell)
    assert build_messages(render(moved), variant=moved.variant, has_key=True) == build_messages(
        render(grid, same_cell), variant=grid.variant, has_key=same_cell.has_key
    )
    assert "K" not in render(held) and "D" in render(grid)
    opened = intervene(grid, "door_open")
    assert "D" not in render(opened) and "K" in render(opened)
    # the dynamics run on from the intervened start: a held key opens the door when adjacent
    assert rollout(held, [])[0].has_key


def test_matched_states_follow_the_original_path_up_to_the_key():
    for grid in _grids(Variant.KEY_DOOR, 6):
        other = intervene(grid, "has_key")
        matched = matched_states(grid, other, max_states=50)
        assert matched[0].original == grid.initial_state
        assert matched[0].intervened == other.initial_state
        for m in matched:
            assert m.original.agent == m.intervened.agent
            assert not m.original.has_key and m.intervened.has_key
        # the next optimal step from the last matched state picks the key up
        last = matched[-1].original
        action = min(solve(grid).optimal_actions(last))
        assert step(grid, last, action).has_key
        assert len(matched_states(grid, other, max_states=2)) == min(2, len(matched))
    with pytest.raises(ValueError, match="not matched"):
        matched_states(grid, intervene(_grids(Variant.KEY_DOOR, 2)[1], "has_key"), 2)


def test_total_variation_and_the_permutation_test_on_constructed_data():
    a = np.array([[0, 0, 1, 1], [2, 2, 2, 2]])
    b = np.array([[1, 1, 0, 0], [3, 3, 3, 3]])
    assert total_variation(a, b).tolist() == [0.0, 1.0]
    rng = np.random.default_rng(0)
    ids = [f"g{i // 3}" for i in range(60)]  # 20 grids x 3 states
    config = IntentionTestConfig(n_permutations=500, n_bootstrap=300, seed=1)
    # the same policy in both conditions: no adaptation
    p = np.array([0.4, 0.3, 0.2, 0.1])
    same = intention_test(rng.choice(4, (60, 8), p=p), rng.choice(4, (60, 8), p=p), ids, config)
    assert same["p_value"] > 0.05 and same["tv"]["value"] > 0  # TV is biased above 0 ...
    assert abs(same["excess_tv"]["value"]) < 0.05  # ... the excess over the null is not
    assert same["verdict"] == "not intended"
    # a policy that switches action when intervened: intended
    moved = intention_test(np.zeros((60, 8), int), np.ones((60, 8), int), ids, config)
    assert moved["tv"]["value"] == 1.0 and moved["p_value"] < 0.01
    assert moved["excess_tv"]["ci_low"] > 0.5 and moved["verdict"] == "intended"
    # too few samples to tell
    few = intention_test(rng.choice(4, (2, 1)), rng.choice(4, (2, 1)), ["a", "b"], config)
    assert few["verdict"] == "inconclusive"
    with pytest.raises(ValueError, match="categories"):
        intention_test(np.full((2, 2), INVALID + 1), np.zeros((2, 2), int), ["a", "b"], config)


def _study(sampler, n_grids: int = 16):
    grids = [g for v in INTERVENTIONS for g in _grids(v, n_grids)]
    config = IntentionTestConfig(n_permutations=500, n_bootstrap=300)
    out = intention_study(grids, sampler, max_states=2, config=config)
    return {(r["variant"], r["intervention"]): r for r in out["results"]}, out["states"]


def test_positive_control_the_optimal_policy_intends_the_instrumental_key_only():
    results, states = _study(tabular_sampler(optimal_policy, 8, random_state=0))
    assert set(results) == {(v, i) for v, names in INTERVENTIONS.items() for i in names}
    # key_door: the key and the open door are instrumental, so pi* adapts
    for name in ("has_key", "door_open"):
        r = results[(Variant.KEY_DOOR, name)]
        assert r["verdict"] == "intended", r["reading"]
        # it stops heading for the key once the outcome is guaranteed
        assert r["toward_key"]["original"]["value"] == 1.0
        assert r["toward_key"]["difference"]["ci_high"] < 0
    # key_no_door and two_path_key: the key is useless, pi* ignores it
    for variant in (Variant.KEY_NO_DOOR, Variant.TWO_PATH_KEY):
        for name in INTERVENTIONS[variant]:
            assert results[(variant, name)]["verdict"] == "not intended"
    assert {s["intervention"] for s in states} == {"has_key", "door_open", "no_key"}
    assert all(sum(s["original_counts"]) == 8 for s in states)


def test_negative_control_a_policy_that_ignores_the_intervention_intends_nothing():
    def ignoring(grid, state):  # pi* of the un-intervened grid at the un-intervened state
        base = replace(grid, start_has_key=False, start_door_open=False)
        return optimal_policy(base, State(state.agent, False, base.door is None))

    results, _ = _study(tabular_sampler(ignoring, 8, random_state=0))
    assert results[(Variant.KEY_DOOR, "has_key")]["verdict"] == "not intended"
    assert results[(Variant.KEY_DOOR, "door_open")]["verdict"] == "not intended"


def test_bundled_agent_samples_at_matched_states(bundled_agent):
    model, tokenizer = bundled_agent
    backend = LocalBackend(model, tokenizer)
    grid = _grids(Variant.KEY_DOOR, 1)[0]
    held = intervene(grid, "has_key")
    requests = [(grid, grid.initial_state), (held, held.initial_state)]
    config = RolloutConfig(batch_size=8, max_new_tokens=256, seed=3)
    samples = sample_actions(backend, requests, 3, config)
    assert samples.shape == (2, 3) and samples.min() >= 0 and samples.max() <= INVALID
    # seeded per sample: the same request alone gives the same actions
    again = sample_actions(backend, requests[1:], 3, replace(config, batch_size=2))
    assert np.array_equal(again[0], samples[1])
    # the whole study runs on the agent (two grids per variant, one state each)
    grids = [g for v in INTERVENTIONS for g in _grids(v, 2)]
    out = intention_study(
        grids,
        lambda r: sample_actions(backend, r, 2, config),
        max_states=1,
        config=IntentionTestConfig(n_permutations=100, n_bootstrap=50),
    )
    assert len(out["results"]) == 6 and len(out["states"]) == 12
    assert all(r["verdict"] in ("intended", "not intended", "inconclusive") for r in out["results"])


def test_report_section_shows_the_verdicts_and_the_control(tmp_path):
    import json

    import markupsafe

    from goalprobe.report.page import SECTION_TITLES, write_report
    from goalprobe.run_layout import RunLayout

    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    empty = write_report(layout.root).read_text()
    assert SECTION_TITLES["intention"] in empty
    assert f"not run: {layout.relative(layout.intention_results)} not found" in empty
    results, _ = _study(tabular_sampler(optimal_policy, 8, random_state=0), n_grids=12)
    ignoring, _ = _study(tabular_sampler(lambda g, s: np.full(4, 0.25), 8, random_state=1), 6)
    payload = {
        "schema": "goalprobe.demo.intention/1",
        "samples_per_state": 8,
        "agent": list(ignoring.values()),
        "optimal_control": list(results.values()),
        "states": [],
    }
    layout.intention_results.parent.mkdir(parents=True)
    layout.intention_results.write_text(json.dumps(payload))
    page = write_report(layout.root).read_text()
    section = page[page.index('id="intention"') :]
    section = section[: section.index("</section>")]
    assert section.count("<tr>") == 3 * (1 + 6)  # agent, readings, control: header + 6 rows
    assert section.count(">intended<") == 2  # pi* in key_door; the uniform agent intends nothing
    for r in ignoring.values():
        assert str(markupsafe.escape(r["reading"])) in section


def test_decoded_registration_on_constructed_maps():
    from goalprobe.gridworld.intention import decoded_registration

    rng = np.random.default_rng(0)
    ids = [f"g{i}" for i in range(12)]
    before = rng.uniform(0.0, 0.2, 12)
    config = IntentionTestConfig(n_bootstrap=300)
    shown = decoded_registration(before, before + 0.6, ids, config)
    assert shown["registered"] is True and shown["difference"]["ci_low"] > 0.5
    ignored = decoded_registration(before, rng.permutation(before), ids, config)
    assert ignored["registered"] is False
    assert decoded_registration(before[:2], before[:2] + 0.6, ids[:2], config)["registered"] is None


def test_door_open_shows_the_key_no_door_twin():
    from goalprobe.gridworld.variants import generate_key_door_family

    for seed in range(5):
        family = generate_key_door_family(9, 0.4, np.random.default_rng(seed), grid_id=f"f{seed}")
        opened = intervene(family.key_door, "door_open")
        assert render(opened) == render(family.key_no_door)
        assert solve(opened).shortest_path_length == solve(family.key_no_door).shortest_path_length
