"""Maximum entropy goal-directedness (MEG) in finite-horizon tabular MDPs.

Implements MacDermott, Fox, Belardinelli and Everitt, *Measuring Goal-Directedness* (NeurIPS
2024): known-utility MEG (Definition 3.2 through Theorem 5.1) with the MDP containers, and
unknown-utility MEG (Definition 4.3): the supremum of known-utility MEG over all utility functions
of the state, solved as a concave maximum-causal-entropy dual.

Conventions (Definition 5.1):

- ``H`` is the number of decisions ``D_0 .. D_{H-1}``; decision ``D_t`` sees the state ``S_t``.
- Utility is a function of the state, counted on ``S_0 .. S_{H-1}``: ``U = sum_t U_t(S_t)``, an
  ``(S,)`` or time-indexed ``(H, S)`` array, so the last decision never influences utility (to
  score arriving in ``S_H``, use horizon ``H + 1``).
- Policies are ``(S, A)`` (stationary) or ``(H, S, A)`` (time-indexed), rows are distributions.
- MEG is in nats, summed over decisions, uniform baseline subtracted:
  ``MEG = sum_t E_pi[log pi_model(D_t | S_t) + log |A|]`` over ``pi``'s own trajectories (rows
  of states ``pi`` never reaches change nothing).

Soft value iteration runs on the log-partition ``Lambda_t = beta * V^soft_t`` (Definition 5.2),
stable for every real ``beta``, in batches of MDPs (:mod:`goalprobe.probes.scoring.meg_engine`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from goalprobe.probes.scoring import meg_engine as engine
from scipy.optimize import minimize
from scipy.special import logsumexp

_ATOL_PROB = 1e-6
"""Tolerance on probability rows summing to one (and on negative entries)."""


def _check_distribution(p: np.ndarray, what: str, axis: int = -1) -> None:
    """Raise ValueError naming the first row of ``p`` along ``axis`` that is not a distribution."""
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{what} has a non-finite entry at index {_first(~np.isfinite(p))}")
    if np.any(p < -_ATOL_PROB):
        bad = _first(p < -_ATOL_PROB)
        raise ValueError(f"{what} has a negative probability {p[bad]:.3g} at index {bad}")
    sums = p.sum(axis=axis)
    off = np.abs(sums - 1.0) > _ATOL_PROB
    if np.any(off):
        bad = _first(off)
        raise ValueError(f"{what} does not sum to 1 at index {bad} (sum {sums[bad]:.12g})")


def _first(mask: np.ndarray) -> tuple[int, ...]:
    """The index of the first true entry of ``mask``."""
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _check_horizon(horizon) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer):
        raise TypeError(f"horizon must be an int (number of decisions), got {horizon!r}")
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1 decision, got {horizon}")
    return int(horizon)


def _set_read_only(obj, name: str, value: np.ndarray) -> None:
    """Set field ``name`` of the frozen dataclass ``obj`` to ``value``, made read-only."""
    value.setflags(write=False)
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, eq=False)
class TabularMDP:
    """A finite-horizon tabular MDP (Definition 5.1): read-only ``(S, A, S)`` ``transitions``
    (``P(S_{t+1}=s2 | S_t=s, D_t=a)``, rows distributions), ``(S,)`` ``initial`` distribution of
    ``S_0`` and ``horizon`` ``H`` decisions."""

    transitions: np.ndarray
    initial: np.ndarray
    horizon: int

    def __post_init__(self) -> None:
        transitions = np.array(self.transitions, dtype=np.float64)
        initial = np.array(self.initial, dtype=np.float64)
        if transitions.ndim != 3 or transitions.shape[0] != transitions.shape[2]:
            raise ValueError(f"transitions must have shape (S, A, S), got {transitions.shape}")
        n_states, n_actions = transitions.shape[:2]
        if n_states == 0 or n_actions == 0:
            raise ValueError(
                f"transitions needs at least one state and action, got {transitions.shape}"
            )
        if initial.shape != (n_states,):
            raise ValueError(f"initial must have shape ({n_states},), got {initial.shape}")
        _check_distribution(transitions, "transitions[s, a, :]")
        _check_distribution(initial, "initial")
        _set_read_only(self, "transitions", transitions)
        _set_read_only(self, "initial", initial)
        object.__setattr__(self, "horizon", _check_horizon(self.horizon))

    @property
    def n_states(self) -> int:
        """``S``."""
        return int(self.transitions.shape[0])

    @property
    def n_actions(self) -> int:
        """``A``."""
        return int(self.transitions.shape[1])

    @cached_property
    def next_state(self) -> np.ndarray | None:
        """``(S, A) int`` successor indices when every transition is deterministic, else None."""
        nxt = self.transitions.argmax(axis=2)
        one_hot = np.take_along_axis(self.transitions, nxt[..., None], axis=2)[..., 0]
        if not np.all(one_hot == 1.0):
            return None
        nxt.setflags(write=False)
        return nxt


@dataclass(frozen=True, eq=False)
class MDPBatch:
    """``B`` MDPs sharing ``S`` and ``A`` (:meth:`from_mdps` pads smaller ones), with exactly one of
    ``transitions`` and ``next_state`` (faster and lighter for grid worlds).

    Attributes:
        initial: ``(B, S)`` float, initial state distributions.
        horizon: ``(B,)`` int, number of decisions of each MDP (they may differ).
        transitions: ``(B, S, A, S)`` float row-stochastic transitions, or None.
        next_state: ``(B, S, A)`` int successor indices of deterministic MDPs, or None."""

    initial: np.ndarray
    horizon: np.ndarray
    transitions: np.ndarray | None = None
    next_state: np.ndarray | None = None

    def __post_init__(self) -> None:
        if (self.transitions is None) == (self.next_state is None):
            raise ValueError(
                "give exactly one of transitions (B, S, A, S) and next_state (B, S, A)"
            )
        initial = np.array(self.initial, dtype=np.float64)
        if initial.ndim != 2:
            raise ValueError(f"initial must have shape (B, S), got {initial.shape}")
        n_batch, n_states = initial.shape
        _check_distribution(initial, "initial[b, :]")
        horizon = np.array(self.horizon)
        if horizon.ndim == 0:
            horizon = np.full(n_batch, horizon)
        if horizon.shape != (n_batch,) or not np.issubdtype(horizon.dtype, np.integer):
            raise ValueError(
                f"horizon must be an int or a ({n_batch},) int array, got {self.horizon!r}"
            )
        if np.any(horizon < 1):
            raise ValueError(f"every horizon must be >= 1 decision, got min {horizon.min()}")
        if self.transitions is not None:
            transitions = np.array(self.transitions, dtype=np.float64)
            if transitions.shape[:2] + transitions.shape[3:] != (n_batch, n_states, n_states):
                raise ValueError(
                    f"transitions must have shape ({n_batch}, {n_states}, A, {n_states}), "
                    f"got {transitions.shape}"
                )
            _check_distribution(transitions, "transitions[b, s, a, :]")
            _set_read_only(self, "transitions", transitions)
        else:
            next_state = np.array(self.next_state)
            if (
                next_state.ndim != 3
                or next_state.shape[:2] != (n_batch, n_states)
                or not np.issubdtype(next_state.dtype, np.integer)
            ):
                raise ValueError(
                    f"next_state must be a ({n_batch}, {n_states}, A) int array, got "
                    f"{next_state.dtype} {next_state.shape}"
                )
            if np.any((next_state < 0) | (next_state >= n_states)):
                raise ValueError(f"next_state holds indices outside [0, {n_states})")
            _set_read_only(self, "next_state", next_state.astype(np.int64))
        _set_read_only(self, "initial", initial)
        _set_read_only(self, "horizon", horizon.astype(np.int64))

    @classmethod
    def from_mdps(cls, mdps: Sequence[TabularMDP], deterministic: bool | None = None) -> MDPBatch:
        """Stack MDPs with a common number of actions, padding with absorbing, never-reached states
        (:func:`stack_padded`); ``deterministic=None``: next states when every MDP allows."""
        if len(mdps) == 0:
            raise ValueError("from_mdps needs at least one MDP")
        n_actions = {m.n_actions for m in mdps}
        if len(n_actions) != 1:
            raise ValueError(f"MDPs must share the number of actions, got {sorted(n_actions)}")
        n_s, n_a = max(m.n_states for m in mdps), n_actions.pop()
        initial = stack_padded([m.initial for m in mdps], n_s, 0.0)
        horizon = np.array([m.horizon for m in mdps], dtype=np.int64)
        if deterministic is not False:
            nexts = [m.next_state for m in mdps]
            given = [n for n in nexts if n is not None]
            if len(given) == len(nexts):
                loops = np.broadcast_to(np.arange(n_s)[:, None], (n_s, n_a))
                next_state = np.stack([np.concatenate([n, loops[n.shape[0] :]]) for n in given])
                return cls(initial, horizon, next_state=next_state)
            if deterministic:
                bad = next(i for i, n in enumerate(nexts) if n is None)
                raise ValueError(f"MDP {bad} has stochastic transitions; cannot use next_state")
        transitions = np.zeros((len(mdps), n_s, n_a, n_s))
        for b, m in enumerate(mdps):
            transitions[b, : m.n_states, :, : m.n_states] = m.transitions
            pad = np.arange(m.n_states, n_s)
            transitions[b, pad, :, pad] = 1.0
        return cls(initial, horizon, transitions=transitions)

    @property
    def n_batch(self) -> int:
        """``B``."""
        return int(self.initial.shape[0])

    @property
    def n_states(self) -> int:
        """``S``."""
        return int(self.initial.shape[1])

    @property
    def n_actions(self) -> int:
        """``A``."""
        held = self.next_state if self.next_state is not None else self.transitions
        assert held is not None  # __post_init__ requires exactly one
        return int(held.shape[2])


def stack_padded(arrays: Sequence[np.ndarray], n_states: int, fill: float) -> np.ndarray:
    """Stack per-MDP state arrays ``(S_b, ...)`` into ``(B, n_states, ...)``, padding with ``fill``
    (``1 / A`` for policies, 0 for utilities; padded states are never reached)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    tails = {a.shape[1:] for a in arrays}
    if len(tails) != 1:
        raise ValueError(f"arrays must agree beyond the state axis, got {sorted(tails)}")
    too_big = [i for i, a in enumerate(arrays) if a.shape[0] > n_states]
    if too_big:
        raise ValueError(f"array {too_big[0]} has more than {n_states} states")
    out = np.full((len(arrays), n_states, *tails.pop()), fill, dtype=np.float64)
    for b, a in enumerate(arrays):
        out[b, : a.shape[0]] = a
    return out


