"""The plan-decoder sweep: every capacity on every stage and layer (study, section 5.3, Table 5).

For each ``(stage, layer)``: split by grid (one split, stratified by size, for every stage and
layer), evaluate the majority-plan baseline, train one
:class:`~goalprobe.probes.plan_decoder.PlanDecoder` per capacity and the shuffled-activation
controls, and score everything on the test grids with grid-bootstrap intervals
(:func:`goalprobe.probes.plan_metrics.plan_metrics`). Writes ``models/<run>.*``,
``predicted_plans.h5`` and ``sweep.json`` under ``out_dir``.

The baselines a plan read-out must beat: a decoder that "reads the first move" from the anchors
may read the *state* (agent and goal cells), not a plan: heading for the goal already predicts
much of an optimal agent's moves. So beside the study's ``0.25 ** N`` line, the majority plan and
the shuffled control, every N gets :class:`StatePlanDecoder` (a one-shot decoder from the
agent's and goal's coordinates and the grid's size) and :func:`optimal_plans` (the optimal
policy's plan, no training); :func:`prefix_verdicts` compares the decoder with the strongest of
them, paired on the same rows (:func:`goalprobe.stats.grid_bootstrap_ratio`).
:func:`departure_mask` marks the rows whose first step departs from the optimal policy or breaks
a tie: the only rows where a plan read-out can beat every state-only predictor.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol, TypedDict

import numpy as np
from goalprobe.activations.store import ActivationStore
from goalprobe.gridworld.core import PLAN_PAD, CellType, Grid, State
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.plan_decoder import PlanDecoder, check_plan_acts
from goalprobe.probes.plan_metrics import (
    SPLIT_NAMES,
    PlanMetrics,
    canonical_plans,
    encode_plans,
    majority_plan,
    plan_metrics,
    plan_metrics_by_group,
    prefix_hits,
    truncate_plans,
    validate_plans,
    write_predicted_plans,
)
from goalprobe.probes.serialization import read_plan_decoder_card, save_plan_decoder
from goalprobe.probes.splits import GridSplit, grid_folds, split_by_grid
from sklearn.base import clone
from sklearn.ensemble import RandomForestClassifier

from goalprobe.stats import grid_bootstrap_ratio, interval_verdict

SWEEP_SCHEMA = "goalprobe.plan_sweep"
"""``schema`` field of ``sweep.json``."""
SWEEP_SCHEMA_VERSION = 2
"""Version of the ``sweep.json`` layout."""


CHANCE = "chance 0.25^N"
"""Name of the ``0.25 ** N`` line among the baselines of :func:`prefix_verdicts`."""


def state_features(agent_row_col: np.ndarray, goal_row_col: np.ndarray, sizes) -> np.ndarray:
    """``(N, 7)`` float: agent row and column, goal row and column, their differences (goal
    minus agent) and the grid's side."""
    agent = np.asarray(agent_row_col, dtype=np.float64).reshape(-1, 2)
    goal = np.asarray(goal_row_col, dtype=np.float64).reshape(-1, 2)
    size = np.asarray(sizes, dtype=np.float64).reshape(-1, 1)
    if not len(agent) == len(goal) == len(size):
        raise ValueError("agent_row_col, goal_row_col and sizes must have one row per example")
    return np.concatenate([agent, goal, goal - agent, size], axis=1)


