"""Vectorised backward passes behind :mod:`goalprobe.probes.scoring.meg` (plain numpy arrays).

A :class:`Problem` is a batch of ``B`` finite-horizon MDPs laid out action-major, ``(A, B, S)``
(reductions over actions are elementwise between contiguous slices), sorted by horizon, longest
first; passes run in steps-to-go ``k = H_b - 1 - t``, touching only the MDPs with ``H_b > k``.

Soft value iteration works on ``Lambda_t = beta V^soft_t``: ``Lambda_t(s) = beta U_t(s) +
logsumexp_a X_t(s, a)``, ``X_t(s, a) = E[Lambda_{t+1}(S') | s, a]``; the soft policy is
``softmax_a X_t(s, .)``. The pass also carries ``G_t = dLambda_t / dbeta`` and the causal variance
``K_t = dG_t / dbeta = sum_a pi (C_a - G_bar)^2 + sum_a pi E[K_{t+1} | s, a]`` (``C_a =
E[G_{t+1} | s, a]``), so ``f(beta) = beta E_pi[U] - E[Lambda_0] + H log A`` has ``f' = E_pi[U] -
E[G_0]`` and ``f'' = -E[K_0] <= 0``, which :func:`solve_beta`'s safeguarded Newton uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TIE_RTOL = 1e-9
"""Relative tolerance (of the utility range times the horizon) under which two action values or
two expected utilities count as equal: ties of argmax / argmin sets, optimality of a policy."""


class DenseDynamics:
    """Stochastic transitions, given ``(B, S, A, S)``; stored ``(A, B, S, S)``. Both dynamics
    give ``expect(values (B, S), n) -> (A, n, S)``, ``E[values(S') | s, a]`` for the first ``n``
    MDPs; ``push(weights (A, B, S)) -> (B, S)`` next-state masses; ``take(idx)``, a sub-batch."""

    def __init__(self, transitions: np.ndarray) -> None:
        self.p = transitions
        self._p_abss = np.ascontiguousarray(transitions.transpose(2, 0, 1, 3))

    def expect(self, values: np.ndarray, n: int) -> np.ndarray:
        return np.matmul(self._p_abss[:, :n], values[None, :n, :, None])[..., 0]

    def push(self, weights: np.ndarray) -> np.ndarray:
        return np.einsum("abs,abst->bt", weights, self._p_abss)

    def take(self, idx: np.ndarray) -> DenseDynamics:
        return DenseDynamics(self.p[idx])


class DeterministicDynamics:
    """Deterministic successors, given ``(B, S, A)`` indices: expectations are gathers."""

    def __init__(self, next_state: np.ndarray) -> None:
        self.next_state = next_state
        n_b, n_s, _ = next_state.shape
        offsets = (np.arange(n_b) * n_s)[None, :, None]
        self._flat = np.ascontiguousarray(next_state.transpose(2, 0, 1)).astype(np.intp) + offsets
        self._size = n_b * n_s

    def expect(self, values: np.ndarray, n: int) -> np.ndarray:
        return np.take(values.reshape(-1), self._flat[:, :n])

    def push(self, weights: np.ndarray) -> np.ndarray:
        out = np.bincount(self._flat.reshape(-1), weights=weights.reshape(-1), minlength=self._size)
        return out.reshape(weights.shape[1:])

    def take(self, idx: np.ndarray) -> DeterministicDynamics:
        return DeterministicDynamics(self.next_state[idx])


Dynamics = DenseDynamics | DeterministicDynamics
"""Transition operators of a batch."""


@dataclass(frozen=True, eq=False)
class Problem:
    """A batch of MDPs sorted by horizon (longest first): transition operators ``dyn``, ``A``
    actions, ``(B, S)`` initial distributions, non-increasing ``(B,)`` horizons, ``(1 | H, B,
    S)`` utilities (stationary, or time-indexed with a common horizon) and ``(1 | H, A, B, S)``
    policies laid out alike (or None)."""

    dyn: Dynamics
    n_actions: int
    initial: np.ndarray
    horizon: np.ndarray
    utility: np.ndarray
    policy: np.ndarray | None

    def __post_init__(self) -> None:
        if np.any(np.diff(self.horizon) > 0):
            raise ValueError("Problem needs horizons sorted longest first")

    @property
    def n_batch(self) -> int:
        return int(self.initial.shape[0])

    def n_active(self, k: int) -> int:
        """How many (leading) MDPs still have a decision ``k`` steps before their end."""
        return int(np.count_nonzero(self.horizon > k))

    def utility_at(self, k: int, n: int) -> np.ndarray:
        """``(n, S)``: ``U_t`` at steps-to-go ``k`` of the first ``n`` MDPs."""
        u = self.utility
        return u[0, :n] if u.shape[0] == 1 else u[u.shape[0] - 1 - k, :n]

    def policy_at(self, k: int, n: int) -> np.ndarray:
        """``(A, n, S)``: the scored policy at steps-to-go ``k`` of the first ``n`` MDPs."""
        p = self.policy
        if p is None:
            raise ValueError("this problem holds no policy to score")
        return p[0, :, :n] if p.shape[0] == 1 else p[p.shape[0] - 1 - k, :, :n]

    def take(self, idx: np.ndarray) -> Problem:
        """The sub-batch ``idx`` (must be increasing, to stay sorted)."""
        return Problem(
            self.dyn.take(idx),
            self.n_actions,
            self.initial[idx],
            self.horizon[idx],
            self.utility[:, idx],
            None if self.policy is None else self.policy[:, :, idx],
        )

    def utility_scale(self) -> np.ndarray:
        """``(B,)``: range of the utility over states and steps, times the horizon."""
        u = self.utility
        flat = u.transpose(1, 0, 2).reshape(u.shape[1], -1)
        return (flat.max(axis=1) - flat.min(axis=1)) * self.horizon


def make_problem(
    initial: np.ndarray,
    horizon: np.ndarray,
    utility: np.ndarray,
    policy: np.ndarray | None,
    *,
    transitions: np.ndarray | None = None,
    next_state: np.ndarray | None = None,
) -> tuple[Problem, np.ndarray]:
    """Sort a batch (``initial (B, S)``, ``horizon (B,)``, ``utility (B, 1 | H, S)``, ``policy (B, 1
    | H, S, A)`` or None, ``transitions`` or ``next_state``) by horizon and lay it out
    action-major; returns ``(problem, order)`` (results come back in ``order``)."""
    order = np.argsort(-horizon, kind="stable")
    dyn: Dynamics
    if next_state is not None:
        dyn = DeterministicDynamics(next_state[order])
        n_a = next_state.shape[2]
    elif transitions is not None:
        dyn = DenseDynamics(transitions[order])
        n_a = transitions.shape[2]
    else:
        raise ValueError("give transitions or next_state")
    u = np.ascontiguousarray(utility[order].transpose(1, 0, 2))
    p = None if policy is None else np.ascontiguousarray(policy[order].transpose(1, 3, 0, 2))
    return Problem(dyn, n_a, initial[order], horizon[order], u, p), order


def _read_out(prob: Problem, k: int, n: int, out: np.ndarray, values: tuple) -> None:
    """``out[i] = E[values[i](S_0)]`` for the MDPs (a slice of the active prefix ``n``) whose
    decision ``t = 0`` is at steps-to-go ``k``."""
    sl = slice(prob.n_active(k + 1), n)
    for row, v in zip(out, values, strict=True):
        row[sl] = np.einsum("bs,bs->b", prob.initial[sl], v[sl])


@dataclass(frozen=True)
class SoftPass:
    """Result of :func:`soft_pass`, ``(B,)`` each: ``log_z = E[Lambda_0(S_0)]``, ``eu = E_beta[U]``,
    ``curvature = E[K_0(S_0)] = dE_beta[U] / dbeta`` (zeros unless requested), and when recorded
    (common horizon) ``logits`` ``(H, A, B, S)`` (``X_t``) and ``lam`` ``(H, B, S)``."""

    log_z: np.ndarray
    eu: np.ndarray
    curvature: np.ndarray
    logits: np.ndarray | None = None
    lam: np.ndarray | None = None


def soft_pass(
    prob: Problem, beta: np.ndarray, *, curvature: bool = False, record: bool = False
) -> SoftPass:
    """Soft value iteration at finite ``beta: (B,)`` (see the module docstring)."""
    n_b, n_s = prob.initial.shape
    n_a = prob.n_actions
    lam = np.zeros((n_b, n_s))
    g = np.zeros((n_b, n_s))
    kk = np.zeros((n_b, n_s))
    out = np.zeros((3, n_b))  # E[Lambda_0], E[G_0], E[K_0]
    rec_x, rec_lam = [], []
    for k in range(int(prob.horizon[0])):
        n = prob.n_active(k)
        u = prob.utility_at(k, n)
        if k == 0:
            x = np.zeros((n_a, n, n_s))
            lam[:n] = beta[:n, None] * u + np.log(n_a)
            g[:n] = u
            kk[:n] = 0.0
        else:
            x = prob.dyn.expect(lam, n)
            c = prob.dyn.expect(g, n)
            ck = prob.dyn.expect(kk, n) if curvature else None
            m = x.max(axis=0)
            z = np.exp(x - m)
            zs = z.sum(axis=0)
            z /= zs  # the soft policy, (A, n, S)
            g_bar = np.einsum("abs,abs->bs", z, c)
            lam[:n] = beta[:n, None] * u + m + np.log(zs)
            g[:n] = u + g_bar
            if curvature:
                c -= g_bar
                c *= c
                c += ck
                kk[:n] = np.einsum("abs,abs->bs", z, c)
        if record:
            rec_x.append(x)
            rec_lam.append(lam[:n].copy())
        _read_out(prob, k, n, out, (lam, g, kk))
    log_z, eu, curv = out
    if record:
        return SoftPass(log_z, eu, curv, np.stack(rec_x[::-1]), np.stack(rec_lam[::-1]))
    return SoftPass(log_z, eu, curv)


@dataclass(frozen=True)
class LimitPass:
    """Result of :func:`limit_pass`, ``(B,)`` each: ``eu``, the (anti-)optimal expected utility;
    ``log_z = E[W_0(S_0)]`` (a policy taking only optimal actions has predictive accuracy ``H log
    A - log_z``); ``off``, the probability that the scored policy ever leaves the set; when
    recorded, ``(H, A, B, S)`` Q-values ``q`` and action sets ``in_set``, and ``(H, B, S)``
    entropies ``w``."""

    eu: np.ndarray
    log_z: np.ndarray
    off: np.ndarray
    q: np.ndarray | None = None
    in_set: np.ndarray | None = None
    w: np.ndarray | None = None


def limit_pass(prob: Problem, sign: float, *, record: bool = False) -> LimitPass:
    """The ``beta -> sign * inf`` limit of the soft-optimal policies.

    The limit is the maximum-causal-entropy policy among the optimal (``sign=+1``) or
    anti-optimal (``-1``) ones: ``pi_t(a | s) = exp(E[W_{t+1}(S') | s, a] - W_t(s))`` on the set
    ``A*_t(s)`` of optimal actions and 0 elsewhere, ``W_t(s) = log sum_{a in A*_t(s)}
    exp(E[W_{t+1}(S') | s, a])``, ``W_H = 0``. For one decision it is uniform over the argmax set;
    over several it favours actions that keep more optimal continuations open, exactly as
    ``lim pi^soft_beta`` does (``beta Q^soft = beta Q* + E[W_{t+1}] + o(1)`` on optimal actions).
    Actions whose values are within ``TIE_RTOL`` of the utility scale count as tied.
    """
    n_b, n_s = prob.initial.shape
    n_a = prob.n_actions
    tol = TIE_RTOL * prob.utility_scale()
    v = np.zeros((n_b, n_s))
    w = np.zeros((n_b, n_s))
    off = np.zeros((n_b, n_s))
    out = np.zeros((3, n_b))  # E[V_0], E[W_0], P(off)
    recs = []
    for k in range(int(prob.horizon[0])):
        n = prob.n_active(k)
        u = prob.utility_at(k, n)
        if k == 0:
            q = np.broadcast_to(u, (n_a, n, n_s))
            in_set = np.ones((n_a, n, n_s), dtype=bool)
            v[:n] = u
            w[:n] = np.log(n_a)
        else:
            q = u + prob.dyn.expect(v, n)
            best = q.max(axis=0) if sign > 0 else q.min(axis=0)
            in_set = sign * (q - best) >= -tol[:n, None]
            ew = np.where(in_set, prob.dyn.expect(w, n), -np.inf)
            m = ew.max(axis=0)
            v[:n] = best
            w[:n] = m + np.log(np.exp(ew - m).sum(axis=0))
        if prob.policy is not None:
            pi = prob.policy_at(k, n)
            miss = np.einsum("abs,abs->bs", pi, ~in_set)
            if k > 0:
                miss += np.einsum("abs,abs->bs", pi, prob.dyn.expect(off, n))
            off[:n] = miss
        if record:
            recs.append((np.array(q), in_set, w[:n].copy()))
        _read_out(prob, k, n, out, (v, w, off))
    if record:
        q_all, in_all, w_all = (np.stack(r[::-1]) for r in zip(*recs, strict=True))
        return LimitPass(out[0], out[1], out[2], q_all, in_all, w_all)
    return LimitPass(out[0], out[1], out[2])


def policy_values(prob: Problem) -> tuple[np.ndarray, np.ndarray]:
    """``(E_pi[U], E_uniform[U])``, both ``(B,)``, by backward policy evaluation."""
    n_b, n_s = prob.initial.shape
    g_pi = np.zeros((n_b, n_s))
    g_unif = np.zeros((n_b, n_s))
    out = np.zeros((2, n_b))
    for k in range(int(prob.horizon[0])):
        n = prob.n_active(k)
        u = prob.utility_at(k, n)
        if k == 0:
            g_pi[:n] = u
            g_unif[:n] = u
        else:
            g_pi[:n] = u + np.einsum("abs,abs->bs", prob.policy_at(k, n), prob.dyn.expect(g_pi, n))
            g_unif[:n] = u + prob.dyn.expect(g_unif, n).mean(axis=0)
        _read_out(prob, k, n, out, (g_pi, g_unif))
    return out[0], out[1]


def forward_occupancy(prob: Problem, policy: np.ndarray) -> np.ndarray:
    """``(H, B, S)`` distributions of ``S_0 .. S_{H-1}`` under ``policy (H, A, B, S)``."""
    d = [prob.initial]
    for t in range(policy.shape[0] - 1):
        d.append(prob.dyn.push(d[-1][None] * policy[t]))
    return np.stack(d)


_GROWTH = 8.0
"""Largest factor by which one step of :func:`solve_beta` may grow ``|beta|`` (or ``1 / scale``)."""

_BETA_CAP = 1e15
"""Largest ``|beta| * utility range`` :func:`solve_beta` evaluates: beyond it soft-optimal policies
equal their limit to machine precision."""


@dataclass(frozen=True)
class BetaSolution:
    """Result of :func:`solve_beta`, ``(B,)`` each: the maximiser ``beta`` (the best evaluated point
    where not ``converged``), ``f(beta)``, ``eu = E_beta[U]`` and the soft passes ``n_evals``."""

    beta: np.ndarray
    f: np.ndarray
    eu: np.ndarray
    converged: np.ndarray
    n_evals: np.ndarray


def solve_beta(
    prob: Problem,
    target: np.ndarray,
    g0: np.ndarray,
    k0: np.ndarray,
    scale: np.ndarray,
    *,
    xrtol: float,
    max_iter: int = 200,
) -> BetaSolution:
    """Maximise ``f(beta) = beta target - E[Lambda_0] + H log A`` per MDP: solve ``E_beta[U] =
    target``.

    Works in ``x = sign(g0) beta >= 0``, where ``h(x) = sign (target - E_{sign x}[U])`` is
    positive at 0 and non-increasing, ``h'(x) = -K``. Safeguarded Newton (Numerical Recipes'
    ``rtsafe``, vectorised): the Newton proposal, capped at ``8 max(x, 1 / scale)`` (``K`` can be
    ~1e-20), when strictly inside the bracket ``(lo, hi)``; otherwise that cap (no upper end yet)
    or bisection (geometric when the bracket spans more than a factor 4). An MDP whose ``|beta| *
    scale`` would exceed ``1e15`` without a bracket stops unconverged at its best point.

    ``target``: ``(B,)`` ``E_pi[U]``; ``g0``: ``E_pi[U] - E_uniform[U]`` (non-zero); ``k0``:
    ``K`` at ``beta = 0``; ``scale``: the attainable utility range (positive); ``xrtol``:
    relative tolerance on ``beta`` (also converged when ``|h| <= 1e-13 scale``)."""
    n_b = prob.n_batch
    const = prob.horizon * np.log(prob.n_actions)
    sign = np.sign(g0)
    x = np.zeros(n_b)
    h = np.abs(g0)
    dh = k0.copy()  # -h'(x) >= 0
    lo, hi = np.zeros(n_b), np.full(n_b, np.inf)
    best_x, best_f, best_eu = np.zeros(n_b), np.zeros(n_b), target - g0
    converged = np.zeros(n_b, dtype=bool)
    n_evals = np.zeros(n_b, dtype=np.int64)
    active = np.ones(n_b, dtype=bool)
    for _ in range(max_iter):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        xi, hi_i, lo_i = x[idx], hi[idx], lo[idx]
        reach = _GROWTH * np.maximum(xi, 1.0 / scale[idx])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            prop = np.minimum(xi + h[idx] / dh[idx], reach)
        inside = np.isfinite(prop) & (prop > lo_i) & (prop < hi_i)
        wide = (lo_i > 0) & (hi_i > 4.0 * lo_i)
        with np.errstate(invalid="ignore"):
            bisect = np.where(wide, np.sqrt(lo_i * hi_i), 0.5 * (lo_i + hi_i))
        x_new = np.where(inside, prop, np.where(np.isinf(hi_i), reach, bisect))
        hopeless = x_new * scale[idx] > _BETA_CAP
        if np.any(hopeless):
            active[idx[hopeless]] = False
            keep = ~hopeless
            idx, x_new, inside = idx[keep], x_new[keep], inside[keep]
            xi, hi_i, lo_i = xi[keep], hi_i[keep], lo_i[keep]
            if idx.size == 0:
                break
        sub = prob if idx.size == n_b else prob.take(idx)
        res = soft_pass(sub, sign[idx] * x_new, curvature=True)
        n_evals[idx] += 1
        f_new = sign[idx] * x_new * target[idx] - res.log_z + const[idx]
        better = f_new > best_f[idx]
        best_x[idx] = np.where(better, x_new, best_x[idx])
        best_f[idx] = np.where(better, f_new, best_f[idx])
        best_eu[idx] = np.where(better, res.eu, best_eu[idx])
        h_new = sign[idx] * (target[idx] - res.eu)
        pos = h_new > 0
        lo[idx] = np.where(pos, x_new, lo_i)
        hi[idx] = np.where(pos, hi_i, x_new)
        done = (
            (np.abs(h_new) <= 1e-13 * scale[idx])
            | (inside & (np.abs(x_new - xi) <= xrtol * x_new))
            | (np.isfinite(hi[idx]) & (hi[idx] - lo[idx] <= xrtol * hi[idx]))
        )
        x[idx], h[idx], dh[idx] = x_new, h_new, res.curvature
        converged[idx] = done
        active[idx] = ~done
        # at convergence report the final point (f is flat there; it is the best up to rounding)
        fin = idx[done]
        best_x[fin], best_f[fin], best_eu[fin] = x_new[done], f_new[done], res.eu[done]
    return BetaSolution(sign * best_x, best_f, best_eu, converged, n_evals)
