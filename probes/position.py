"""Position probes: a read-out made for localisation.

A cell-type probe's ``AGENT`` (or ``GOAL``) argmax is a poor localiser (the map spreads a rare
class over many cells). A position probe reads the row and column directly: one multinomial
logistic regression per coordinate on standardised features. :func:`evaluate_positions` scores
it against the most frequent position of the grid's size, a uniform guess among open cells and
the probe on positions shuffled between grids, with grid-bootstrap intervals and the
selectivity over the strongest.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import scipy.special
from goalprobe.probes.baselines import uniform_top1
from goalprobe.probes.families import store_params
from goalprobe.probes.metrics import selectivity
from goalprobe.probes.splits import shuffle_by_grid, split_by_grid
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_is_fitted

from goalprobe.stats import GridBootstrap

if TYPE_CHECKING:
    from goalprobe.probes.probe_sweep import ProbeData, StoreProbeLoader

POSITION_TARGETS = ("agent", "goal")
"""The objects a position probe localises (:func:`position_scores`)."""

POSITION_SWEEP_SCHEMA = "goalprobe.position_sweep"
POSITION_SWEEP_SCHEMA_VERSION = 1


class PositionProbe(ClassifierMixin, BaseEstimator):
    """``(row, col)`` of one object from anchor activations: a logistic regression per axis.

    ``C``: inverse L2 strength of both regressions; ``max_iter``: the solver's limit.
    Fitted attributes: ``row_`` and ``col_`` (the two pipelines); ``converged_``: both solvers
    stopped before ``max_iter`` (scikit-learn's ``ConvergenceWarning`` becomes this flag).
    """

    def __init__(self, C: float = 0.1, max_iter: int = 1000, random_state: int = 0) -> None:
        store_params(self, locals())

    def _pipeline(self):
        return make_pipeline(
            StandardScaler(),
            LogisticRegression(C=self.C, max_iter=self.max_iter, random_state=self.random_state),
        )

    def fit(self, X: np.ndarray, y: np.ndarray) -> PositionProbe:
        """``X``: ``(N, ...)`` activations (flattened per row); ``y``: ``(N, 2)`` ``(row, col)``."""
        X = _flat(X)
        y = np.asarray(y, dtype=np.int64).reshape(len(X), 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # recorded in converged_
            self.row_ = self._pipeline().fit(X, y[:, 0])
            self.col_ = self._pipeline().fit(X, y[:, 1])
        self.converged_ = all(
            int(np.max(p[-1].n_iter_)) < self.max_iter for p in (self.row_, self.col_)
        )
        self._axes_ = {
            name: _axis_arrays(p) for name, p in (("row", self.row_), ("col", self.col_))
        }
        return self

    def axis_proba(self, X: np.ndarray, axis: str) -> tuple[np.ndarray, np.ndarray]:
        """``(classes (K,), probabilities (N, K))`` of the ``"row"`` or ``"col"`` regression,
        computed from the stored arrays (a probe read back predicts bit for bit the same)."""
        check_is_fitted(self, "_axes_")
        a = self._axes_[axis]
        z = (_flat(X).astype(np.float64) - a["mean"]) / a["scale"]
        logits = z @ a["coef"].T + a["intercept"]
        if logits.shape[1] == 1:  # binary: scikit-learn's single column is class 1 vs 0
            logits = np.concatenate([np.zeros_like(logits), logits], axis=1)
        return a["classes"].astype(np.int64), scipy.special.softmax(logits, axis=1)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``(N, 2)`` predicted ``(row, col)`` (the argmax of each coordinate)."""
        axes = [self.axis_proba(X, axis) for axis in ("row", "col")]
        return np.stack([c[p.argmax(axis=1)] for c, p in axes], axis=1).astype(np.int64)

    def cell_proba(self, X: np.ndarray, sizes: np.ndarray, canvas: int) -> np.ndarray:
        """``(N, canvas, canvas)`` distribution of the object's cell: ``P(row) P(col)``
        renormalised within each row's ``n x n`` grid (``sizes``), zero outside."""
        sizes = np.asarray(sizes, dtype=np.int64)
        marg = []
        for axis in ("row", "col"):
            classes, p = self.axis_proba(X, axis)
            full = np.zeros((len(sizes), canvas))
            keep = classes < canvas
            full[:, classes[keep]] = p[:, keep]
            marg.append(full)
        joint = marg[0][:, :, None] * marg[1][:, None, :]
        inside = np.arange(canvas)[None, :] < sizes[:, None]  # (N, canvas)
        joint *= inside[:, :, None] & inside[:, None, :]
        total = joint.sum(axis=(1, 2), keepdims=True)
        uniform = (inside[:, :, None] & inside[:, None, :]) / (sizes**2)[:, None, None]
        return np.where(total > 0, joint / np.where(total > 0, total, 1.0), uniform)

    def _fitted_state(self) -> tuple[dict[str, np.ndarray], dict]:
        check_is_fitted(self, "_axes_")
        tensors = {
            f"{axis}_{k}": np.asarray(v) for axis, a in self._axes_.items() for k, v in a.items()
        }
        return tensors, {"converged_": bool(self.converged_)}

    def _restore(self, tensors: dict[str, np.ndarray], meta: dict) -> None:
        self._axes_ = {
            axis: {
                k: tensors[f"{axis}_{k}"] for k in ("mean", "scale", "coef", "intercept", "classes")
            }
            for axis in ("row", "col")
        }
        self.converged_ = bool(meta["converged_"])


class PositionPrior(ClassifierMixin, BaseEstimator):
    """The most frequent training position among grids of the same size (back-off: every
    grid). ``X`` is the ``(N,)`` grid size (or ``(N, 2)`` covariates, size first)."""

    def fit(self, X: np.ndarray, y: np.ndarray) -> PositionPrior:
        sizes = _sizes(X)
        y = np.asarray(y, dtype=np.int64).reshape(len(sizes), 2)
        self.by_size_ = {
            int(s): Counter(map(tuple, y[sizes == s])).most_common(1)[0][0]
            for s in np.unique(sizes)
        }
        self.overall_ = Counter(map(tuple, y)).most_common(1)[0][0]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, ("by_size_", "overall_"))
        return np.asarray(
            [self.by_size_.get(int(s), self.overall_) for s in _sizes(X)], dtype=np.int64
        ).reshape(-1, 2)


