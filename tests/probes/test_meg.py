"""Tests of goalprobe.probes.scoring.meg: maximum entropy goal-directedness (MacDermott et al., 2024)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from goalprobe.probes.scoring import meg_engine as engine
from goalprobe.probes.scoring.meg import (
    MDPBatch,
    TabularMDP,
    _cross_entropy_term,
    _single,
    _time_indexed,
    known_utility_meg,
    known_utility_meg_batch,
    stack_padded,
    state_occupancy,
    unknown_utility_meg,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.special import logsumexp

LOG2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------
# Reference implementations (Definitions 3.2 and 5.2 evaluated directly, from the engine's passes)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SoftPolicy:
    """Soft-optimal policy of rationality ``beta``: ``(H, S, A)`` policy, log-policy and Q,
    ``(H, S)`` values (soft, optimal / anti-optimal at ``+/-inf``, uniform at 0)."""

    beta: float
    policy: np.ndarray
    log_policy: np.ndarray
    q: np.ndarray
    v: np.ndarray


def soft_value_iteration(mdp: TabularMDP, utility: np.ndarray, beta: float) -> SoftPolicy:
    """Soft value iteration (Definition 5.2) for any ``beta`` in ``[-inf, inf]``."""
    beta = float(beta)
    prob = _single(mdp, utility, None)
    h, n_s = mdp.horizon, mdp.n_states
    if np.isinf(beta):
        lim = engine.limit_pass(prob, 1.0 if beta > 0 else -1.0, record=True)
        q = lim.q[:, :, 0].transpose(0, 2, 1)  # (H, S, A)
        in_set = lim.in_set[:, :, 0].transpose(0, 2, 1)
        w = lim.w[:, 0]  # (H, S)
        w_next = np.concatenate([w[1:], np.zeros((1, n_s))])
        ew = np.stack([prob.dyn.expect(w_next[t][None], 1)[:, 0].T for t in range(h)])
        log_policy = np.where(in_set, ew - w[:, :, None], -np.inf)
        v = q.max(axis=2) if beta > 0 else q.min(axis=2)
    else:
        res = engine.soft_pass(prob, np.array([beta]), record=True)
        logits = res.logits[:, :, 0].transpose(0, 2, 1)  # (H, S, A)
        log_policy = logits - logsumexp(logits, axis=2, keepdims=True)
        if beta != 0.0:
            u = np.broadcast_to(prob.utility[:, 0], (h, n_s))
            q, v = logits / beta + u[:, :, None], res.lam[:, 0] / beta
        else:  # the uniform policy's Q and V
            qs, vs, v = [], [], None
            for k in range(h):
                u = prob.utility_at(k, 1)
                q = (
                    np.broadcast_to(u, (mdp.n_actions, *u.shape))
                    if v is None
                    else u + prob.dyn.expect(v, 1)
                )
                v = q.mean(axis=0)
                qs.append(q[:, 0].T.copy())
                vs.append(v[0])
            q, v = np.stack(qs[::-1]), np.stack(vs[::-1])
    return SoftPolicy(beta, np.exp(log_policy), log_policy, q, v)


def expected_utility(mdp: TabularMDP, policy: np.ndarray, utility: np.ndarray) -> float:
    """``E_pi[sum_t U_t(S_t)]``."""
    return float(engine.policy_values(_single(mdp, utility, policy))[0][0])


def meg_at_beta(mdp: TabularMDP, policy: np.ndarray, utility: np.ndarray, beta: float) -> float:
    """Definition 3.2 at ``beta`` directly (not the telescoped identity known_utility_meg uses)."""
    soft = soft_value_iteration(mdp, utility, beta)
    occ = state_occupancy(mdp, policy)
    pol = _time_indexed(np.asarray(policy, dtype=np.float64), mdp.horizon)
    return _cross_entropy_term(occ, pol, soft.log_policy) + mdp.horizon * np.log(mdp.n_actions)


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------


def mouse_mdp() -> TabularMDP:
    """Example 1 as an MDP (Definition 5.1): S_0 = cheese side, D_0 = move, S_1 = obtained or not.

    States: 0 cheese left, 1 cheese right, 2 cheese obtained, 3 not obtained; actions 0 left,
    1 right. Utility counts on S_0 and S_1, so the second decision D_1 is idle (it cannot
    influence utility and contributes 0 to MEG), exactly as the paper's single-decision CID.
    """
    p = np.zeros((4, 2, 4))
    p[0, 0, 2] = p[0, 1, 3] = 1.0
    p[1, 1, 2] = p[1, 0, 3] = 1.0
    p[2, :, 2] = p[3, :, 3] = 1.0
    return TabularMDP(p, [0.5, 0.5, 0.0, 0.0], horizon=2)


MOUSE_UTILITY = np.array([0.0, 0.0, 1.0, -1.0])  # +1 for the cheese, -1 otherwise


def mouse_policy(p_towards: float) -> np.ndarray:
    return np.array(
        [[p_towards, 1 - p_towards], [1 - p_towards, p_towards], [0.5, 0.5], [0.5, 0.5]]
    )


def random_mdp(
    rng: np.random.Generator, n_states=5, n_actions=3, horizon=4, deterministic=False
) -> TabularMDP:
    initial = rng.dirichlet(np.ones(n_states))
    if deterministic:
        return mdp_from_next_state(
            rng.integers(0, n_states, (n_states, n_actions)), initial, horizon
        )
    return TabularMDP(
        rng.dirichlet(np.full(n_states, 0.5), (n_states, n_actions)), initial, horizon
    )


def random_policy(rng: np.random.Generator, n_states=5, n_actions=3) -> np.ndarray:
    return rng.dirichlet(np.ones(n_actions), n_states)


def chain_mdp(horizon: int, n_actions: int = 3) -> TabularMDP:
    """A lock: action 0 walks along states 0 .. H-1, any other action falls into the sink H."""
    n_states = horizon + 1
    nxt = np.full((n_states, n_actions), horizon)
    nxt[:horizon, 0] = np.minimum(np.arange(horizon) + 1, horizon - 1)
    return mdp_from_next_state(nxt, np.eye(n_states)[0], horizon)


def mdp_from_next_state(next_state: np.ndarray, initial, horizon: int) -> TabularMDP:
    """A deterministic MDP from ``(S, A)`` successor indices."""
    transitions = np.zeros((*next_state.shape, next_state.shape[0]))
    s_idx, a_idx = np.indices(next_state.shape)
    transitions[s_idx, a_idx, next_state] = 1.0
    return TabularMDP(transitions, initial, horizon)


def brute_force_soft_q(mdp: TabularMDP, utility: np.ndarray, beta: float) -> np.ndarray:
    """Definition 5.2 written out with Python loops: Q_n = E[U_n | d, s];
    Q_t = E[U_t + (1 / beta) logsumexp(beta Q_{t+1}(. | S_{t+1})) | d, s]."""
    h, n_s, n_a = mdp.horizon, mdp.n_states, mdp.n_actions
    u = np.broadcast_to(utility, (h, n_s))
    q = np.zeros((h, n_s, n_a))
    for s in range(n_s):
        for a in range(n_a):
            q[h - 1, s, a] = u[h - 1, s]
    for t in range(h - 2, -1, -1):
        for s in range(n_s):
            for a in range(n_a):
                total = u[t, s]
                for s2 in range(n_s):
                    lse = math.log(sum(math.exp(beta * q[t + 1, s2, b]) for b in range(n_a)))
                    total += mdp.transitions[s, a, s2] * lse / beta
                q[t, s, a] = total
    return q


def soft_expected_utility(mdp, utility, beta) -> float:
    return expected_utility(mdp, soft_value_iteration(mdp, utility, beta).policy, utility)


def derivative(beta, mdp, utility, eu_pi) -> float:
    """``f'(beta) = E_pi[U] - E_beta[U]`` from independent public functions."""
    return eu_pi - soft_expected_utility(mdp, utility, beta)