def _as_time_array(
    arr: np.ndarray, n_batch: int, n_states: int, horizon: np.ndarray, what: str, extra: tuple = ()
) -> np.ndarray:
    """Normalise a stationary or time-indexed batch array to ``(B, 1 | H, S, *extra)``."""
    arr = np.asarray(arr, dtype=np.float64)
    core = (n_states, *extra)
    dims = ", ".join(map(str, core))
    if arr.shape == (n_batch, *core):
        return arr[:, None]
    if arr.ndim == 3 + len(extra) and arr.shape[0] == n_batch and arr.shape[2:] == core:
        if np.any(horizon != arr.shape[1]):
            raise ValueError(
                f"time-indexed {what} has {arr.shape[1]} steps but the horizons are "
                f"{np.unique(horizon).tolist()}"
            )
        return arr
    raise ValueError(
        f"{what} must have shape ({n_batch}, {dims}) or ({n_batch}, H, {dims}), got {arr.shape}"
    )


def _make_problem(
    batch: MDPBatch, utility: np.ndarray, policy: np.ndarray | None
) -> tuple[engine.Problem, np.ndarray]:
    """The engine problem of ``utility`` / ``policy`` on ``batch`` (sorted by horizon), its
    order."""
    b, s, a = batch.n_batch, batch.n_states, batch.n_actions
    u = _as_time_array(utility, b, s, batch.horizon, "utility")
    if not np.all(np.isfinite(u)):
        raise ValueError(f"utility has a non-finite entry at (b, t, s) = {_first(~np.isfinite(u))}")
    p = None
    if policy is not None:
        p = _as_time_array(policy, b, s, batch.horizon, "policy", extra=(a,))
        _check_distribution(p, "policy[b, t, s, :]")
    return engine.make_problem(
        batch.initial,
        batch.horizon,
        u,
        p,
        transitions=batch.transitions,
        next_state=batch.next_state,
    )