def evaluate_positions(
    predictions: dict[str, np.ndarray],
    truth: np.ndarray,
    grid_ids: np.ndarray,
    *,
    chance: np.ndarray | None = None,
    reference: str = "probe",
    n_boot: int = 1000,
    confidence_level: float = 0.95,
    random_state: int = 0,
) -> dict:
    """Top-1 (exact cell) and per-axis accuracy of every model's ``(N, 2)`` predicted ``(row,
    col)``, with grid-bootstrap intervals, and the ``reference``'s :func:`selectivity` over the
    strongest other. ``chance``: ``(N,)`` probability that a uniform guess is right, scored as
    the model ``uniform``. Returns ``{n_examples, n_grids, models: {model: {top1, row, col}},
    selectivity}``.
    """
    truth = np.asarray(truth, dtype=np.int64)
    boot = GridBootstrap.from_grid_ids(
        np.asarray(grid_ids).astype(str),
        n_resamples=n_boot,
        confidence=confidence_level,
        random_state=random_state,
    )
    samples: dict[str, dict[str, np.ndarray]] = {}
    models: dict[str, dict] = {}
    for name, predicted in predictions.items():
        predicted = np.asarray(predicted, dtype=np.int64)
        hit = predicted == truth
        hits = {"top1": hit.all(axis=1), "row": hit[:, 0], "col": hit[:, 1]}
        models[name] = {  # rates: intervals honest at 0% and 100% (cluster-adjusted exact)
            k: {
                key: v
                for key, v in boot.rate_summary(h.astype(np.float64)).items()
                if key in ("value", "ci_low", "ci_high", "n_eff")
            }
            for k, h in hits.items()
        }
        samples[name] = {k: boot.ratio(h.astype(np.float64)) for k, h in hits.items()}
    if chance is not None:
        samples["uniform"] = {"top1": boot.ratio(np.asarray(chance, dtype=np.float64))}
        models["uniform"] = {"top1": boot.summary(samples["uniform"]["top1"])}
    baselines = [name for name in samples if name != reference]
    return {
        "n_examples": int(len(truth)),
        "n_grids": boot.n_grids,
        "models": models,
        "selectivity": selectivity(samples, reference, baselines, boot),
    }