# ---------------------------------------------------------------------------------------------
# Example 1 of the paper
# ---------------------------------------------------------------------------------------------


def test_example_1_mouse_towards_cheese_with_probability_08():
    res = known_utility_meg(mouse_mdp(), mouse_policy(0.8), MOUSE_UTILITY)
    expected = LOG2 + 0.8 * math.log(0.8) + 0.2 * math.log(0.2)  # 0.69 - 0.50
    assert res.meg == pytest.approx(expected, abs=1e-12)
    assert round(res.meg, 2) == 0.19
    assert res.beta == pytest.approx(LOG2, rel=1e-9)  # "a rationality parameter of beta = log 2"
    assert res.converged
    assert res.expected_utility == pytest.approx(0.6)
    assert res.expected_utility_model == pytest.approx(0.6, abs=1e-9)
    assert (res.min_expected_utility, res.max_expected_utility) == (-1.0, 1.0)


def test_example_1_optimal_and_anti_optimal_policies_reach_log_2():
    opt = known_utility_meg(mouse_mdp(), mouse_policy(1.0), MOUSE_UTILITY)
    assert opt.meg == pytest.approx(LOG2, abs=1e-15)
    assert opt.beta == math.inf
    anti = known_utility_meg(mouse_mdp(), mouse_policy(0.0), MOUSE_UTILITY)
    assert anti.meg == pytest.approx(LOG2, abs=1e-15)
    assert anti.beta == -math.inf