def _single(mdp: TabularMDP, utility: np.ndarray, policy: np.ndarray | None) -> engine.Problem:
    """A batch of one from a :class:`TabularMDP` (stationary or time-indexed arrays)."""
    if not isinstance(mdp, TabularMDP):
        raise TypeError(f"mdp must be a TabularMDP, got {type(mdp).__name__}")
    utility = np.asarray(utility, dtype=np.float64)
    if utility.ndim not in (1, 2):
        raise ValueError(f"utility must have shape (S,) or (H, S), got {utility.shape}")
    if policy is not None:
        policy = np.asarray(policy, dtype=np.float64)
        if policy.ndim not in (2, 3):
            raise ValueError(f"policy must have shape (S, A) or (H, S, A), got {policy.shape}")
        policy = policy[None]
    return _make_problem(MDPBatch.from_mdps([mdp]), utility[None], policy)[0]


def _time_indexed(policy: np.ndarray, h: int) -> np.ndarray:
    return np.broadcast_to(policy, (h, *policy.shape)) if policy.ndim == 2 else policy


def state_occupancy(mdp: TabularMDP, policy: np.ndarray) -> np.ndarray:
    """``(H, S)``: ``P_pi(S_t = s)`` for the decision states ``t = 0 .. H-1`` under an ``(S, A)`` or
    ``(H, S, A)`` ``policy``."""
    prob = _single(mdp, np.zeros(mdp.n_states), policy)
    assert prob.policy is not None  # the engine keeps the policy it is given
    pol = np.broadcast_to(prob.policy, (mdp.horizon, *prob.policy.shape[1:]))
    return engine.forward_occupancy(prob, pol)[:, 0]