class StatePlanDecoder:
    """A one-shot plan decoder from :func:`state_features`: a multi-output random forest
    (each step from the state alone), its settings fixed in advance."""

    def __init__(
        self, n_estimators: int = 200, min_samples_leaf: int = 2, random_state: int = 0
    ) -> None:
        self.forest = RandomForestClassifier(
            n_estimators=n_estimators,
            min_samples_leaf=min_samples_leaf,
            random_state=random_state,
            n_jobs=1,
        )

    def fit(self, features: np.ndarray, plans: np.ndarray) -> StatePlanDecoder:
        """Fit ``(N, 7)`` features to ``(N, T)`` plan tokens."""
        self.forest.fit(np.asarray(features), np.asarray(plans, dtype=np.int64))
        return self

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``(N, T)`` int8 canonical plans (tokens after a predicted END become PAD)."""
        raw = np.asarray(self.forest.predict(np.asarray(features))).astype(np.int64)
        raw = raw.reshape(len(features), -1)
        return canonical_plans(np.minimum(raw, 4))


def optimal_plans(
    cell_types: np.ndarray,
    agent_row_col: np.ndarray,
    goal_row_col: np.ndarray,
    sizes: np.ndarray,
    horizon: int,
) -> np.ndarray | None:
    """``(N, horizon)`` int8: the optimal policy's plan (lowest-index tie-break) on the true
    grid ``cell_types (N, C, C)`` from every row's state, or None when a row shows a key or a
    door, puts the agent or goal on a wall, or cannot reach its goal."""
    cells = np.asarray(cell_types)
    if np.isin(cells, (CellType.KEY, CellType.DOOR)).any():
        return None
    sequences: list[list[int]] = []
    cache: dict[bytes, Any] = {}
    for types, agent, goal, size in zip(cells, agent_row_col, goal_row_col, sizes, strict=True):
        n = int(size)
        walls = np.ascontiguousarray(types[:n, :n] == CellType.WALL)
        goal_cell = (int(goal[0]), int(goal[1]))
        agent_cell = (int(agent[0]), int(agent[1]))
        if walls[agent_cell] or walls[goal_cell]:
            return None  # the labels do not describe a state of a grid
        if agent_cell == goal_cell:
            sequences.append([])
            continue
        key = walls.tobytes() + bytes(goal_cell) + bytes([n])
        if key not in cache:  # distances do not depend on the start
            cache[key] = solve(Grid(walls=walls, goal=goal_cell, start=agent_cell))
        policy = cache[key]
        state = State(agent=agent_cell)
        if not np.isfinite(policy.distance(state)):
            return None
        _, actions = policy.optimal_trajectory(start=state)
        sequences.append([int(a) for a in actions[:horizon]])
    return encode_plans(sequences, horizon)


def departure_mask(
    plans: np.ndarray, optimal_actions: np.ndarray, action: np.ndarray, action_valid: np.ndarray
) -> np.ndarray:
    """``(N,)`` bool: the row's first plan step is its own valid action, and that action is
    not optimal or is one of several optimal actions (a departure or a tie)."""
    plans = np.asarray(plans)
    mask = np.asarray(optimal_actions, dtype=bool)
    act = np.asarray(action, dtype=np.int64)
    own = np.asarray(action_valid, dtype=bool) & (plans[:, 0] == act) & (act < mask.shape[1])
    chosen = mask[np.arange(len(act)), np.clip(act, 0, mask.shape[1] - 1)]
    return own & (~chosen | (mask.sum(axis=1) > 1))


def prefix_verdicts(
    hits: Mapping[str, np.ndarray],
    decoder: str,
    grid_ids: np.ndarray,
    *,
    rows: np.ndarray | None = None,
    horizons: range | None = None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> list[dict]:
    """The decoder against the strongest baseline at every N, paired on the same rows.

    ``hits``: name -> ``(N_rows, T)`` bool prefix hits of the ``decoder`` and every baseline;
    ``rows``: an optional mask or indices judged (e.g. :func:`departure_mask`); ``horizons``:
    the N judged (default ``1..T``). Returns per N ``{n, n_rows, baselines (with
    :data:`CHANCE`), strongest, decoder, difference (paired), verdict}`` (and ``detectable``):
    :func:`goalprobe.stats.interval_verdict` on the difference (``no`` only below 0).
    """
    ids = np.asarray(grid_ids)
    select = np.arange(len(ids)) if rows is None else np.asarray(rows)
    if select.dtype == bool:
        select = np.flatnonzero(select)
    ids = ids[select]
    table = {name: np.asarray(h, dtype=bool)[select] for name, h in hits.items()}
    horizon = table[decoder].shape[1]
    boot: dict[str, Any] = dict(
        n_resamples=n_resamples, confidence=confidence, random_state=random_state
    )
    out = []
    for n in horizons or range(1, horizon + 1):
        if len(select) == 0:
            out.append({"n": n, "n_rows": 0, "verdict": "undecided"})
            continue
        column = {name: h[:, n - 1].astype(np.float64) for name, h in table.items()}
        baselines = {name: float(c.mean()) for name, c in column.items() if name != decoder}
        baselines[CHANCE] = 0.25**n
        strongest = max(baselines, key=lambda name: (baselines[name], name == CHANCE))
        rate = grid_bootstrap_ratio(column[decoder], None, ids, **boot)
        if strongest == CHANCE:
            diff = {
                k: None if rate[k] is None else rate[k] - baselines[CHANCE]
                for k in ("value", "ci_low", "ci_high")
            }
            diff.update(n=rate["n"], n_grids=rate["n_grids"])
        else:
            diff = grid_bootstrap_ratio(column[decoder] - column[strongest], None, ids, **boot)
        out.append(
            {
                "n": n,
                "n_rows": int(len(select)),
                "baselines": baselines,
                "strongest": strongest,
                "decoder": rate,
                "difference": diff,
                **interval_verdict(diff).to_dict(),
            }
        )
    return out


class PlanSweepDict(TypedDict):
    """``sweep.json`` of a plan sweep (schema :data:`SWEEP_SCHEMA`, version
    :data:`SWEEP_SCHEMA_VERSION`): :meth:`PlanSweepResult.to_dict`."""

    schema: str
    schema_version: int
    config: dict[str, Any]
    decoder_params: dict
    splits: dict[str, dict]
    runs: list[dict[str, Any]]


@dataclass(frozen=True, eq=False)
class PlanDataset:
    """Activations and plan labels of one stage and layer, as a sweep loader returns them.

    ``acts (N, n_tokens, d_model)``; ``plans (N, T' >= horizon)`` int8; ``grid_ids`` (splits
    and bootstrap are by grid); ``row_ids`` the activation-store rows; ``sizes``/``densities``
    for the breakdowns; ``provenance`` a JSON-ready description of the source. Optional:
    ``agent_row_col``/``goal_row_col`` (for the state-only decoder), ``optimal_plans``
    (:func:`~goalprobe.probes.plan_sweep.optimal_plans`) and ``departs``
    (:func:`~goalprobe.probes.plan_sweep.departure_mask`).
    """

    acts: np.ndarray
    plans: np.ndarray
    grid_ids: np.ndarray
    row_ids: np.ndarray
    sizes: np.ndarray | None = None
    densities: np.ndarray | None = None
    provenance: dict = field(default_factory=dict)
    agent_row_col: np.ndarray | None = None
    goal_row_col: np.ndarray | None = None
    optimal_plans: np.ndarray | None = None
    departs: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.acts)
        check_plan_acts(self.acts, "acts")
        validate_plans(self.plans)
        for name in (
            "plans", "grid_ids", "row_ids", "sizes", "densities", "agent_row_col",
            "goal_row_col", "optimal_plans", "departs",
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} rows but acts has {n}")


_STORE_ATTRS = (
    "model_id model_revision backend created package_version trajectory_file trajectory_sha256"
).split()
"""The activation store's attributes copied into a dataset's provenance (when present)."""


class PlanLoader(Protocol):
    """How the sweep gets its data: ``load(stage, layer) -> PlanDataset``, with the ``stages``
    (those with rows) and ``layers`` it can load."""

    stages: tuple[str, ...]
    layers: tuple[int, ...]

    def __call__(self, stage: str, layer: int) -> PlanDataset: ...


class StorePlanLoader:
    """A :data:`PlanLoader` reading an activation store (``goalprobe extract``).

    Each row holding the stage is one trajectory step, labelled with the ``plan`` from that
    step on; ``first_step_only`` keeps step 0 of each episode (as the study). ``attrs``: the
    store's file attributes.
    """

    def __init__(self, path: str | Path, *, first_step_only: bool = False) -> None:
        self.path = Path(path)
        self.first_step_only = first_step_only
        with ActivationStore(self.path) as store:  # fail early on a bad file
            self.stages, self.layers = store.stages_with_rows(), store.layers
            self.attrs = dict(store.attrs)

    def __call__(self, stage: str, layer: int) -> PlanDataset:
        """Activations ``(N, 3, d_model)`` float16 and labels of ``stage`` and ``layer``."""
        with ActivationStore(self.path) as store:
            rows = store.select(stage)
            fields = [
                "plan", "grid_id", "grid_size", "density", "step", "agent_row_col",
                "goal_row_col", "cell_types", "optimal_actions", "action", "action_valid",
            ]  # fmt: skip
            labels = store.labels(fields, rows)
            if self.first_step_only:
                keep = labels["step"] == 0
                rows = rows[keep]
                labels = {k: v[keep] for k, v in labels.items()}
            if len(rows) == 0:
                raise ValueError(f"{self.path}: no rows hold stage {stage!r}")
            acts = store.read(stage, layer, rows)
        densities = labels["density"].astype(np.float64)
        plans = labels["plan"].astype(np.int8)
        provenance: dict[str, Any] = {
            "store": str(self.path),
            "stage": stage,
            "layer": int(layer),
            "n_rows": int(len(rows)),
            "first_step_only": self.first_step_only,
            **{key: self.attrs[key] for key in _STORE_ATTRS if key in self.attrs},
        }
        return PlanDataset(
            acts=acts,
            plans=plans,
            grid_ids=labels["grid_id"].astype(str),
            row_ids=rows,
            sizes=labels["grid_size"].astype(np.int64),
            densities=None if np.isnan(densities).all() else np.round(densities, 6),
            provenance=provenance,
            agent_row_col=labels["agent_row_col"].astype(np.int64),
            goal_row_col=labels["goal_row_col"].astype(np.int64),
            optimal_plans=optimal_plans(
                labels["cell_types"],
                labels["agent_row_col"],
                labels["goal_row_col"],
                labels["grid_size"],
                plans.shape[1],
            ),
            departs=departure_mask(
                plans, labels["optimal_actions"], labels["action"], labels["action_valid"]
            ),
        )


@dataclass(frozen=True)
class PlanSweepConfig:
    """What the capacity sweep trains and how it evaluates."""

    stages: tuple[str, ...] = ()
    """Stages passed to the loader; empty: every stage the loader has rows for."""
    layers: tuple[int, ...] = ()
    """Residual-stream layers passed to the loader; empty: every layer it holds."""
    decoder_layers: tuple[int, ...] = (1, 2, 4)
    """Decoder capacities (Transformer decoder layers) trained for every stage and layer."""
    control_decoder_layers: tuple[int, ...] = (2,)
    """Capacities that also get the shuffled-activation control; empty to skip it."""
    test_fraction: float = 0.15
    """Fraction of grids (within each size) held out for the metrics; unused with folds."""
    n_folds: int = 1
    """1: one train/validation/test split; K >= 2: K-fold cross-fitting by grid."""
    state_baselines: bool = True
    """Also score the state-only decoder and the optimal policy's plan (where the data allow),
    and judge every decoder against the strongest baseline at every N."""
    validation_fraction: float = 0.15
    """Fraction of the remaining (non-test) grids used for early stopping."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples for the confidence intervals (0: none)."""
    confidence_level: float = 0.95
    """Coverage of the intervals."""
    random_state: int = 0
    """Seed of the split, the decoders, the shuffle and the bootstrap."""