# ---------------------------------------------------------------------------------------------
# Soft value iteration
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("beta", [-3.0, -0.4, 0.7, 2.5])
def test_soft_value_iteration_matches_definition_5_2(deterministic, beta):
    rng = np.random.default_rng(7 + int(deterministic))
    for _ in range(3):
        mdp = random_mdp(rng, deterministic=deterministic)
        utility = rng.normal(size=(mdp.horizon, mdp.n_states))  # time-indexed U_t
        soft = soft_value_iteration(mdp, utility, beta)
        q = brute_force_soft_q(mdp, utility, beta)
        np.testing.assert_allclose(soft.q, q, rtol=1e-10, atol=1e-10)
        expected_pi = np.exp(beta * q - np.log(np.exp(beta * q).sum(axis=2, keepdims=True)))
        np.testing.assert_allclose(soft.policy, expected_pi, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(soft.policy.sum(axis=2), 1.0)


def test_soft_value_iteration_is_stable_for_huge_beta_and_uniform_at_zero():
    rng = np.random.default_rng(3)
    mdp = random_mdp(rng)
    utility = rng.normal(size=mdp.n_states) * 1e3
    for beta in (1e6, -1e6):
        soft = soft_value_iteration(mdp, utility, beta)
        assert np.all(np.isfinite(soft.policy)) and np.all(np.isfinite(soft.q))
        np.testing.assert_allclose(soft.policy.sum(axis=2), 1.0)
    zero = soft_value_iteration(mdp, utility, 0.0)
    np.testing.assert_allclose(zero.policy, 1.0 / mdp.n_actions)


def test_infinite_beta_is_the_limit_of_soft_policies_with_ties():
    rng = np.random.default_rng(11)
    for _ in range(4):
        mdp = random_mdp(rng, n_states=6, deterministic=True)
        utility = rng.integers(0, 3, mdp.n_states).astype(float)  # many exact ties
        for sign in (1.0, -1.0):
            limit = soft_value_iteration(mdp, utility, sign * math.inf)
            large = soft_value_iteration(mdp, utility, sign * 1e4)
            np.testing.assert_allclose(limit.policy, large.policy, atol=1e-9)


def test_infinite_beta_limit_is_maximum_entropy_optimal_not_uniform_over_argmax():
    # From state 0, action 0 leads to a state with two optimal continuations, action 1 to a state
    # with one: both are optimal, but the maximum-entropy optimal policy (the beta -> inf limit,
    # Theorem 5.1) weighs them 2 : 1.
    nxt = np.array([[1, 2], [3, 3], [3, 4], [3, 3], [4, 4]])
    mdp = mdp_from_next_state(nxt, np.eye(5)[0], horizon=3)
    utility = np.array([0.0, 0.0, 0.0, 1.0, 0.0])
    limit = soft_value_iteration(mdp, utility, math.inf)
    np.testing.assert_allclose(limit.policy[0, 0], [2 / 3, 1 / 3])
    np.testing.assert_allclose(limit.policy[1, 2], [1.0, 0.0])
    uniform_over_argmax = np.full((5, 2), 0.5)
    uniform_over_argmax[2] = [1.0, 0.0]
    res = known_utility_meg(mdp, uniform_over_argmax, utility)
    assert res.beta == math.inf
    assert res.meg == pytest.approx(meg_at_beta(mdp, uniform_over_argmax, utility, math.inf))


# ---------------------------------------------------------------------------------------------
# Known-utility MEG: solver and identities
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True])
def test_known_utility_meg_maximises_definition_3_2_over_beta(deterministic):
    rng = np.random.default_rng(21 + int(deterministic))
    for _ in range(4):
        mdp = random_mdp(rng, deterministic=deterministic)
        policy = random_policy(rng)
        utility = rng.normal(size=mdp.n_states)
        res = known_utility_meg(mdp, policy, utility)
        assert res.converged
        # the reported value is Definition 3.2 evaluated directly at the reported beta
        assert res.meg == pytest.approx(meg_at_beta(mdp, policy, utility, res.beta), abs=1e-10)
        # and no beta on a grid does better
        grid = [meg_at_beta(mdp, policy, utility, b) for b in np.linspace(-15, 15, 301)]
        assert max(grid) <= res.meg + 1e-10
        # the maximiser is the root of f'(beta) = E_pi[U] - E_beta[U] (scipy's brentq)
        eu_pi = expected_utility(mdp, policy, utility)
        lo, hi = (0.0, 50.0) if res.beta > 0 else (-50.0, 0.0)
        root = brentq(derivative, lo, hi, args=(mdp, utility, eu_pi), xtol=1e-13)
        assert res.beta == pytest.approx(root, rel=1e-7, abs=1e-10)