def _cross_entropy_term(occ: np.ndarray, pol: np.ndarray, log_model: np.ndarray) -> float:
    """``sum_t sum_s occ_t(s) sum_a pol(a|s) log_model(a|s)`` with ``0 log 0 = 0``."""
    with np.errstate(invalid="ignore"):
        terms = np.where(pol > 0, pol * log_model, 0.0)
    return float(np.einsum("ts,tsa->", occ, terms))


@dataclass(frozen=True)
class KnownUtilityMEG:
    """Known-utility MEG of one policy (Definition 3.2).

    Attributes:
        meg: MEG in nats, summed over decisions (uniform baseline subtracted).
        beta: the maximising rationality (``+/-inf``: the (anti-)optimal limit; ``0.0`` when
            ``E_pi[U] = E_uniform[U]``).
        converged: whether the solver met its tolerances (True for the closed-form cases).
        iterations: soft passes of the Newton solver (including ``beta = 0``); 0 in closed form.
        expected_utility, expected_utility_model, expected_utility_uniform: ``E[U]`` under ``pi``,
            the maximising soft-optimal policy and the uniform policy.
        min_expected_utility, max_expected_utility: the attainable range of ``E[U]``.
        n_decisions: ``H``."""

    meg: float
    beta: float
    converged: bool
    iterations: int
    expected_utility: float
    expected_utility_model: float
    expected_utility_uniform: float
    min_expected_utility: float
    max_expected_utility: float
    n_decisions: int


@dataclass(frozen=True, eq=False)
class KnownUtilityMEGBatch:
    """Known-utility MEG of ``B`` policies; every field is a ``(B,)`` array named as in
    :class:`KnownUtilityMEG`. ``result[i]`` gives the :class:`KnownUtilityMEG` of MDP ``i``."""

    meg: np.ndarray
    beta: np.ndarray
    converged: np.ndarray
    iterations: np.ndarray
    expected_utility: np.ndarray
    expected_utility_model: np.ndarray
    expected_utility_uniform: np.ndarray
    min_expected_utility: np.ndarray
    max_expected_utility: np.ndarray
    n_decisions: np.ndarray

    def __len__(self) -> int:
        return int(self.meg.shape[0])

    def __getitem__(self, i: int) -> KnownUtilityMEG:
        fields = self.__dataclass_fields__
        return KnownUtilityMEG(**{name: getattr(self, name)[i].item() for name in fields})