@dataclass(frozen=True, eq=False, kw_only=True)
class PlanRun:
    """One evaluated predictor of the sweep, named ``"<stage>/layer<layer>/<kind>[<layers>]"``.

    ``kind``: ``"decoder"``, ``"shuffled_control"`` (trained on activations shuffled across
    examples), ``"majority_plan"``, ``"state_only"`` (:class:`StatePlanDecoder`) or
    ``"optimal_policy"``. ``metrics``/``by_size``/``by_density``: on the test split;
    ``best_epoch`` one per fold with cross-fitting; ``model_path`` the first fold's weights.
    ``verdicts`` (decoders): per N against the strongest baseline, ``role`` ``"descriptive"``
    (where the agent is optimal its plan is the optimal one). ``departures``: on the test rows
    whose first step departs from the optimal policy or ties, ``n_rows``, ``accuracy_n1`` and
    for decoders ``verdict_n1`` (``role`` ``"verdict"``); None when the data do not say.
    """

    name: str
    stage: str
    layer: int
    kind: str
    decoder_layers: int | None = None
    best_epoch: int | list[int] | None = None
    model_path: str | None = None
    metrics: PlanMetrics
    by_size: dict[str, PlanMetrics]
    by_density: dict[str, PlanMetrics]
    verdicts: list[dict] = field(default_factory=list)
    departures: dict | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (the fields in order, the metrics as :meth:`PlanMetrics.to_dict`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["metrics"] = self.metrics.to_dict()
        for key in ("by_size", "by_density"):
            out[key] = {k: v.to_dict() for k, v in out[key].items()}
        return out


@dataclass(frozen=True, eq=False)
class PlanSweepResult:
    """All runs of a sweep (in training order), its config, the template decoder's parameters
    and per ``"<stage>/layer<layer>"`` the rows and grids of each split."""

    config: PlanSweepConfig
    decoder_params: dict
    runs: list[PlanRun]
    splits: dict[str, dict]

    def to_dict(self) -> PlanSweepDict:
        """JSON-ready dict."""
        return {
            "schema": SWEEP_SCHEMA,
            "schema_version": SWEEP_SCHEMA_VERSION,
            "config": asdict(self.config),
            "decoder_params": self.decoder_params,
            "splits": self.splits,
            "runs": [run.to_dict() for run in self.runs],
        }


def resolve_config(config: PlanSweepConfig, load: PlanLoader) -> PlanSweepConfig:
    """``config`` with empty ``stages`` / ``layers`` replaced by the loader's."""
    stages = config.stages or tuple(getattr(load, "stages", ()))
    layers = config.layers or tuple(getattr(load, "layers", ()))
    if not stages or not layers:
        raise ValueError(
            "no stages or layers to sweep: the config names none and the loader offers "
            f"stages {stages} and layers {layers}"
        )
    return replace(config, stages=stages, layers=layers)


def run_plan_sweep(
    load: PlanLoader,
    config: PlanSweepConfig = PlanSweepConfig(),
    decoder: PlanDecoder | None = None,
    *,
    out_dir: str | Path | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
) -> PlanSweepResult:
    """Train and evaluate decoders of every capacity on every stage and layer.

    The shuffled controls permute the train and validation activations across examples (the
    test rows stay intact); everything is scored on the test grids. The split (stratified by
    size) depends only on the set of grids, so all stages and layers share it.

    ``decoder``: the template (cloned; ``n_layers`` and ``random_state`` set per run).
    ``out_dir``: writes ``models/<run>.safetensors`` + ``.json`` cards, ``predicted_plans.h5``
    (all rows of every trained run, with split codes) and ``sweep.json``; ``overwrite``
    replaces them instead of raising. ``log`` hears a line before each training run.
    """
    template = decoder if decoder is not None else PlanDecoder()
    say = log or (lambda message: None)
    config = resolve_config(config, load)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        existing = [p for p in (out / "predicted_plans.h5", out / "sweep.json") if p.exists()]
        if existing and not overwrite:
            raise FileExistsError(f"{existing[0]} exists; pass overwrite=True to replace it")
        (out / "predicted_plans.h5").unlink(missing_ok=True)
    runs: list[PlanRun] = []
    splits: dict[str, dict] = {}
    for stage in config.stages:
        for layer in config.layers:
            data = load(stage, layer)
            plans = truncate_plans(data.plans, template.horizon)
            key = f"{stage}/layer{layer}"
            folds = _folds(config, np.asarray(data.grid_ids), data.sizes, key)
            splits[key] = _split_info(folds, np.asarray(data.grid_ids))
            # every run's predictions on all rows (the test rows filled)
            pending = _baselines(key, data, plans, folds, config, template.horizon)
            jobs = [("decoder", k) for k in config.decoder_layers]
            jobs += [("shuffled_control", k) for k in config.control_decoder_layers]
            for kind, n_layers in jobs:
                say(f"training {key}/{kind}{n_layers}")
                run, estimators = _train(template, data, plans, folds, kind, n_layers, config)
                run["name"] = f"{key}/{kind}{n_layers}"
                if out is not None:
                    where = (stage, layer, splits[key])
                    _save_run(run, estimators, out, data, plans, folds, where, config, overwrite)
                pending.append(run)
            runs += _score(pending, plans, folds, data, stage, layer, config)
    result = PlanSweepResult(config, template.get_params(), runs, splits)
    if out is not None:
        (out / "sweep.json").write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    return result


def _train(template, data: PlanDataset, plans, folds, kind, n_layers, config):
    """``(run, estimators)``: one decoder (``kind`` ``"decoder"`` or ``"shuffled_control"``)
    trained on every fold, and the pending run of its predictions of all rows (with
    cross-fitting, of each fold's test rows)."""
    pred = np.full(plans.shape, PLAN_PAD, dtype=np.int8)
    estimators = []
    for fold in folds:
        X_train, X_val = data.acts[fold.train], data.acts[fold.validation]
        if kind == "shuffled_control":
            rng = np.random.default_rng(config.random_state)
            X_train = X_train[rng.permutation(len(X_train))]
            X_val = X_val[rng.permutation(len(X_val))]
        est = clone(template).set_params(n_layers=n_layers, random_state=config.random_state)
        est.fit(X_train, plans[fold.train], X_val=X_val, y_val=plans[fold.validation])
        estimators.append(est)
        if len(folds) == 1:
            pred = est.predict(data.acts)
        else:
            pred[fold.test] = est.predict(data.acts[fold.test])
    epochs = [est.best_epoch_ for est in estimators]
    run = {"kind": kind, "pred": pred, "decoder_layers": n_layers}
    return run | {"best_epoch": epochs[0] if len(epochs) == 1 else epochs}, estimators


def _save_run(run, estimators, out: Path, data, plans, folds, where, config, overwrite) -> None:
    """Write a trained run's weights and cards (one per fold) and its predicted plans; sets the
    run's ``model_path`` (the first fold's weights). ``where``: stage, layer, split info."""
    stage, layer, split_info = where
    grid_ids = np.asarray(data.grid_ids)
    provenance = {
        "data": data.provenance,
        "stage": stage,
        "layer": layer,
        "kind": run["kind"],
        "split": split_info,
        "split_config": {
            k: getattr(config, k)
            for k in ("validation_fraction", "test_fraction", "n_folds", "random_state")
        },
    }
    paths = []
    for index, (fold, est) in enumerate(zip(folds, estimators, strict=True)):
        suffix = "" if len(folds) == 1 else f"_fold{index}"
        test = fold.test
        metrics = plan_metrics(run["pred"][test], plans[test], grid_ids[test], **_metric_kw(config))
        weights = out / "models" / f"{(run['name'] + suffix).replace('/', '__')}.safetensors"
        if weights.exists() and not overwrite:
            raise FileExistsError(f"{weights} exists; pass overwrite=True")
        card_path = save_plan_decoder(
            est, weights, metrics={"test": metrics.to_dict()}, provenance=provenance
        )
        paths.append((weights, card_path))
    codes = np.full(len(plans), 0 if len(folds) == 1 else 2, dtype=np.int8)
    if len(folds) == 1:  # with cross-fitting every row is a test row
        codes[folds[0].validation] = 1
        codes[folds[0].test] = 2
    card = read_plan_decoder_card(paths[0][1])
    row_ids = np.asarray(data.row_ids)
    write_predicted_plans(
        out / "predicted_plans.h5", run["name"], run["pred"], row_ids, card=card, split=codes
    )
    run["model_path"] = str(paths[0][0])


def _metric_kw(config: PlanSweepConfig) -> dict[str, Any]:
    """The bootstrap settings of :func:`plan_metrics`."""
    return {
        "n_bootstrap": config.n_bootstrap,
        "confidence_level": config.confidence_level,
        "random_state": config.random_state,
    }


def _by_fold(folds: list[GridSplit], shape, fit_predict) -> np.ndarray:
    """``shape`` int8 plans: every fold's test rows predicted by ``fit_predict(fold)``."""
    pred = np.full(shape, PLAN_PAD, dtype=np.int8)
    for fold in folds:
        pred[fold.test] = fit_predict(fold)
    return pred


def _baselines(key, data: PlanDataset, plans, folds, config, horizon) -> list[dict]:
    """The majority plan, the state-only decoder and the optimal policy's plan as pending runs."""

    def majority(fold):
        return np.tile(majority_plan(plans[fold.train]), (len(fold.test), 1))

    out = [{"kind": "majority_plan", "name": f"{key}/majority_plan",
            "pred": _by_fold(folds, plans.shape, majority)}]  # fmt: skip
    if config.state_baselines and data.agent_row_col is not None and data.goal_row_col is not None:
        sizes = np.zeros(len(plans)) if data.sizes is None else data.sizes
        features = state_features(data.agent_row_col, data.goal_row_col, sizes)

        def state_only(fold):
            decoder = StatePlanDecoder(random_state=config.random_state)
            return decoder.fit(features[fold.train], plans[fold.train]).predict(features[fold.test])

        out.append({"kind": "state_only", "name": f"{key}/state_only",
                    "pred": _by_fold(folds, plans.shape, state_only)})  # fmt: skip
    if config.state_baselines and data.optimal_plans is not None:
        out.append({"kind": "optimal_policy", "name": f"{key}/optimal_policy",
                    "pred": truncate_plans(data.optimal_plans, horizon)})  # fmt: skip
    return out


def _folds(config: PlanSweepConfig, grid_ids: np.ndarray, sizes, key: str) -> list[GridSplit]:
    """The single split, or the K folds of cross-fitting; raises when a part is empty."""
    kw: dict[str, Any] = {
        "validation_fraction": config.validation_fraction,
        "stratify": sizes,
        "random_state": config.random_state,
    }
    if config.n_folds >= 2:
        folds = grid_folds(grid_ids, config.n_folds, **kw)
    else:
        folds = [split_by_grid(grid_ids, test_fraction=config.test_fraction, **kw)]
    for fold in folds:
        for part, rows in zip(SPLIT_NAMES, (fold.train, fold.validation, fold.test), strict=True):
            if len(rows) == 0:
                raise ValueError(
                    f"{key}: the {part} split is empty ({len(np.unique(grid_ids))} grids); "
                    "use more grids"
                )
    return folds


def _part_info(rows: np.ndarray, grid_ids: np.ndarray) -> dict:
    grids = "\n".join(sorted(str(v) for v in np.unique(grid_ids[rows])))
    return {
        "n_rows": int(len(rows)),
        "n_grids": int(len(np.unique(grid_ids[rows]))),
        "grid_ids_sha256": hashlib.sha256(grids.encode()).hexdigest(),
    }


def _split_info(folds: list[GridSplit], grid_ids: np.ndarray) -> dict:
    """Rows and grids per part (and per fold with cross-fitting)."""

    def parts(f: GridSplit) -> dict:
        rows = (f.train, f.validation, f.test)
        return {part: _part_info(r, grid_ids) for part, r in zip(SPLIT_NAMES, rows, strict=True)}

    if len(folds) == 1:
        return parts(folds[0])
    test = np.sort(np.concatenate([f.test for f in folds]))
    return {
        "n_folds": len(folds),
        "test": _part_info(test, grid_ids),
        "folds": [parts(f) for f in folds],
    }


def _score(pending, plans, folds, data: PlanDataset, stage, layer, config) -> list[PlanRun]:
    """Score every run on the test rows, overall and by size and density, and judge every
    decoder (:class:`PlanRun`)."""
    test = np.sort(np.concatenate([f.test for f in folds]))
    target, ids = plans[test], np.asarray(data.grid_ids)[test]
    groups = [None if g is None else np.asarray(g)[test] for g in (data.sizes, data.densities)]
    hits = {r["name"]: prefix_hits(r["pred"][test], target) for r in pending}
    baselines = [r["name"] for r in pending if r["kind"] != "decoder"]
    departing = None if data.departs is None else np.asarray(data.departs)[test]
    metric_kw = _metric_kw(config)
    kw = {
        "n_resamples": config.n_bootstrap,
        "confidence": config.confidence_level,
        "random_state": config.random_state,
    }
    out = []
    for r in pending:
        pred = r.pop("pred")[test]
        by_size, by_density = (
            {} if g is None else plan_metrics_by_group(pred, target, ids, g, **metric_kw)
            for g in groups
        )
        m = plan_metrics(pred, target, ids, **metric_kw)
        verdicts, departure = [], None
        if departing is not None:
            departure = {
                "n_rows": int(departing.sum()),
                "accuracy_n1": grid_bootstrap_ratio(
                    hits[r["name"]][departing, 0], None, ids[departing], **kw
                )
                if departing.any()
                else None,
            }
        if r["kind"] == "decoder":
            judged = {name: hits[name] for name in [r["name"], *baselines]}
            verdicts = [
                {**v, "role": "descriptive"} for v in prefix_verdicts(judged, r["name"], ids, **kw)
            ]
            if departure is not None:
                first = prefix_verdicts(
                    judged, r["name"], ids, rows=departing, horizons=range(1, 2), **kw
                )
                departure["verdict_n1"] = {**first[0], "role": "verdict"}
        scores: dict[str, Any] = {"metrics": m, "by_size": by_size, "by_density": by_density}
        scores.update(verdicts=verdicts, departures=departure)
        out.append(PlanRun(**r, stage=stage, layer=layer, **scores))
    return out