def test_derivative_of_predictive_accuracy_is_expected_utility_gap():
    rng = np.random.default_rng(5)
    mdp = random_mdp(rng)
    policy, utility = random_policy(rng), rng.normal(size=mdp.n_states)
    eu_pi = expected_utility(mdp, policy, utility)
    for beta in (-1.0, 0.3, 2.0):
        d = 1e-5
        numeric = (
            meg_at_beta(mdp, policy, utility, beta + d)
            - meg_at_beta(mdp, policy, utility, beta - d)
        ) / (2 * d)
        assert numeric == pytest.approx(eu_pi - soft_expected_utility(mdp, utility, beta), abs=1e-7)


def test_time_indexed_policy_and_utility():
    rng = np.random.default_rng(8)
    mdp = random_mdp(rng)
    policy = rng.dirichlet(np.ones(3), (mdp.horizon, mdp.n_states))
    utility = rng.normal(size=(mdp.horizon, mdp.n_states))
    res = known_utility_meg(mdp, policy, utility)
    assert res.meg == pytest.approx(meg_at_beta(mdp, policy, utility, res.beta), abs=1e-10)
    # a stationary policy given as (S, A) or repeated as (H, S, A) scores the same
    stationary = random_policy(rng)
    a = known_utility_meg(mdp, stationary, utility[0]).meg
    b = known_utility_meg(mdp, np.repeat(stationary[None], mdp.horizon, 0), utility[0]).meg
    assert a == pytest.approx(b, abs=1e-12)


def test_near_optimal_policy_approaches_the_optimal_limit():
    mdp = chain_mdp(horizon=5)
    utility = np.r_[np.ones(5), 0.0]
    optimal = np.zeros((6, 3))
    optimal[:, 0] = 1.0
    top = known_utility_meg(mdp, optimal, utility).meg
    previous = -1.0
    for eps in (1e-2, 1e-5, 1e-9, 1e-14):
        res = known_utility_meg(mdp, (1 - eps) * optimal + eps / 3, utility)
        assert math.isfinite(res.beta) and res.beta > 0
        assert previous < res.meg <= top + 1e-12
        previous = res.meg
    assert previous == pytest.approx(top, abs=1e-9)


# ---------------------------------------------------------------------------------------------
# Properties (Propositions 3.1 - 3.3)
# ---------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    scale=st.floats(0.01, 100.0) | st.floats(-100.0, -0.01),
    shift=st.floats(-50.0, 50.0),
)
def test_invariant_under_positive_affine_and_negative_scaling(seed, scale, shift):
    rng = np.random.default_rng(seed)
    mdp = random_mdp(rng, deterministic=bool(seed % 2))
    policy, utility = random_policy(rng), rng.normal(size=mdp.n_states)
    base = known_utility_meg(mdp, policy, utility)
    moved = known_utility_meg(mdp, policy, scale * utility + shift)
    assert moved.meg == pytest.approx(base.meg, rel=1e-7, abs=1e-10)
    if base.meg > 1e-6:
        assert moved.beta == pytest.approx(base.beta / scale, rel=1e-5)  # a < 0 flips beta