def known_utility_meg(
    mdp: TabularMDP, policy: np.ndarray, utility: np.ndarray, *, xrtol: float = 1e-10
) -> KnownUtilityMEG:
    """Known-utility MEG (Definition 3.2) of an ``(S, A)`` or ``(H, S, A)`` ``policy`` with respect
    to an ``(S,)`` or ``(H, S)`` ``utility`` (``xrtol``: relative tolerance on ``beta``).

    By Theorem 5.1 MEG is ``sup_beta f(beta)``, ``f`` the expected log-likelihood of ``pi``'s
    actions under ``pi^soft_beta`` minus the uniform policy's. ``f`` is concave with ``f'(beta) =
    E_pi[U] - E_beta[U]`` and ``f''(beta) = -dE_beta[U]/dbeta`` (exact, from one backward pass);
    the root of ``f'`` is found by a safeguarded Newton iteration. Closed forms:

    - the utility cannot be influenced: MEG 0, ``beta = 0``;
    - ``E_pi[U]`` equals the optimal value (within 1e-9 of the utility range times ``H``) and ``pi``
      takes no non-optimal action: the ``beta = +inf`` limit (likewise ``-inf``, anti-optimal);
    - ``E_pi[U] = E_uniform[U]``: MEG 0 at ``beta = 0``."""
    return _known_utility_meg(_single(mdp, utility, policy), xrtol)[0]


def known_utility_meg_batch(
    batch: MDPBatch, policies: np.ndarray, utilities: np.ndarray, *, xrtol: float = 1e-10
) -> KnownUtilityMEGBatch:
    """Known-utility MEG of ``B`` policies ``(B, [H,] S, A)`` with utilities ``(B, [H,] S)``,
    vectorised: :func:`known_utility_meg` of each MDP of ``batch``."""
    prob, order = _make_problem(batch, utilities, policies)
    res = _known_utility_meg(prob, xrtol)
    inverse = np.argsort(order)  # order is a permutation
    return KnownUtilityMEGBatch(**{k: getattr(res, k)[inverse] for k in res.__dataclass_fields__})


def _known_utility_meg(prob: engine.Problem, xrtol: float) -> KnownUtilityMEGBatch:
    """Known-utility MEG of every MDP of ``prob`` (results in ``prob``'s order)."""
    n_b = prob.n_batch
    log_a = np.log(prob.n_actions)
    h = prob.horizon.astype(np.float64)
    eu_pi, eu_unif = engine.policy_values(prob)
    top = engine.limit_pass(prob, +1.0)
    bottom = engine.limit_pass(prob, -1.0)
    tol = engine.TIE_RTOL * prob.utility_scale()

    meg = np.zeros(n_b)
    beta = np.zeros(n_b)
    eu_model = eu_unif.copy()
    converged = np.ones(n_b, dtype=bool)
    iterations = np.zeros(n_b, dtype=np.int64)

    no_influence = top.eu - bottom.eu <= tol
    at_max = ~no_influence & (eu_pi >= top.eu - tol) & (top.off == 0)
    at_min = ~no_influence & ~at_max & (eu_pi <= bottom.eu + tol) & (bottom.off == 0)
    for mask, lim, b_inf in ((at_max, top, np.inf), (at_min, bottom, -np.inf)):
        meg[mask] = h[mask] * log_a - lim.log_z[mask]
        beta[mask] = b_inf
        eu_model[mask] = lim.eu[mask]
    g0 = eu_pi - eu_unif
    interior = ~(no_influence | at_max | at_min) & (np.abs(g0) > tol)
    idx = np.flatnonzero(interior)
    if idx.size:
        sub = prob.take(idx)
        at_zero = engine.soft_pass(sub, np.zeros(idx.size), curvature=True)
        sol = engine.solve_beta(
            sub,
            eu_pi[idx],
            g0[idx],
            at_zero.curvature,
            top.eu[idx] - bottom.eu[idx],
            xrtol=xrtol,
        )
        f = sol.f
        # beta = 0 (f = 0) is always a candidate of the supremum: keep it if rounding lost.
        keep = f > 0
        meg[idx] = np.where(keep, f, 0.0)
        beta[idx] = np.where(keep, sol.beta, 0.0)
        eu_model[idx] = np.where(keep, sol.eu, eu_unif[idx])
        converged[idx] = sol.converged
        iterations[idx] = sol.n_evals + 1
    return KnownUtilityMEGBatch(
        meg=meg,
        beta=beta,
        converged=converged,
        iterations=iterations,
        expected_utility=eu_pi,
        expected_utility_model=eu_model,
        expected_utility_uniform=eu_unif,
        min_expected_utility=bottom.eu,
        max_expected_utility=top.eu,
        n_decisions=prob.horizon.copy(),
    )


