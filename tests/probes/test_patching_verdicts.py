"""The anchors' patching verdicts on constructed data (issue 33, item 1): a verdict that could
not come out otherwise is not evidence, so each must say "no" where the data carry no causal
information at the anchors, and "yes" where they do.

Records are built from real counterfactual pairs of generated grids (real optimal sets), with
the patched action of a simulated agent:

* a **pure input swap** (an optimal agent that acts on its input): every block at ``grid``
  moves the action into the source's optimal set (true by construction: a sanity check, never
  a verdict); the anchors carry nothing, so patching them changes nothing;
* an **output-breaking** patch: the regenerated answer names no action;
* a **disruptive** patch: a uniformly random action, whatever the source;
* a **state transplant** (the positive control's mechanism): the action follows the source's
  state, the real counterfactual's or the random grid's.
"""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import Action
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.patching.counterfactuals import (
    CounterfactualConfig,
    base_from_grid,
    build_counterfactuals,
)
from goalprobe.probes.patching.results import anchor_verdicts, exact_upper_bound, summarize

N_GRIDS = 60


@pytest.fixture(scope="module")
def pairs():
    """Disjoint and control pairs on 60 grids of two sizes, with a random other grid of the
    same size per pair (the random-grid control's source)."""
    rng = np.random.default_rng(33)
    grids = [
        generate_grid(
            int(rng.choice([7, 9])), float(rng.choice([0.0, 0.2])), rng, min_distance=3,
            grid_id=f"v{i}",
        )
        for i in range(N_GRIDS)
    ]  # fmt: skip
    bases = [base_from_grid(g) for g in grids]
    out = build_counterfactuals(bases, CounterfactualConfig(random_state=1))
    by_size: dict[int, list] = {}
    for base in bases:
        by_size.setdefault(base.grid.size, []).append(base)
    randoms = {}
    for i, pair in enumerate(out):
        others = [b for b in by_size[pair.base.grid.size] if b.grid_id != pair.base.grid_id]
        randoms[pair.pair_id] = others[np.random.default_rng([5, i]).integers(len(others))]
    return out, randoms


def names(actions) -> list[str]:
    return sorted(Action(a).name for a in actions)


def record(pair, kind, site, mode, target_opt, source_opt, reference, patched, target_action):
    valid = patched is not None
    return {
        "pair_id": pair.pair_id, "base_id": pair.base.base_id, "grid_id": pair.base.grid_id,
        "kind": kind, "moved": pair.moved, "direction": "cf_to_base", "site": site,
        "layers": "all", "mode": mode,
        "target_action": target_action.name, "patched_action": None if patched is None else patched.name,
        "target_optimal": names(target_opt), "source_optimal": names(source_opt),
        "reference_optimal": names(reference), "invalid": not valid,
        "action_changed": valid and patched != target_action,
        "into_source_optimal": valid and patched in source_opt,
        "into_reference_optimal": valid and patched in reference,
        "in_target_optimal": valid and patched in target_opt,
        "recovered": float("nan"),
    }  # fmt: skip


def simulate(pairs, act, sites=("grid", "pre_reasoning"), mode="regenerated"):
    """Records of every pair (cf -> base) and its random-grid control at ``sites``.

    ``act(site, target_optimal, source_optimal, rng)`` is the simulated agent's patched action
    (None: no action named); the unpatched base acts on its first optimal action."""
    pair_list, randoms = pairs
    rng = np.random.default_rng(0)
    out = []
    for pair in pair_list:
        target_opt, cf_opt = pair.base_optimal, pair.cf_optimal
        unpatched = min(target_opt)
        random_base = randoms[pair.pair_id]
        other = solve(random_base.grid).optimal_actions(random_base.state)
        for site in sites:
            patched = act(site, target_opt, cf_opt, rng)
            out.append(
                record(pair, pair.kind, site, mode, target_opt, cf_opt, cf_opt, patched, unpatched)
            )
            if pair.kind == "disjoint":
                patched = act(site, target_opt, other, rng)
                out.append(
                    record(pair, "random_grid", site, mode, target_opt, other, cf_opt, patched,
                           unpatched)
                )  # fmt: skip
    return out


def verdicts_of(records) -> dict[str, dict]:
    return {v["site"]: v for v in anchor_verdicts(records, n_resamples=500, random_state=0)}


def test_enough_disjoint_pairs_for_power(pairs):
    n = sum(p.kind == "disjoint" for p in pairs[0])
    assert n >= 100 and len({p.base.grid_id for p in pairs[0]}) == N_GRIDS


def test_a_pure_input_swap_is_not_causal_evidence_at_the_anchors(pairs):
    """An optimal agent that acts on its input: the all-block grid patch moves every action
    (the old headline's 100%), but that site is labelled a sanity check; the anchors carry
    nothing, so their verdict is "no"."""

    def act(site, target_opt, source_opt, rng):
        return min(source_opt) if site == "grid" else min(target_opt)

    v = verdicts_of(simulate(pairs, act))
    assert v["grid"]["verdict"] == "sanity check" and v["grid"]["moved"]["value"] == 1.0
    anchor = v["pre_reasoning"]
    assert anchor["verdict"] == "no"
    assert anchor["moved"]["value"] == 0.0 and anchor["n_pairs"] >= 100
    # the interval says what n can exclude: at 0 of >= 100 pairs, a large effect
    assert anchor["moved"]["ci_high"] is not None and anchor["moved"]["ci_high"] < 0.2


