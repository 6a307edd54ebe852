"""Unknown-utility MEG (Definition 4.3 of MacDermott et al., NeurIPS 2024): the supremum of
known-utility MEG over all utility functions of the state, solved as a concave
maximum-causal-entropy dual (conventions of :mod:`goalprobe.probes.scoring.meg`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from goalprobe.probes.scoring import meg_engine as engine
from goalprobe.probes.scoring.meg import (
    TabularMDP,
    _cross_entropy_term,
    _single,
    _time_indexed,
    state_occupancy,
)
from scipy.optimize import minimize
from scipy.special import logsumexp

__all__ = ["UnknownUtilityMEG", "unknown_utility_meg"]


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


class _MaxEntObjective:
    """``f(U) = E_pi[sum_t U_t(S_t)] - E[Lambda_0(S_0)] + H log|A|`` and its gradient
    ``d_pi - d_U`` (``(H, S)`` state occupancies: feature matching) for ``beta = 1``."""

    def __init__(self, mdp: TabularMDP, policy: np.ndarray) -> None:
        self.base = _single(mdp, np.zeros(mdp.n_states), policy)
        self.occ_pi = state_occupancy(mdp, policy)
        self.const = mdp.horizon * np.log(mdp.n_actions)
        pol = _time_indexed(np.asarray(policy, dtype=np.float64), mdp.horizon)
        with np.errstate(divide="ignore"):
            self.upper_bound = _cross_entropy_term(self.occ_pi, pol, np.log(pol)) + self.const

    def __call__(self, u: np.ndarray) -> tuple[float, np.ndarray]:
        """``u: (H, S)`` -> ``(f, grad (H, S))``."""
        b = self.base
        prob = engine.Problem(b.dyn, b.n_actions, b.initial, b.horizon, u[:, None], None)
        res = engine.soft_pass(prob, np.ones(1), record=True)
        x = res.logits  # (H, A, 1, S)
        pol = np.exp(x - logsumexp(x, axis=1, keepdims=True))
        occ = engine.forward_occupancy(prob, pol)[:, 0]
        f = float(np.sum(self.occ_pi * u) - res.log_z[0] + self.const)
        return f, self.occ_pi - occ


def unknown_utility_meg(
    mdp: TabularMDP, policy: np.ndarray, *, max_iter: int = 2000, gtol: float = 1e-10
) -> UnknownUtilityMEG:
    """MEG over every utility function of the state, ``U(s)`` (Definition 4.3), solved exactly.

    ``beta U`` ranges over the same class, so ``theta = U`` with ``beta = 1``; ``f(theta)`` is
    concave (the dual of maximum-causal-entropy IRL) with exact gradient ``d_pi - d_theta``, so
    L-BFGS (``max_iter``, ``gtol``) reaches the global supremum. The value is ``f`` at the
    returned utility: a certified lower bound, approached from below when the supremum needs
    ``|theta| -> inf`` (e.g. deterministic policies)."""
    obj = _MaxEntObjective(mdp, policy)
    n_s, h = mdp.n_states, mdp.horizon

    def utility_of(theta: np.ndarray) -> np.ndarray:
        return np.broadcast_to(theta, (h, n_s))

    def neg(theta: np.ndarray) -> tuple[float, np.ndarray]:
        f, grad_u = obj(utility_of(theta))
        return -f, -grad_u.sum(axis=0)

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
        upper_bound=float(obj.upper_bound),
        method="concave-lbfgs",
    )