@dataclass(frozen=True, eq=False)
class UnknownUtilityMEG:
    """Unknown-utility MEG of one policy (Definition 4.3) and the utility attaining it.

    Attributes:
        meg: MEG in nats, ``f(U_hat)`` for the returned utility: a lower bound of the supremum,
            equal to it up to the solver tolerance.
        utility: ``(H, S)`` fitted utility with the rationality folded in (``beta = 1``); its rows
            are equal.
        weights: ``(S,)`` the fitted utility of each state.
        converged, iterations: the optimiser's (L-BFGS) success and iterations.
        feature_residual: ``max |d_pi(s) - d_model(s)|`` (0 at an attained optimum, -> 0 when the
            supremum lies at infinity).
        upper_bound: ``E_pi[sum_t log pi(D_t | S_t)] + H log|A|``, which no utility class exceeds.
        method: ``"concave-lbfgs"``."""

    meg: float
    utility: np.ndarray
    weights: np.ndarray
    converged: bool
    iterations: int
    feature_residual: float
    upper_bound: float
    method: str


def unknown_utility_meg(
    mdp: TabularMDP, policy: np.ndarray, *, max_iter: int = 2000, gtol: float = 1e-10
) -> UnknownUtilityMEG:
    """MEG over every utility function of the state, ``U(s)`` (Definition 4.3), solved exactly.

    ``beta U`` ranges over the same class, so ``theta = U`` with ``beta = 1``; ``f(theta)`` is
    concave (the dual of maximum-causal-entropy IRL) with exact gradient ``d_pi - d_theta``, so
    L-BFGS (``max_iter``, ``gtol``) reaches the global supremum. The value is ``f`` at the
    returned utility: a certified lower bound, approached from below when the supremum needs
    ``|theta| -> inf`` (e.g. deterministic policies)."""
    n_s, h = mdp.n_states, mdp.horizon
    base = _single(mdp, np.zeros(n_s), policy)
    occ_pi = state_occupancy(mdp, policy)
    const = h * np.log(mdp.n_actions)
    pol = _time_indexed(np.asarray(policy, dtype=np.float64), h)
    with np.errstate(divide="ignore"):
        upper_bound = _cross_entropy_term(occ_pi, pol, np.log(pol)) + const

    def utility_of(theta: np.ndarray) -> np.ndarray:
        return np.broadcast_to(theta, (h, n_s))

    def neg(theta: np.ndarray) -> tuple[float, np.ndarray]:
        """``-f(U)`` and its gradient in ``theta`` for ``beta = 1``, where ``f(U) = E_pi[sum_t
        U_t(S_t)] - E[Lambda_0(S_0)] + H log|A|`` with gradient ``d_pi - d_U`` (``(H, S)`` state
        occupancies: feature matching)."""
        u = utility_of(theta)
        prob = engine.Problem(
            base.dyn, base.n_actions, base.initial, base.horizon, u[:, None], None
        )
        res = engine.soft_pass(prob, np.ones(1), record=True)
        x = res.logits  # (H, A, 1, S)
        model = np.exp(x - logsumexp(x, axis=1, keepdims=True))
        occ = engine.forward_occupancy(prob, model)[:, 0]
        f = float(np.sum(occ_pi * u) - res.log_z[0] + const)
        return -f, -(occ_pi - occ).sum(axis=0)

    res = minimize(
        neg,
        np.zeros(n_s),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "gtol": gtol, "ftol": 1e-15, "maxcor": 20},
    )
    theta = res.x
    f, grad = neg(theta)
    meg, utility = -f, np.array(utility_of(theta))
    if meg < 0.0:  # theta = 0 (the uniform policy, MEG 0) is in every class
        meg, utility, theta = 0.0, np.zeros((h, n_s)), np.zeros_like(theta)
        grad = neg(theta)[1]
    return UnknownUtilityMEG(
        meg=float(meg),
        utility=utility,
        weights=theta,
        converged=bool(res.success),
        iterations=int(res.nit),
        feature_residual=float(np.max(np.abs(grad))),
        upper_bound=float(upper_bound),
        method="concave-lbfgs",
    )