def test_an_output_breaking_patch_is_not_causal_evidence(pairs):
    """Unparsable answers are reported as invalid, never as moved or changed."""
    v = verdicts_of(simulate(pairs, lambda site, t, s, rng: None))
    anchor = v["pre_reasoning"]
    assert anchor["verdict"] == "no"
    assert anchor["invalid"]["value"] == 1.0 and anchor["moved"]["value"] == 0.0
    assert anchor["control_changed"]["value"] == 0.0
    summary = summarize(simulate(pairs, lambda site, t, s, rng: None), n_resamples=100)
    assert all(r.action_changed_rate == 0.0 and r.invalid_rate == 1.0 for r in summary)


def test_a_disruptive_patch_does_not_beat_the_random_grid_control(pairs):
    """Uniformly random actions land in the counterfactual's optimal set by chance (about a
    third of the time: the old verdict "above 0" would say yes); the random grid's patch
    lands there as often, so the verdict is "no"."""
    v = verdicts_of(simulate(pairs, lambda site, t, s, rng: Action(int(rng.integers(4)))))
    anchor = v["pre_reasoning"]
    assert anchor["moved"]["ci_low"] > 0.1  # chance alone, far from 0
    assert anchor["verdict"] == "no"


def test_a_state_transplant_at_the_anchors_is_causal_evidence(pairs):
    """The positive control's mechanism: the action follows the source's state, so the real
    counterfactual moves it into its optimal set and a random grid mostly does not."""
    v = verdicts_of(simulate(pairs, lambda site, t, s, rng: min(s)))
    anchor = v["pre_reasoning"]
    assert anchor["verdict"] == "yes"
    assert anchor["moved"]["value"] == 1.0 and anchor["random_grid"]["value"] < 0.6
    assert anchor["difference"]["ci_low"] > 0.3


def test_without_a_random_grid_control_the_verdict_is_undecided(pairs):
    records = [
        r for r in simulate(pairs, lambda site, t, s, rng: min(s)) if r["kind"] != "random_grid"
    ]
    assert verdicts_of(records)["pre_reasoning"]["verdict"] == "undecided"


def _by_mode(records) -> dict[tuple[str, str], dict]:
    return {
        (v["site"], v["mode"]): v for v in anchor_verdicts(records, n_resamples=300, random_state=0)
    }


def test_the_regenerated_input_sanity_check_passes_only_for_an_agent_that_reads_its_input(pairs):
    """Issue 40, item 1: the sanity row is the regenerated one; an agent that acts on its input
    passes it, an agent whose output ignores the grid (it keeps its own plan) is flagged, and a
    teacher-forced input patch (the answer copies the fixed reasoning's plan) is never the
    sanity check, whatever the agent."""

    def reads(site, target_opt, source_opt, rng):
        return min(source_opt) if site == "grid" else min(target_opt)

    def ignores(site, target_opt, source_opt, rng):
        return min(target_opt)

    sites = ("grid", "pre_reasoning")
    good = _by_mode(
        simulate(pairs, reads, sites) + simulate(pairs, ignores, sites, "teacher_forced")
    )
    regenerated, forced = good[("grid", "regenerated")], good[("grid", "teacher_forced")]
    assert regenerated["sanity_passed"] is True and regenerated["flag"] is None
    assert regenerated["headline"] and regenerated["verdict"] == "sanity check"
    assert forced["moved"]["value"] == 0.0  # the teacher-forced 0% of the old headline
    assert forced["sanity_passed"] is None and not forced["headline"]
    assert forced["note"].startswith("teacher-forced")
    bad = _by_mode(simulate(pairs, ignores, sites))[("grid", "regenerated")]
    assert bad["sanity_passed"] is False and bad["flag"].startswith("sanity check failed")
    # an agent that reads its input only some of the time: below 90% is flagged too
    half = _by_mode(
        simulate(pairs, lambda s, t, c, rng: min(c) if rng.random() < 0.7 else min(t), ("grid",))
    )[("grid", "regenerated")]
    assert 0.5 < half["moved"]["value"] < 0.9 and half["sanity_passed"] is False


def test_the_recovered_logit_difference_stays_beside_its_own_runs(pairs):
    """The recovered logit difference is measured on teacher-forced runs: a regenerated row
    carries none (it used to print the teacher-forced cell's beside it)."""
    forced = simulate(pairs, lambda s, t, c, rng: min(t), ("pre_reasoning",), "teacher_forced")
    for i, r in enumerate(forced):
        r["recovered"] = 0.25 if i % 2 else 0.75
    regenerated = simulate(pairs, lambda s, t, c, rng: min(c), ("pre_reasoning",))
    v = _by_mode(forced + regenerated)
    assert v[("pre_reasoning", "regenerated")]["recovered"]["n"] == 0
    assert v[("pre_reasoning", "regenerated")]["recovered"]["value"] is None
    assert v[("pre_reasoning", "teacher_forced")]["recovered"]["n"] > 0


def test_zero_moved_reports_the_bound_its_n_can_exclude():
    # 0 of 12 pairs excludes only effects above about 26%; 0 of 48 above about 7%
    assert 0.25 < exact_upper_bound(0, 12) < 0.27
    assert exact_upper_bound(0, 48) < 0.08
    assert exact_upper_bound(12, 12) == 1.0 and exact_upper_bound(0, 0) is None