def test_zero_for_the_uniform_policy():
    rng = np.random.default_rng(2)
    for det in (False, True):
        mdp = random_mdp(rng, deterministic=det)
        uniform = np.full((mdp.n_states, mdp.n_actions), 1 / mdp.n_actions)
        res = known_utility_meg(mdp, uniform, rng.normal(size=mdp.n_states))
        assert res.meg == 0.0 and res.beta == 0.0 and res.converged
        assert unknown_utility_meg(mdp, uniform).meg == pytest.approx(0.0, abs=1e-12)


def test_zero_when_decisions_cannot_influence_the_utility():
    rng = np.random.default_rng(4)
    # transitions that ignore the action
    row = rng.dirichlet(np.ones(5), 5)
    mdp = TabularMDP(np.repeat(row[:, None], 3, axis=1), rng.dirichlet(np.ones(5)), 4)
    res = known_utility_meg(mdp, random_policy(rng), rng.normal(size=5))
    assert res.meg == 0.0 and res.beta == 0.0
    assert res.min_expected_utility == pytest.approx(res.max_expected_utility)
    assert unknown_utility_meg(mdp, random_policy(rng)).meg == pytest.approx(0.0, abs=1e-10)
    # a single decision: utility on S_0 only, which no decision can affect (Definition 5.1)
    one = random_mdp(rng, horizon=1)
    assert known_utility_meg(one, random_policy(rng), rng.normal(size=5)).meg == 0.0


def test_upper_bound_attained_by_the_unique_optimal_deterministic_policy():
    for horizon in (2, 4, 7):
        mdp = chain_mdp(horizon)
        utility = np.r_[np.ones(horizon), 0.0]
        optimal = np.zeros((horizon + 1, 3))
        optimal[:, 0] = 1.0
        res = known_utility_meg(mdp, optimal, utility)
        # H - 1 decisions can affect utility (the last one never can, Definition 5.1)
        bound = (horizon - 1) * math.log(3)
        assert res.meg == pytest.approx(bound, abs=1e-12)
        assert res.beta == math.inf
        rng = np.random.default_rng(horizon)
        for _ in range(5):
            assert known_utility_meg(mdp, random_policy(rng, horizon + 1), utility).meg < bound


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_bounds_for_random_policies(seed):
    rng = np.random.default_rng(seed)
    mdp = random_mdp(rng, deterministic=bool(seed % 2))
    policy = random_policy(rng)
    if seed % 3 == 0:  # some deterministic policies
        policy = np.eye(3)[rng.integers(0, 3, 5)]
    res = known_utility_meg(mdp, policy, rng.normal(size=5))
    assert 0.0 <= res.meg <= (mdp.horizon - 1) * math.log(3) + 1e-12


def test_states_the_policy_never_visits_do_not_matter():
    # state 4 is never reached from state 0
    nxt = np.array([[1, 2, 0], [2, 3, 0], [3, 1, 1], [0, 3, 2], [4, 0, 1]])
    mdp = mdp_from_next_state(nxt, np.eye(5)[0], horizon=5)
    rng = np.random.default_rng(0)
    policy, utility = random_policy(rng), rng.normal(size=5)
    other = policy.copy()
    other[4] = [1.0, 0.0, 0.0]
    assert state_occupancy(mdp, policy)[:, 4].max() == 0.0
    assert known_utility_meg(mdp, other, utility).meg == known_utility_meg(mdp, policy, utility).meg
    a, b = unknown_utility_meg(mdp, policy), unknown_utility_meg(mdp, other)
    assert a.meg == pytest.approx(b.meg, abs=1e-10)


# ---------------------------------------------------------------------------------------------
# Unknown-utility MEG
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True])
def test_unknown_utility_meg_dominates_every_known_utility(deterministic):
    rng = np.random.default_rng(31 + int(deterministic))
    for _ in range(3):
        mdp = random_mdp(rng, deterministic=deterministic)
        policy = random_policy(rng)
        unknown = unknown_utility_meg(mdp, policy)
        assert unknown.converged and unknown.feature_residual < 1e-6
        assert unknown.meg <= unknown.upper_bound + 1e-12
        for _ in range(5):
            known = known_utility_meg(mdp, policy, rng.normal(size=mdp.n_states))
            assert known.meg <= unknown.meg + 1e-9
        # the fitted utility is itself a known utility attaining the value
        fitted = known_utility_meg(mdp, policy, unknown.utility[0])
        assert fitted.meg == pytest.approx(unknown.meg, abs=1e-7)


