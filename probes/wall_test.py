"""The conditional wall test: does an activation say more about a grid's walls than its size and
density do? In two frames: absolute cells, and cells at an offset from the agent.

**Probe.** :class:`ConditionalWallProbe`: per-cell logistic regressions with the prior given the
grid's size and density as logit offset,
``logit P(wall at p | act) = logit prior_p(size, density) + act . w_p + b_p``, the L2 penalty
chosen on validation *grids* carved from the training grids. ``frame="absolute"``: one head per
canvas cell; ``frame="agent"``: one per offset from the agent's cell (:data:`OFFSETS`).

**Statistic.** On the *prior-uncertain* cells only (not fixed by size and density, as the border
or the maze lattice are): held-out bits per cell (the prior's cross-entropy minus the model's),
with the within-grid AUC and the accuracy as companions.

**Null.** The same probe fitted on the anchors of another training grid of the same size and
density (:func:`null_inputs`), so probe minus null isolates what is about *this* grid. Intervals
resample test grids (:class:`goalprobe.stats.GridBootstrap`); *detected*: the intervals of the
bits and of the within-grid AUC of probe minus null both lie above 0.

Input: ``X = wall_inputs(acts, grid_sizes, densities, agent_row_col)`` (anchors, then ``[size,
density, agent row, agent col]``; the *decoded* agent cell when decoding), ``y`` the ``(N, S,
S)`` ``CellType`` maps, so the estimator keeps scikit-learn's ``fit(X, y)``/``predict_proba(X)``.

**Read-out** (:func:`wall_readout`): what the probes stage writes for one store, stage and layer
(JSON-ready; the stage does the I/O), ``wall_readout(data, split, power=...)``.
``result["frames"][frame]`` holds the conditional test and ``result["verdicts"][frame]`` the
verdict a headline prints (:func:`wall_verdict`): ``"yes"`` (detected), ``"no"`` (not detected,
and the power curve shows this design detects an effect the interval excludes) or
``"undecided"`` (not detected, and no power shown that would make a "no" mean anything).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import scipy.optimize
import scipy.special
from goalprobe.gridworld.core import CellType
from goalprobe.probes.families import store_params
from goalprobe.probes.splits import carve_validation, shuffle_by_grid
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.metrics import roc_auc_score
from sklearn.utils.validation import check_is_fitted

from goalprobe.stats import Estimate, GridBootstrap, grid_mean

if TYPE_CHECKING:
    from goalprobe.probes.probe_sweep import ProbeData
    from goalprobe.probes.splits import GridSplit

Frame = Literal["absolute", "agent"]
"""Which cells a probe's heads read: canvas cells, or offsets from the agent's cell."""

N_COVARIATES = 4
"""Trailing columns of :func:`wall_inputs`: grid size, density, agent row, agent column."""

_DENSITY_DECIMALS = 3
_LOG2 = np.log(2.0)


def offsets(radius: int = 3) -> np.ndarray:
    """``(P, 2)`` int64 offsets ``(dr, dc)`` with ``1 <= max(|dr|, |dc|) <= radius``, ring by
    ring (:func:`rings`: steps from A), row-major within a ring."""
    grid = [
        (dr, dc)
        for dr in range(-radius, radius + 1)
        for dc in range(-radius, radius + 1)
        if (dr, dc) != (0, 0)
    ]
    grid.sort(key=lambda o: abs(o[0]) + abs(o[1]))
    return np.asarray(grid, dtype=np.int64).reshape(-1, 2)


OFFSETS = offsets(3)
"""The agent-centred heads: the 48 offsets of the 7 x 7 box around the agent."""


def rings(offs: np.ndarray) -> np.ndarray:
    """``(P,)`` ring of each offset: its distance in steps from the agent, ``|dr| + |dc|``."""
    return np.abs(np.asarray(offs)).sum(axis=1)


def wall_inputs(
    acts: np.ndarray,
    grid_sizes: np.ndarray,
    densities: np.ndarray,
    agent_row_col: np.ndarray,
) -> np.ndarray:
    """``(N, F + 4)`` float64 input of the wall probes: flattened ``acts`` ``(N, ...)`` then
    ``[size, density, agent row, agent col]`` (the agent cell: true for fitting and scoring,
    decoded for decoding)."""
    a = np.asarray(acts, dtype=np.float64).reshape(len(acts), -1)
    cov = np.column_stack(
        [
            np.asarray(grid_sizes, dtype=np.float64).reshape(-1),
            np.asarray(densities, dtype=np.float64).reshape(-1),
            np.asarray(agent_row_col, dtype=np.float64).reshape(-1, 2),
        ]
    )
    if cov.shape[0] != a.shape[0]:
        raise ValueError(f"acts has {a.shape[0]} rows, the covariates {cov.shape[0]}")
    if not np.all(np.isfinite(cov[:, 0])) or (cov[:, 0] < 1).any():
        raise ValueError("grid_sizes must be positive")
    return np.concatenate([a, cov], axis=1)


def _split_inputs(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] <= N_COVARIATES:
        raise ValueError(f"X must be (N, F + {N_COVARIATES}) from wall_inputs, got {X.shape}")
    sizes = X[:, -4].astype(np.int64)
    return X[:, :-N_COVARIATES], sizes, X[:, -3], X[:, -2:].astype(np.int64)


def group_codes(grid_sizes: np.ndarray, densities: np.ndarray) -> np.ndarray:
    """``(N,)`` str ``"size/density"`` of each row (the null's strata)."""
    d = np.round(np.asarray(densities, dtype=np.float64), _DENSITY_DECIMALS)
    return np.asarray([f"{int(s)}/{x:g}" for s, x in zip(grid_sizes, d, strict=True)])


class WallPrior(BaseEstimator):
    """Per-cell wall frequency of the training grids of the same size and density (backing off
    to the size, then to every grid, when a group is unseen): ``(k + 1/2) / (n + 1)`` where the
    group's cell varies, exactly 0 or 1 where it does not (*fixed*), fixed open outside the grid.

    Fitted attributes: ``freq_`` (group key -> ``(S, S)`` frequency), ``count_``, ``side_``.
    """

    def fit(self, X: np.ndarray, y: np.ndarray) -> WallPrior:
        """Count walls of ``y`` ``(N, S, S)`` per group of ``X`` (:func:`wall_inputs`)."""
        _, sizes, dens, _ = _split_inputs(X)
        walls = np.asarray(y) == CellType.WALL
        self.side_ = int(walls.shape[1])
        sums: dict[tuple, np.ndarray] = {}
        counts: dict[tuple, int] = {}
        for row, key_list in enumerate(self._keys(sizes, dens)):
            for key in key_list:
                sums[key] = sums.get(key, 0) + walls[row]
                counts[key] = counts.get(key, 0) + 1
        self.freq_ = {k: sums[k] / counts[k] for k in sums}
        self.count_ = counts
        return self

    @staticmethod
    def _keys(sizes: np.ndarray, dens: np.ndarray) -> list[list[tuple]]:
        d = np.round(dens, _DENSITY_DECIMALS)
        return [
            [("sd", int(s), float(x)), ("s", int(s)), ("all",)]
            for s, x in zip(sizes.tolist(), d.tolist(), strict=True)
        ]

    def proba(self, X: np.ndarray, *, smooth_fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(prob (N, S, S) float64, uncertain (N, S, S) bool)`` of each row's group.

        ``smooth_fixed``: every grid cell gets the smoothed frequency and counts as uncertain, so
        a read-out can move it (decoding a false-belief grid, off the generator's distribution).
        """
        check_is_fitted(self, "freq_")
        _, sizes, dens, _ = _split_inputs(X)
        side = self.side_
        prob = np.zeros((len(sizes), side, side))
        uncertain = np.zeros((len(sizes), side, side), dtype=bool)
        for row, key_list in enumerate(self._keys(sizes, dens)):
            key = next(k for k in key_list if k in self.freq_)
            f, n = self.freq_[key], self.count_[key]
            inside = np.zeros((side, side), dtype=bool)
            inside[: sizes[row], : sizes[row]] = True
            varies = inside if smooth_fixed else (f > 0) & (f < 1)
            p = np.where(varies, (f * n + 0.5) / (n + 1), f)
            prob[row] = np.where(inside, p, 0.0)
            uncertain[row] = varies & inside
        return prob, uncertain


def frame_cells(
    frame: Frame, side: int, agent_row_col: np.ndarray, radius: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """``(flat (N, P) int64 canvas index, inside (N, P) bool)`` of the cells each head reads:
    every canvas cell (``absolute``), or the agent's cell plus each offset (``agent``; False
    where it falls off the canvas)."""
    agent = np.asarray(agent_row_col, dtype=np.int64).reshape(-1, 2)
    n = agent.shape[0]
    if frame == "absolute":
        flat = np.broadcast_to(np.arange(side * side), (n, side * side)).copy()
        return flat, np.ones(flat.shape, dtype=bool)
    if frame != "agent":
        raise ValueError(f"frame must be 'absolute' or 'agent', got {frame!r}")
    offs = offsets(radius)
    r = agent[:, :1] + offs[None, :, 0]
    c = agent[:, 1:] + offs[None, :, 1]
    inside = (r >= 0) & (r < side) & (c >= 0) & (c < side)
    flat = np.where(inside, np.clip(r, 0, side - 1) * side + np.clip(c, 0, side - 1), 0)
    return flat, inside


def _gather(maps: np.ndarray, flat: np.ndarray) -> np.ndarray:
    return np.take_along_axis(maps.reshape(len(maps), -1), flat, axis=1)


def _loss_grad(theta, Z, offset, target, mask, lam):
    """Mean-over-rows logistic loss (nats) of the masked entries plus ``lam/2 ||W||^2``."""
    F, P = Z.shape[1], offset.shape[1]
    W = theta[: F * P].reshape(F, P)
    b = theta[F * P :]
    logit = offset + Z @ W + b
    n = Z.shape[0]
    loss = np.sum(mask * (np.logaddexp(0.0, logit) - target * logit)) / n
    resid = mask * (scipy.special.expit(logit) - target) / n
    gW = Z.T @ resid + lam * W
    gb = resid.sum(axis=0)
    return loss + 0.5 * np.sum(lam * W * W), np.concatenate([gW.ravel(), gb])


def fit_offset_logistic(
    Z: np.ndarray,
    offset: np.ndarray,
    target: np.ndarray,
    mask: np.ndarray,
    lam: float | np.ndarray,
    *,
    theta0: np.ndarray | None = None,
    max_iter: int = 300,
    tol: float = 1e-6,
) -> np.ndarray:
    """Independent L2-penalised logistic regressions (one per column) with a fixed logit offset,
    fitted jointly by L-BFGS; returns ``theta``: ``W (F, P)`` then ``b (P,)``, flattened.

    ``Z (N, F)`` standardised features, ``offset (N, P)`` prior logits, ``target (N, P)`` 0/1,
    ``mask (N, P)`` the entries that count, ``lam`` the penalty on ``W`` (one, or ``(P,)``),
    ``theta0`` a warm start. A column with no counted entry has optimum 0 and is left out of
    the optimisation (the other columns' iterates do not change).
    """
    F, P = Z.shape[1], offset.shape[1]
    active = np.flatnonzero(np.asarray(mask).any(axis=0))
    lam = np.asarray(lam, dtype=np.float64)
    lam_active = lam[active] if lam.ndim else lam
    full0 = np.zeros(F * P + P) if theta0 is None else np.asarray(theta0, dtype=np.float64)
    W0, b0 = full0[: F * P].reshape(F, P), full0[F * P :]
    x0 = np.concatenate([W0[:, active].ravel(), b0[active]])
    columns = [np.asarray(a)[:, active].astype(np.float64) for a in (offset, target, mask)]
    res = scipy.optimize.minimize(
        _loss_grad,
        x0,
        args=(Z, *columns, lam_active),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "gtol": tol},
    )
    A = active.size
    W, b = np.zeros((F, P)), np.zeros(P)
    W[:, active] = res.x[: F * A].reshape(F, A)
    b[active] = res.x[F * A :]
    return np.concatenate([W.ravel(), b])


def _logit(p: np.ndarray) -> np.ndarray:
    return scipy.special.logit(np.clip(p, 1e-6, 1 - 1e-6))


class ConditionalWallProbe(ClassifierMixin, BaseEstimator):
    """Per-cell (or per-offset) logistic wall probe with the size-and-density prior as offset.

    Parameters as :class:`WallTestConfig`. ``alphas`` is a warm-started path, largest first,
    that stops once no group's validation loss improves; each group of heads
    (:meth:`penalty_groups`) takes its best penalty, then all heads are refitted on all
    training grids.

    Fitted attributes: ``prior_`` (:class:`WallPrior`), ``mean_``/``scale_``, ``coef_ (F, P)``,
    ``intercept_ (P,)``, ``alpha_`` (``(P,)`` per head, or the one penalty given),
    ``validation_loss_`` (penalty -> validation nats per uncertain entry), ``classes_``
    (``[False, True]``: wall), ``n_features_in_``.
    """

    def __init__(
        self,
        frame: Frame = "absolute",
        radius: int = 3,
        alphas: Sequence[float] = (100.0, 30.0, 10.0, 3.0, 1.0, 0.3, 0.1, 0.03, 0.01, 0.003),
        validation_fraction: float = 0.2,
        max_iter: int = 300,
        random_state: int = 0,
    ) -> None:
        store_params(self, locals())

    def frame_targets(self, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(wall (N, P) bool, uncertain (N, P) bool)``: each head's cell's wall status, and
        whether it counts (prior-uncertain and on the canvas). Needs the fitted prior."""
        _, _, _, agent = _split_inputs(X)
        walls = np.asarray(y) == CellType.WALL
        _, uncertain = self.prior_.proba(X)
        flat, inside = frame_cells(self.frame, walls.shape[1], agent, self.radius)
        return _gather(walls, flat) & inside, _gather(uncertain, flat) & inside

    def prior_proba(
        self, X: np.ndarray, *, smooth_fixed: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(prob (N, P), uncertain (N, P))``: the prior at each head's cell (0 off the
        canvas; ``smooth_fixed``: :meth:`WallPrior.proba`'s)."""
        check_is_fitted(self, "prior_")
        _, _, _, agent = _split_inputs(X)
        prob, uncertain = self.prior_.proba(X, smooth_fixed=smooth_fixed)
        flat, inside = frame_cells(self.frame, prob.shape[1], agent, self.radius)
        return _gather(prob, flat) * inside, _gather(uncertain, flat) & inside

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None):
        """Fit the prior and the heads on ``X`` (:func:`wall_inputs`), ``y`` ``(N, S, S)``;
        ``groups``: each row's grid id (required to choose the penalty on validation grids)."""
        acts, *_ = _split_inputs(X)
        alphas = [float(a) for a in self.alphas]
        if not alphas:
            raise ValueError("alphas must name at least one penalty")
        self.classes_ = np.array([False, True])
        self.n_features_in_ = np.asarray(X).shape[1]
        self.validation_loss_: dict[float, float] = {}
        if len(alphas) > 1:
            if groups is None:
                raise ValueError("groups (grid ids) are needed to choose the penalty by grid")
            rows, fraction = np.arange(len(acts)), self.validation_fraction
            fit_rows, val_rows = carve_validation(rows, groups, fraction, self.random_state)
            X_val, y_val = np.asarray(X)[val_rows], np.asarray(y)[val_rows]
            theta, best, chosen = None, np.array([np.inf]), np.array([np.nan])
            for alpha in alphas:
                theta = self._fit_rows(X, y, fit_rows, alpha, theta)
                logit = self.decision_function(X_val)
                target = self.frame_targets(X_val, y_val)[0]
                mask = self.prior_proba(X_val)[1]
                per_head = ((np.logaddexp(0.0, logit) - target * logit) * mask).sum(axis=0)
                self.validation_loss_[alpha] = float(per_head.sum() / max(mask.sum(), 1))
                heads = self.penalty_groups(len(per_head))
                nll = np.bincount(heads, weights=per_head)
                better = nll < best  # every group at the first penalty
                if not better.any():
                    break  # no head improves any more: smaller penalties overfit further
                best, chosen = np.where(better, nll, best), np.where(better, alpha, chosen)
            self.alpha_ = chosen[heads]
        else:
            self.alpha_ = alphas[0]
        self._fit_rows(X, y, np.arange(len(acts)), self.alpha_, None)
        return self

    def penalty_groups(self, n_heads: int) -> np.ndarray:
        """``(P,)`` int: the heads that share one penalty (the agent frame: a ring; the
        absolute frame: all cells, since choosing per cell on a few validation grids overfits
        the choice)."""
        if self.frame == "agent":
            return rings(offsets(self.radius)).astype(np.int64) - 1
        return np.zeros(n_heads, dtype=np.int64)

    def _fit_rows(self, X, y, rows, alpha, theta0):
        X_rows = np.asarray(X)[rows]
        acts, *_ = _split_inputs(X_rows)
        self.prior_ = WallPrior().fit(X_rows, np.asarray(y)[rows])
        self.mean_ = acts.mean(axis=0)
        self.scale_ = np.maximum(acts.std(axis=0), 1e-8)
        Z = (acts - self.mean_) / self.scale_
        target, mask = self.frame_targets(X_rows, np.asarray(y)[rows])
        prior, _ = self.prior_proba(X_rows)
        theta = fit_offset_logistic(
            Z, _logit(prior), target, mask, alpha, theta0=theta0, max_iter=self.max_iter
        )
        F, P = Z.shape[1], target.shape[1]
        self.coef_ = theta[: F * P].reshape(F, P)
        self.intercept_ = theta[F * P :]
        return theta

    def decision_function(self, X: np.ndarray, *, smooth_fixed: bool = False) -> np.ndarray:
        """``(N, P)`` wall logits (the prior's logit where the cell is fixed; ``smooth_fixed``:
        the read-out on every grid cell over the smoothed prior, :meth:`decode_proba`)."""
        check_is_fitted(self, "coef_")
        acts, *_ = _split_inputs(X)
        prior, uncertain = self.prior_proba(X, smooth_fixed=smooth_fixed)
        read = ((acts - self.mean_) / self.scale_) @ self.coef_ + self.intercept_
        return _logit(prior) + np.where(uncertain, read, 0.0)

    def predict_proba(self, X: np.ndarray, *, smooth_fixed: bool = False) -> np.ndarray:
        """``(N, P)`` wall probability of each head's cell (exactly the prior's 0 or 1 on
        fixed cells, 0 off the canvas; ``smooth_fixed`` as :meth:`decision_function`)."""
        prior, uncertain = self.prior_proba(X, smooth_fixed=smooth_fixed)
        logit = self.decision_function(X, smooth_fixed=smooth_fixed)
        return np.where(uncertain, scipy.special.expit(logit), prior)

    def decode_proba(self, X: np.ndarray) -> np.ndarray:
        """``(N, P)`` wall probability for decoding a believed map: the read-out over the
        smoothed prior on every grid cell (``smooth_fixed``), so a wall where the generator never
        draws one can be decoded; 0 outside the grid. The statistic never uses it."""
        return self.predict_proba(X, smooth_fixed=True)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``(N, P)`` bool: wall where the probability exceeds 1/2."""
        return self.predict_proba(X) > 0.5

    def _fitted_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """``(tensors, scalars)`` of the fitted state, for
        :func:`goalprobe.probes.serialization.save_probe` (the prior's groups as JSON keys)."""
        check_is_fitted(self, "coef_")
        keys = list(self.prior_.freq_)
        tensors = {
            "coef": self.coef_,
            "intercept": self.intercept_,
            "mean": self.mean_,
            "scale": self.scale_,
            "alpha": np.asarray(self.alpha_, dtype=np.float64).reshape(-1),
            "prior_freq": np.stack([np.asarray(self.prior_.freq_[k], np.float64) for k in keys]),
            "prior_count": np.asarray([self.prior_.count_[k] for k in keys], dtype=np.int64),
        }
        meta = {
            "prior_keys": [list(k) for k in keys],
            "prior_side": int(self.prior_.side_),
            "n_features_in_": int(self.n_features_in_),
            "validation_loss_": [[float(a), float(v)] for a, v in self.validation_loss_.items()],
        }
        return tensors, meta

    def _restore(self, tensors: dict[str, np.ndarray], meta: dict) -> None:
        keys = [tuple(k) for k in meta["prior_keys"]]
        prior = WallPrior()
        prior.freq_ = {k: tensors["prior_freq"][i] for i, k in enumerate(keys)}
        prior.count_ = {k: int(tensors["prior_count"][i]) for i, k in enumerate(keys)}
        prior.side_ = int(meta["prior_side"])
        self.prior_ = prior
        self.coef_, self.intercept_ = tensors["coef"], tensors["intercept"]
        self.mean_, self.scale_ = tensors["mean"], tensors["scale"]
        alpha = tensors["alpha"]
        self.alpha_ = float(alpha[0]) if alpha.size == 1 else alpha
        self.classes_ = np.array([False, True])
        self.n_features_in_ = int(meta["n_features_in_"])
        self.validation_loss_ = {float(a): float(v) for a, v in meta["validation_loss_"]}


def null_inputs(X: np.ndarray, grid_ids: np.ndarray, random_state: int = 0) -> np.ndarray:
    """``X`` whose anchors come from another grid of the same size and density (a derangement of
    grids within each stratum; a lone grid falls back to its size, then to a pool of all lone
    grids, and a pool of one joins the largest stratum). Covariates and labels stay the row's."""
    X = np.asarray(X, dtype=np.float64)
    _, sizes, dens, _ = _split_inputs(X)
    ids = np.asarray(grid_ids)
    strata = group_codes(sizes, dens)
    for coarser in (lambda s: s.split("/")[0], lambda s: "*"):
        grids_per = {s: len(np.unique(ids[strata == s])) for s in np.unique(strata)}
        strata = np.asarray(
            [s if grids_per[s] > 1 else coarser(s) for s in strata.tolist()], dtype=object
        ).astype(str)
    grids_per = {s: len(np.unique(ids[strata == s])) for s in np.unique(strata)}
    if grids_per.get("*") == 1 and len(grids_per) > 1:
        strata = np.where(strata == "*", max(grids_per, key=lambda s: (grids_per[s], s)), strata)
    source = shuffle_by_grid(np.arange(len(X)), ids, strata=strata, random_state=random_state)
    out = X.copy()
    out[:, :-N_COVARIATES] = X[source, :-N_COVARIATES]
    return out


@dataclass(frozen=True)
class WallTestConfig:
    """How :func:`conditional_wall_test` fits and scores."""

    frame: Frame = "absolute"
    """Which cells the probe reads."""
    radius: int = 3
    """Chebyshev radius of the agent-centred heads."""
    alphas: tuple[float, ...] = (100.0, 30.0, 10.0, 3.0, 1.0, 0.3, 0.1, 0.03, 0.01, 0.003)
    """L2 penalties tried on the validation grids."""
    validation_fraction: float = 0.2
    """Share of the training grids that choose the penalty."""
    max_iter: int = 300
    """L-BFGS iterations per fit."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every interval."""
    random_state: int = 0
    """Seed of the validation carve, the null's pairing and the bootstrap."""

    def probe(self) -> ConditionalWallProbe:
        """The unfitted probe these settings describe."""
        params = {k: v for k, v in asdict(self).items() if k != "n_bootstrap"}
        return ConditionalWallProbe(**params)


def _bits(p: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per-entry cross-entropy in bits."""
    q = np.clip(np.where(target, p, 1 - p), 1e-12, 1.0)
    return -np.log(q) / _LOG2


def _row_auc(scores: np.ndarray, target: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``(N,)`` AUC of each row's masked entries (NaN where one class is absent)."""
    out = np.full(len(scores), np.nan)
    for i in range(len(scores)):
        m = mask[i]
        t = target[i, m]
        if t.any() and not t.all():
            out[i] = roc_auc_score(t, scores[i, m])
    return out


def _grid_auc(row_auc: np.ndarray, grid_ids: np.ndarray) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for g, v in zip(grid_ids.tolist(), row_auc.tolist(), strict=True):
        if np.isfinite(v):
            out.setdefault(g, []).append(v)
    return {g: float(np.mean(v)) for g, v in out.items()}


def score_walls(
    probe_p: np.ndarray,
    null_p: np.ndarray,
    prior_p: np.ndarray,
    target: np.ndarray,
    mask: np.ndarray,
    grid_ids: np.ndarray,
    *,
    n_bootstrap: int = 1000,
    random_state: int = 0,
) -> dict:
    """The statistic on the masked (prior-uncertain) entries of held-out rows.

    Returns ``{n_rows, n_grids, n_cells, cells_per_row, bits, accuracy, auc_within_grid,
    detected}``: bits gained over the prior per uncertain cell, accuracy and within-grid AUC,
    each ``{probe, null, [prior,] difference}`` of grid-bootstrap estimates.
    """
    ids = np.asarray(grid_ids).astype(str)
    t = np.asarray(target, dtype=bool)
    m = np.asarray(mask, dtype=bool)
    n_cells = m.sum(axis=1).astype(np.float64)
    keep = n_cells > 0
    models = {"probe": probe_p, "null": null_p}
    prior_bits = _bits(prior_p, t)
    gain = {k: ((prior_bits - _bits(p, t)) * m).sum(axis=1) for k, p in models.items()}
    correct = {
        name: (((p > 0.5) == t) & m).sum(axis=1).astype(np.float64)
        for name, p in {**models, "prior": prior_p}.items()
    }
    boot = GridBootstrap.from_grid_ids(
        ids[keep], n_resamples=n_bootstrap, random_state=random_state
    )

    def ratio(num):
        return {**boot.summary(boot.ratio(num[keep], n_cells[keep])), "n": int(n_cells.sum())}

    per_grid = {k: _grid_auc(_row_auc(p, t, m), ids) for k, p in models.items()}
    common = sorted(set(per_grid["probe"]) & set(per_grid["null"]))
    prior_auc = _grid_auc(_row_auc(prior_p, t, m), ids)
    auc_out = {
        k: grid_mean([v[g] for g in common], random_state=random_state) for k, v in per_grid.items()
    }
    auc_out["prior"] = grid_mean(list(prior_auc.values()), random_state=random_state)
    auc_out["difference"] = grid_mean(
        [per_grid["probe"][g] - per_grid["null"][g] for g in common],
        n_resamples=n_bootstrap,
        random_state=random_state,
    )
    gain["difference"] = gain["probe"] - gain["null"]
    bits = {k: ratio(v) for k, v in gain.items()}
    accuracy = {
        **{k: boot.rate_summary(v[keep], n_cells[keep]) for k, v in correct.items()},
        "difference": ratio(correct["probe"] - correct["null"]),
    }
    return {
        "n_rows": int(keep.sum()),
        "n_grids": int(len(np.unique(ids[keep]))),
        "n_cells": int(n_cells.sum()),
        "cells_per_row": float(n_cells[keep].mean()) if keep.any() else 0.0,
        "bits": bits,
        "accuracy": accuracy,
        "auc_within_grid": auc_out,
        "detected": all(Estimate.from_dict(x["difference"]).above(0) for x in (bits, auc_out)),
    }


def conditional_wall_test(
    X: np.ndarray,
    y: np.ndarray,
    grid_ids: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    config: WallTestConfig = WallTestConfig(),
) -> dict:
    """Fit the probe and its null on the ``train`` rows, score both on the ``test`` rows.

    ``X`` from :func:`wall_inputs` with the *true* agent cell; ``train``/``test`` row indices
    that share no grid. Returns ``{frame, alpha, null_alpha, n_train_grids, overall:
    score_walls(...), rings: {"1": ...} (agent frame, rings with a held-out uncertain cell),
    probe, null}`` (the fitted estimators: drop them before writing JSON).
    """
    X = np.asarray(X, dtype=np.float64)
    ids = np.asarray(grid_ids).astype(str)
    train, test = np.asarray(train), np.asarray(test)
    if np.intersect1d(ids[train], ids[test]).size:
        raise ValueError("train and test share grids: split by grid")
    probe = config.probe().fit(X[train], y[train], ids[train])
    X_null = null_inputs(X[train], ids[train], random_state=config.random_state)
    null = config.probe().fit(X_null, y[train], ids[train])
    target, _ = probe.frame_targets(X[test], y[test])
    prior_p, mask = probe.prior_proba(X[test])
    probe_p, null_p = probe.predict_proba(X[test]), null.predict_proba(X[test])

    def score(cols: np.ndarray) -> dict:
        p, n, q, t, m = (a[:, cols] for a in (probe_p, null_p, prior_p, target, mask))
        seed = config.random_state
        return score_walls(
            p, n, q, t, m, ids[test], n_bootstrap=config.n_bootstrap, random_state=seed
        )

    out = {
        "frame": config.frame,
        "alpha": np.asarray(probe.alpha_, dtype=np.float64).reshape(-1).tolist(),
        "null_alpha": np.asarray(null.alpha_, dtype=np.float64).reshape(-1).tolist(),
        "n_train_grids": int(np.unique(ids[train]).size),
        "overall": score(np.arange(target.shape[1])),
    }
    if config.frame == "agent":
        offs = offsets(config.radius)
        ring = rings(offs)
        out["rings"] = {  # a ring none of whose held-out cells is prior-uncertain is left out
            str(k): score(np.flatnonzero(ring == k))
            for k in np.unique(ring)
            if mask[:, ring == k].any()
        }
    out["probe"], out["null"] = probe, null
    return out


WALL_READOUT_SCHEMA = "goalprobe.wall_readout/1"
"""``schema`` of :func:`wall_readout`'s result."""


def wall_verdict(overall: dict, power: dict | None) -> dict:
    """The verdict of one frame's test (its ``overall`` block) with the power it stands on (that
    frame's :func:`~goalprobe.probes.wall_planting.wall_power_curve`, or None): ``"no"`` only
    when the design detects planted walls at some strength and the bits interval lies below
    that effect. Returns ``{verdict, detected, bits, minimum_detectable_strength,
    minimum_detectable_bits, reason}``.
    """
    bits = overall["bits"]["difference"]
    mds = None if power is None else power.get("minimum_detectable_strength")
    mdb = None if power is None else power.get("bits_at_mds")
    if overall["detected"]:
        verdict, reason = "yes", "bits and within-grid AUC intervals above the null"
    elif mds is None or mdb is None:
        verdict, reason = "undecided", "not detected, and no detectable strength shown"
    elif Estimate.from_dict(bits).below(mdb):
        verdict, reason = "no", "not detected; the interval excludes the minimum detectable effect"
    else:
        verdict, reason = "undecided", "not detected; the interval reaches the detectable effect"
    return {
        "verdict": verdict,
        "detected": bool(overall["detected"]),
        "bits": bits,
        "minimum_detectable_strength": mds,
        "minimum_detectable_bits": mdb,
        "reason": reason,
    }


def design_power(committed: dict | None, n_grids: int, n_test_grids: int, n_features: int):
    """The committed power curves (the whole ``probes/wall_power.json``) where they apply to a
    store: ``(conditional.frames or None, {applies, reason, design})``. They apply when the
    store has at least the design's grids and test grids and its feature width
    (``n_anchors * d_model``); otherwise its verdicts get no power (a "no" reads "undecided").
    """
    if not committed or "conditional" not in committed:
        return None, {"applies": False, "reason": "no committed power curve", "design": None}
    design = committed.get("design") or {}
    want_grids = int(design.get("n_grids", 0))
    want_test = int(round(want_grids * float(design.get("test_fraction", 0.0))))
    want_features = int(design.get("d_model", 0)) * int(design.get("n_anchors", 0))
    reasons = []
    if n_grids < want_grids or n_test_grids < want_test:
        reasons.append(
            f"{n_grids} grids ({n_test_grids} held out) against the design's {want_grids} "
            f"({want_test})"
        )
    if n_features != want_features:
        reasons.append(f"{n_features} features per row against the design's {want_features}")
    info = {
        "applies": not reasons,
        "reason": "; ".join(reasons) or "the store meets the power design",
        "design": {"n_grids": want_grids, "n_test_grids": want_test, "n_features": want_features},
    }
    return (None if reasons else committed["conditional"]["frames"]), info


def wall_readout(
    data: ProbeData,
    split: GridSplit,
    *,
    frames: tuple[Frame, ...] = ("absolute", "agent"),
    config: WallTestConfig = WallTestConfig(),
    power: dict | None = None,
    fitted: dict | None = None,
) -> dict:
    """Both frames' conditional wall tests on ``data`` (split by grid) and their verdicts.

    ``config``'s ``frame`` is set per frame; ``power``: the power curves by frame
    (:func:`design_power`; None: every "no" is "undecided"); ``fitted`` receives each frame's
    fitted probe. Returns JSON-ready ``{schema, stage, layer, n_train_grids, n_test_grids,
    frames: {frame: test}, verdicts: {frame: wall_verdict}}``.
    """
    X = wall_inputs(data.acts, data.grid_sizes, data.densities, data.agent_row_col)
    out: dict = {
        "schema": WALL_READOUT_SCHEMA,
        "stage": data.source.stage,
        "layer": data.source.layer,
        "n_train_grids": int(np.unique(data.grid_ids[split.train]).size),
        "n_test_grids": int(np.unique(data.grid_ids[split.test]).size),
        "frames": {},
        "verdicts": {},
    }
    for frame in frames:
        cfg = WallTestConfig(**{**config.__dict__, "frame": frame})
        res = conditional_wall_test(X, data.cell_types, data.grid_ids, split.train, split.test, cfg)
        out["frames"][frame] = {k: v for k, v in res.items() if k not in ("probe", "null")}
        if fitted is not None:
            fitted[frame] = res["probe"]
        curve = None if power is None else power.get(frame)
        out["verdicts"][frame] = wall_verdict(res["overall"], curve)
    return out