def position_scores(
    data: ProbeData,
    test: np.ndarray,
    *,
    C: float = 0.1,
    n_boot: int = 1000,
    random_state: int = 0,
    log=None,
    fitted: dict | None = None,
) -> dict:
    """Agent and goal position probes of one stage and layer, scored on the test grids.

    Each :class:`PositionProbe` is fitted on the rows outside ``test`` (``(N,)`` bool, the test
    grids' rows) and compared with :class:`PositionPrior`, a uniform guess among the grid's
    open cells and the probe fitted on positions shuffled between grids of a size. ``fitted``
    receives ``target -> fitted PositionProbe``. Returns ``{"agent": ..., "goal": ...}``:
    :func:`evaluate_positions` of each, plus ``converged`` (``{"probe", "shuffled"}``).
    """
    test = np.asarray(test, dtype=bool)
    train = ~test
    chance = uniform_top1(data.cell_types, data.grid_sizes)
    out = {}
    for target in POSITION_TARGETS:
        positions = data.agent_row_col if target == "agent" else data.goal_row_col
        if log:
            log(f"position probe: {target}")
        shuffled = shuffle_by_grid(
            positions[train], data.grid_ids[train], strata=data.grid_sizes[train],
            random_state=random_state,
        )  # fmt: skip
        probe = PositionProbe(C=C, random_state=random_state)
        probe.fit(data.acts[train], positions[train])
        if fitted is not None:
            fitted[target] = probe
        control = PositionProbe(C=C, random_state=random_state).fit(data.acts[train], shuffled)
        prior = PositionPrior().fit(data.grid_sizes[train], positions[train])
        predictions = {
            "probe": probe.predict(data.acts[test]),
            "prior_size": prior.predict(data.grid_sizes[test]),
            "shuffled": control.predict(data.acts[test]),
        }
        out[target] = evaluate_positions(
            predictions,
            positions[test],
            data.grid_ids[test],
            chance=chance[test],
            n_boot=n_boot,
            random_state=random_state,
        )
        out[target]["converged"] = {"probe": probe.converged_, "shuffled": control.converged_}
    return out


def position_sweep(
    loader: StoreProbeLoader,
    stages: tuple[str, ...],
    layers: tuple[int, ...],
    *,
    test_fraction: float = 0.2,
    C: float = 0.1,
    n_boot: int = 1000,
    random_state: int = 0,
    log=None,
) -> dict:
    """:func:`position_scores` at every stage x layer of a store, on the split by grid that
    :func:`~goalprobe.probes.probe_sweep.run_probe_sweep` draws from the same arguments.
    Returns JSON-ready ``{schema, schema_version, config, split, runs}``.
    """
    split = split_by_grid(
        loader.all_grid_ids,
        test_fraction=test_fraction,
        stratify=loader.all_grid_sizes,
        random_state=random_state,
    )
    test_grids = np.unique(loader.all_grid_ids[split.test])
    runs = []
    for stage in stages:
        for layer in layers:
            if log:
                log(f"{stage} L{layer}: position probes")
            data = loader(stage, layer)
            test = np.isin(data.grid_ids, test_grids)
            scores = position_scores(
                data, test, C=C, n_boot=n_boot, random_state=random_state, log=log
            )
            runs.append(
                {
                    "stage": stage,
                    "layer": int(layer),
                    "n_test": int(test.sum()),
                    "n_test_grids": int(len(np.unique(data.grid_ids[test]))),
                }
                | scores
            )
    return {
        "schema": POSITION_SWEEP_SCHEMA,
        "schema_version": POSITION_SWEEP_SCHEMA_VERSION,
        "config": {"test_fraction": test_fraction, "C": C, "n_boot": n_boot,
                   "random_state": random_state},
        "split": {"train_grids": int(len(np.unique(loader.all_grid_ids[split.train]))),
                  "test_grids": int(len(test_grids))},
        "runs": runs,
    }  # fmt: skip


def _axis_arrays(pipeline) -> dict[str, np.ndarray]:
    """The arrays of one fitted ``StandardScaler -> LogisticRegression`` pipeline."""
    scaler, model = pipeline[0], pipeline[-1]
    return {
        "mean": np.asarray(scaler.mean_, dtype=np.float64),
        "scale": np.asarray(scaler.scale_, dtype=np.float64),
        "coef": np.asarray(model.coef_, dtype=np.float64),
        "intercept": np.asarray(model.intercept_, dtype=np.float64),
        "classes": np.asarray(model.classes_, dtype=np.int64),
    }


def _flat(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float32)
    return X.reshape(len(X), -1)


def _sizes(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X)
    return (X[:, 0] if X.ndim == 2 else X).astype(np.int64)