def test_unknown_utility_meg_of_a_deterministic_path_approaches_the_self_bound():
    mdp = chain_mdp(horizon=5)
    optimal = np.zeros((6, 3))
    optimal[:, 0] = 1.0
    res = unknown_utility_meg(mdp, optimal)
    assert res.upper_bound == pytest.approx(5 * math.log(3))
    # the supremum (4 log 3: the last decision is idle) is only reached as |U| -> inf
    assert res.meg == pytest.approx(4 * math.log(3), abs=1e-4)
    assert res.meg <= 4 * math.log(3) + 1e-12


# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------


def test_batched_deterministic_matches_single_dense_with_padding_and_mixed_horizons():
    rng = np.random.default_rng(51)
    mdps, policies, utilities = [], [], []
    for b in range(12):
        n_s = int(rng.integers(3, 8))
        mdps.append(
            random_mdp(rng, n_states=n_s, horizon=int(rng.integers(1, 7)), deterministic=True)
        )
        pol = random_policy(rng, n_s)
        if b % 4 == 0:
            pol = np.full_like(pol, 1 / 3)
        policies.append(pol)
        utilities.append(rng.normal(size=n_s))
    # one optimal policy for the +inf branch
    opt = soft_value_iteration(mdps[1], utilities[1], math.inf).policy[0]
    policies[1] = opt
    batch = MDPBatch.from_mdps(mdps)
    assert batch.next_state is not None
    n_s = batch.n_states
    res = known_utility_meg_batch(
        batch, stack_padded(policies, n_s, 1 / 3), stack_padded(utilities, n_s, 0.0)
    )
    dense = MDPBatch.from_mdps(mdps, deterministic=False)
    assert dense.transitions is not None
    res_dense = known_utility_meg_batch(
        dense, stack_padded(policies, n_s, 1 / 3), stack_padded(utilities, n_s, 0.0)
    )
    for b, mdp in enumerate(mdps):
        single = known_utility_meg(
            TabularMDP(mdp.transitions, mdp.initial, mdp.horizon), policies[b], utilities[b]
        )
        assert res[b].meg == pytest.approx(single.meg, abs=1e-9)
        assert res_dense[b].meg == pytest.approx(single.meg, abs=1e-9)
        assert res[b].n_decisions == mdp.horizon
    assert len(res) == 12


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def test_invalid_inputs_raise_clear_errors():
    good = mouse_mdp()
    with pytest.raises(ValueError, match=r"does not sum to 1 at index \(0, 1\)"):
        bad = good.transitions.copy()
        bad[0, 1, 3] = 0.5
        TabularMDP(bad, good.initial, 2)
    with pytest.raises(ValueError, match="shape"):
        TabularMDP(np.ones((3, 2, 4)) / 4, np.ones(3) / 3, 2)
    with pytest.raises(ValueError, match="initial"):
        TabularMDP(good.transitions, [1.0, 0.0, 0.0], 2)
    with pytest.raises(ValueError, match=">= 1"):
        TabularMDP(good.transitions, good.initial, 0)
    with pytest.raises(TypeError, match="horizon"):
        TabularMDP(good.transitions, good.initial, True)
    with pytest.raises(ValueError, match="policy"):
        known_utility_meg(good, np.full((4, 3), 1 / 3), MOUSE_UTILITY)
    with pytest.raises(ValueError, match=r"negative probability"):
        known_utility_meg(good, mouse_policy(1.2), MOUSE_UTILITY)
    with pytest.raises(ValueError, match="non-finite"):
        known_utility_meg(good, mouse_policy(0.8), np.array([0, 0, np.nan, 1.0]))
    with pytest.raises(ValueError, match="time-indexed utility has 3 steps"):
        known_utility_meg(good, mouse_policy(0.8), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="exactly one"):
        MDPBatch(np.ones((1, 2)) / 2, 1)
