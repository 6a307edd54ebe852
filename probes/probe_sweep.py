"""Probe sweeps over stages and layers of an activation store (``goalprobe train-probe``).

For every (stage, layer): split by grid (one split, stratified by size, for the whole sweep),
fit the probe and its controls (majority class / mean predictor; the probe on labels shuffled by
grid), evaluate on the test grids with grid-bootstrap intervals, and write
``models/<run>.safetensors`` + ``.json``, ``decoded/<run>.h5`` (cell types) and ``sweep.json``
under ``out_dir``. Several stages are also compared pairwise on the test steps they share.

**Learning curves** (:func:`learning_curve`): a probe and its controls against the number of
training grids. A flat curve with the probe at its prior says more than a null on a few dozen
grids; a rising one says "collect more data". For a fixed test split the training grids are
shuffled once (seeded, within sizes, taken round-robin across sizes) and everything is refit on
nested prefixes, each point scored as a sweep run (:func:`fit_and_score`), keeping the metrics
named in ``metrics``.

**Seeds** (:func:`seed_runs`): the headline probe under several training seeds: the same data
and split, the seed of the probe's initialisation and minibatch order varied, every seed's
metrics and the seed-pooled intervals (:func:`goalprobe.stats.seed_pooled`) of the headline
metrics and of their selectivity over the strongest control. A verdict that holds for one seed
but not across seeds is not reported as holding: where the seeds disagree by more than their
own intervals, or some seed says yes and the pool does not, the verdict is ``"unstable"``, not
``"no"``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict

import numpy as np
from goalprobe.activations.extract import sha256_file
from goalprobe.activations.store import ActivationStore
from goalprobe.probes.baselines import CellPrior, Conditioning, GroupMeanRegressor, covariates
from goalprobe.probes.cell_probes import MajorityCellBaseline
from goalprobe.probes.decoded_maps import write_decoded_maps
from goalprobe.probes.metrics import evaluate_cell_maps, evaluate_distance
from goalprobe.probes.serialization import ActivationSource, probe_card, save_probe
from goalprobe.probes.splits import shuffle_by_grid, split_by_grid
from sklearn.base import clone
from sklearn.dummy import DummyRegressor

from goalprobe.stats import Estimate, seed_pooled

Target = Literal["cell_type", "distance"]

SWEEP_SCHEMA = "goalprobe.probe_sweep"
SWEEP_SCHEMA_VERSION = 1


class ProbeSweepRun(TypedDict):
    """One stage x layer of ``sweep.json`` (:func:`run_probe_sweep`)."""

    name: str
    stage: str
    layer: int
    n_train: int
    n_test: int
    n_train_grids: int
    n_test_grids: int
    best_epoch: int | None
    metrics: dict[str, Any]
    model_path: str | None
    decoded_maps_path: str | None


class ProbeSweepSplit(TypedDict):
    """The sweep's one split by grid."""

    n_train_grids: int
    n_test_grids: int


class ProbeSweepResult(TypedDict):
    """``sweep.json`` of a probe sweep (schema :data:`SWEEP_SCHEMA`, version
    :data:`SWEEP_SCHEMA_VERSION`), as :func:`run_probe_sweep` returns and writes it."""

    schema: str
    schema_version: int
    config: dict[str, Any]
    estimator: dict[str, Any]
    split: ProbeSweepSplit
    runs: list[ProbeSweepRun]
    stage_comparisons: list[dict[str, Any]]


@dataclass(frozen=True, eq=False)
class ProbeData:
    """Activations ``(N, 3, d_model)`` and the store's labels of one stage and layer (densities
    NaN where unknown; ``goal_distance`` the shortest-path distance), with their ``source``."""

    acts: np.ndarray
    row_ids: np.ndarray
    grid_ids: np.ndarray
    grid_sizes: np.ndarray
    densities: np.ndarray
    cell_types: np.ndarray
    agent_row_col: np.ndarray
    goal_row_col: np.ndarray
    goal_distance: np.ndarray
    source: ActivationSource

    def subset(self, rows: np.ndarray) -> ProbeData:
        """The rows ``rows`` (positions into this data set)."""
        arrays = {f.name: getattr(self, f.name)[rows] for f in fields(self) if f.name != "source"}
        return ProbeData(**arrays, source=self.source)


_LABELS = (
    "grid_id",
    "grid_size",
    "density",
    "cell_types",
    "agent_row_col",
    "goal_row_col",
    "distance_to_goal",
)


class ProbeLoader(Protocol):
    """``(stage, layer) -> ProbeData`` over one store, exposing every store row's grid id and
    size so that one split by grid serves a whole sweep (:class:`StoreProbeLoader`)."""

    all_grid_ids: np.ndarray
    all_grid_sizes: np.ndarray

    def __call__(self, stage: str, layer: int) -> ProbeData: ...


class StoreProbeLoader:
    """Reads :class:`ProbeData` of the grid ``sizes`` kept (None: all) from an activation store,
    checking the file once, up front; ``checksum`` (sha256) goes into every probe card."""

    def __init__(self, path: str | Path, *, sizes: tuple[int, ...] | None = None) -> None:
        self.path = Path(path)
        self.sizes = sizes
        with ActivationStore(self.path) as store:
            self.stages, self.layers = store.stages, store.layers
            labels = store.labels(["grid_id", "grid_size"])
        self.all_grid_ids = labels["grid_id"].astype(str)
        self.all_grid_sizes = labels["grid_size"].astype(np.int64)
        self.checksum = sha256_file(self.path)

    def __call__(self, stage: str, layer: int) -> ProbeData:
        """Every row holding ``stage`` (and of a kept size), with its labels."""
        with ActivationStore(self.path) as store:
            rows = store.select(stage, sizes=self.sizes)
            if len(rows) == 0:
                raise ValueError(f"{self.path}: no rows hold stage {stage!r} (sizes {self.sizes})")
            labels = store.labels(list(_LABELS), rows)
            acts = store.read(stage, layer, rows)
        return ProbeData(
            acts=acts,
            row_ids=rows,
            grid_ids=labels["grid_id"].astype(str),
            grid_sizes=labels["grid_size"].astype(np.int64),
            densities=labels["density"].astype(np.float64),
            cell_types=labels["cell_types"].astype(np.uint8),
            agent_row_col=labels["agent_row_col"].astype(np.int64),
            goal_row_col=labels["goal_row_col"].astype(np.int64),
            goal_distance=labels["distance_to_goal"].astype(np.float64),
            source=ActivationSource(str(self.path), self.checksum, stage, int(layer)),
        )


@dataclass(frozen=True)
class ProbeSweepConfig:
    """What a probe sweep trains and how it evaluates (the estimator is passed separately)."""

    target: Target = "cell_type"
    """``"cell_type"`` (cognitive map) or ``"distance"`` (shortest-path distance to the goal)."""
    stages: tuple[str, ...] = ("pre_reasoning",)
    """Anchor stages to probe."""
    layers: tuple[int, ...] = (15,)
    """Residual-stream layers to probe."""
    grid_size: int | None = None
    """Keep only grids of this size (for size-specific probes); None keeps all."""
    test_fraction: float = 0.2
    """Fraction of grids held out for testing, within each grid size."""
    controls: bool = True
    """Also fit the controls: the priors a residual stream trivially carries (cells: the per-cell
    majority, the prior by size and by size and density, the uniform localisation guess;
    distances: the mean, by size and by size and density); ``selectivity`` is the probe minus
    the strongest of them."""
    shuffled_control: bool = True
    """With ``controls``: also fit the probe on labels shuffled across grids of a size."""
    n_bootstrap: int = 1000
    """Grid-bootstrap replicates of the confidence intervals."""
    confidence_level: float = 0.95
    """Coverage of the intervals."""
    random_state: int = 0
    """Seed of the split, the label shuffle and the bootstrap."""


def _run_name(config: ProbeSweepConfig, estimator, stage: str, layer: int) -> str:
    from goalprobe.probes.families import family_name

    kind = family_name(estimator) or type(estimator).__name__
    family = estimator.get_params().get("family", "probe")
    size = "" if config.grid_size is None else f"_size{config.grid_size}"
    return f"{config.target}_{kind}_{family}{size}_{stage}_L{layer}"


def fit_and_score(config, estimator, data: ProbeData, train: np.ndarray, test: np.ndarray):
    """Fit the probe (and controls) on ``train`` positions; score on ``test`` positions."""
    tr, te = data.subset(train), data.subset(test)
    y_tr = tr.cell_types if config.target == "cell_type" else tr.goal_distance
    probe = clone(estimator).fit(tr.acts, y_tr, groups=tr.grid_ids)
    controls: dict[str, tuple] = {}  # name -> (fitted control, its test input)
    if config.controls and config.shuffled_control:
        shuffled_y = shuffle_by_grid(
            y_tr, tr.grid_ids, strata=tr.grid_sizes, random_state=config.random_state
        )
        shuffled = clone(estimator).fit(tr.acts, shuffled_y, groups=tr.grid_ids)
        controls["shuffled"] = (shuffled, te.acts)
    if config.controls:
        cov_tr = covariates(tr.grid_sizes, tr.densities)
        cov_te = covariates(te.grid_sizes, te.densities)
        if config.target == "cell_type":
            grid_size = estimator.get_params().get("grid_size")
            majority = MajorityCellBaseline(grid_size=grid_size).fit(tr.acts, y_tr)
            controls["majority"] = (majority, te.acts)
            if grid_size is None:  # a size-specific probe's labels carry no size to condition on
                for by in ("size", "size_density"):
                    controls[f"prior_{by}"] = (CellPrior(by=by).fit(cov_tr, y_tr), cov_te)
        else:
            mean = DummyRegressor(strategy="mean").fit(np.zeros((len(y_tr), 1)), y_tr)
            controls["mean"] = (mean, np.zeros((len(te.acts), 1)))
            by_options: tuple[Conditioning, ...] = ("size", "size_density")
            for by in by_options:
                controls[f"mean_{by}"] = (GroupMeanRegressor(by=by).fit(cov_tr, y_tr), cov_te)
    cells = config.target == "cell_type"

    def output(model, X):
        return (model.predict_proba(X), model.classes_) if cells else model.predict(X)

    preds = {name: output(m, X) for name, (m, X) in {"probe": (probe, te.acts), **controls}.items()}
    test_output = preds["probe"][0] if cells else preds["probe"]
    extra = {"uniform_localisation": config.controls} if cells else {}
    metrics = _evaluate(config, preds, te, "probe", baselines=tuple(controls), **extra)
    return probe, metrics, test_output, te


def _evaluate(config: ProbeSweepConfig, outputs: dict, te: ProbeData, reference: str, **kw):
    """:func:`evaluate_cell_maps` or :func:`evaluate_distance` of ``outputs`` on the rows ``te``."""
    kw.update(
        grid_sizes=te.grid_sizes,
        densities=te.densities,
        reference=reference,
        n_boot=config.n_bootstrap,
        confidence_level=config.confidence_level,
        random_state=config.random_state,
    )
    if config.target != "cell_type":
        return evaluate_distance(outputs, te.goal_distance, te.grid_ids, **kw)
    side = next(iter(outputs.values()))[0].shape[1]
    labels = te.cell_types[:, :side, :side]
    kw.update(agent_row_col=te.agent_row_col, goal_row_col=te.goal_row_col)
    return evaluate_cell_maps(outputs, labels, te.grid_ids, **kw)


def run_probe_sweep(
    loader: ProbeLoader,
    config: ProbeSweepConfig,
    estimator,
    *,
    out_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> ProbeSweepResult:
    """Fit and evaluate ``estimator`` on every stage and layer of ``config``.

    ``estimator``: an unfitted probe for ``config.target``, cloned for every run; ``out_dir``:
    where models, decoded maps and ``sweep.json`` go (None: nothing is written); ``log`` hears a
    line per step. Returns the JSON-ready :class:`ProbeSweepResult`.
    """
    say = log or (lambda message: None)
    split = split_by_grid(
        loader.all_grid_ids,
        test_fraction=config.test_fraction,
        stratify=loader.all_grid_sizes,
        random_state=config.random_state,
    )
    test_grids = set(np.unique(loader.all_grid_ids[split.test]).tolist())
    out = None if out_dir is None else Path(out_dir)
    runs: list[ProbeSweepRun] = []
    outputs: dict = {}
    for stage in config.stages:
        for layer in config.layers:
            name = _run_name(config, estimator, stage, layer)
            say(f"{name}: loading")
            data = loader(stage, layer)
            if config.grid_size is not None:
                data = data.subset(np.flatnonzero(data.grid_sizes == config.grid_size))
                if len(data.acts) == 0:
                    raise ValueError(f"no rows of grid size {config.grid_size} hold {stage!r}")
            in_test = np.isin(data.grid_ids, list(test_grids))
            train, test = np.flatnonzero(~in_test), np.flatnonzero(in_test)
            if len(train) == 0 or len(test) == 0:
                raise ValueError(
                    f"{name}: the split left {len(train)} train / {len(test)} test rows"
                )
            say(f"{name}: fitting on {len(train)} rows, testing on {len(test)}")
            probe, metrics, test_output, te = fit_and_score(config, estimator, data, train, test)
            run: ProbeSweepRun = {
                "name": name,
                "stage": stage,
                "layer": int(layer),
                "n_train": int(len(train)),
                "n_test": int(len(test)),
                "n_train_grids": int(np.unique(data.grid_ids[train]).size),
                "n_test_grids": int(np.unique(data.grid_ids[test]).size),
                "best_epoch": getattr(probe, "best_epoch_", None),
                "metrics": metrics,
                "model_path": None,
                "decoded_maps_path": None,
            }
            if out is not None:
                card_path = save_probe(
                    probe, out / "models" / name, source=data.source, metrics=metrics
                )
                run["model_path"] = str(card_path)
                if config.target == "cell_type":
                    card = probe_card(probe, source=data.source, metrics=metrics)
                    path = write_decoded_maps(
                        out / "decoded" / f"{name}.h5", test_output, te.row_ids, card
                    )
                    run["decoded_maps_path"] = str(path)
            outputs[(stage, int(layer))] = (te, test_output, probe)
            runs.append(run)
    result: ProbeSweepResult = {
        "schema": SWEEP_SCHEMA,
        "schema_version": SWEEP_SCHEMA_VERSION,
        "config": asdict(config),
        "estimator": {"class": type(estimator).__name__, "hyperparameters": estimator.get_params()},
        "split": {
            "n_train_grids": int(np.unique(loader.all_grid_ids[split.train]).size),
            "n_test_grids": len(test_grids),
        },
        "runs": runs,
        "stage_comparisons": _compare_stages(config, outputs),
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    return result


def _compare_stages(config: ProbeSweepConfig, outputs: dict) -> list[dict]:
    """Paired comparison of the first stage with every other, per layer, on shared test steps."""
    comparisons = []
    first, *others = config.stages
    for layer in config.layers:
        for other in others:
            a, b = outputs[(first, int(layer))], outputs[(other, int(layer))]
            shared, ia, ib = np.intersect1d(a[0].row_ids, b[0].row_ids, return_indices=True)
            if len(shared) == 0:
                continue
            te = a[0].subset(ia)
            if config.target == "cell_type":
                pair = {first: (a[1][ia], a[2].classes_), other: (b[1][ib], b[2].classes_)}
            else:
                pair = {first: a[1][ia], other: b[1][ib]}
            metrics = _evaluate(config, pair, te, first)
            row = {"layer": int(layer), "stages": [first, other], "n_rows": int(len(shared))}
            comparisons.append({**row, "metrics": metrics})
    return comparisons


CELL_METRICS: tuple[str, ...] = ("accuracy_no_padding", "agent_top1", "goal_top1", "auc/wall")
"""What a cell-type curve keeps per model (the rest of each point's metrics is dropped)."""

DISTANCE_METRICS: tuple[str, ...] = ("r2", "mae")
"""What a distance curve keeps per model."""


def grid_counts(n_train_grids: int, points: int = 5, smallest: int = 8) -> tuple[int, ...]:
    """Up to ``points`` training-set sizes spaced geometrically from ``smallest`` to every
    training grid (distinct, increasing, the last always ``n_train_grids``)."""
    if n_train_grids < 1:
        raise ValueError("no training grids")
    low = min(smallest, n_train_grids)
    counts = np.unique(np.geomspace(low, n_train_grids, num=max(points, 1)).round().astype(int))
    return tuple(int(c) for c in counts)


def _interleaved_by_size(data: ProbeData, train, train_grids, random_state) -> np.ndarray:
    """The training grids shuffled within each grid size, then taken round-robin across sizes,
    so every prefix holds the sizes in proportion (and the shuffled control, which permutes
    within sizes, has at least two grids per size once the prefix holds two per size)."""
    rng = np.random.default_rng(random_state)
    size_of = dict(zip(data.grid_ids[train], data.grid_sizes[train].tolist(), strict=True))
    by_size = [
        rng.permutation([g for g in train_grids if size_of[g] == size]).tolist()
        for size in sorted(set(size_of.values()))
    ]
    order = [g for rank in itertools.zip_longest(*by_size) for g in rank if g is not None]
    return np.asarray(order, dtype=object)


def learning_curve(
    data: ProbeData,
    train: np.ndarray,
    test: np.ndarray,
    estimator,
    config: ProbeSweepConfig,
    *,
    counts: Sequence[int] | None = None,
    metrics: Sequence[str] | None = None,
) -> dict:
    """Fit and score ``estimator`` and its controls on growing subsets of the training grids.

    ``train``/``test``: row positions in ``data`` (split by grid; the test rows the same for
    every point); ``counts``: numbers of training grids (default :func:`grid_counts`);
    ``metrics``: kept per model (default by target). Returns ``{n_train_grids_total,
    n_test_grids, metrics, points: [{n_train_grids, n_train, models, selectivity}]}``.
    """
    train, test = np.asarray(train), np.asarray(test)
    train_grids = np.unique(data.grid_ids[train])
    if set(train_grids.tolist()) & set(np.unique(data.grid_ids[test]).tolist()):
        raise ValueError("training and test rows share grids; split by grid first")
    counts = tuple(counts) if counts is not None else grid_counts(len(train_grids))
    if not counts or min(counts) < 1 or max(counts) > len(train_grids):
        raise ValueError(f"counts must lie in [1, {len(train_grids)}], got {counts}")
    keep = tuple(metrics or (CELL_METRICS if config.target == "cell_type" else DISTANCE_METRICS))
    order = _interleaved_by_size(data, train, train_grids, config.random_state)
    points = []
    for count in sorted(set(counts)):
        rows = train[np.isin(data.grid_ids[train], order[:count])]
        _, overall, _, _ = fit_and_score(config, estimator, data, rows, test)
        points.append(
            {
                "n_train_grids": int(count),
                "n_train": int(len(rows)),
                "models": {
                    name: {m: values[m] for m in keep if m in values}
                    for name, values in overall["models"].items()
                },
                "selectivity": {
                    m: v for m, v in overall.get("selectivity", {}).items() if m in keep
                },
            }
        )
    return {
        "n_train_grids_total": int(len(train_grids)),
        "n_test_grids": int(np.unique(data.grid_ids[test]).size),
        "metrics": list(keep),
        "points": points,
    }


HEADLINE_METRICS: tuple[str, ...] = ("accuracy_no_padding", "auc/wall", "agent_top1", "goal_top1")
"""The headline rows' metrics."""


def seed_runs(
    estimator,
    data: ProbeData,
    train: np.ndarray,
    test: np.ndarray,
    config: ProbeSweepConfig,
    seeds: Sequence[int],
    metrics: Sequence[str] = HEADLINE_METRICS,
) -> dict:
    """Fit ``estimator`` once per seed (``random_state``) on ``train``, score on ``test``.

    Returns ``{seeds, per_seed: [{seed, metric: {probe, selectivity}}], pooled: {metric:
    {probe, selectivity}}}``, pooled by :func:`~goalprobe.stats.seed_pooled`, with
    ``seeds_disagree`` (:func:`intervals_disjoint`) and, on the selectivity, ``baseline``,
    ``above_baseline`` and :func:`seed_verdict`.
    """
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        seeded = clone(estimator).set_params(random_state=seed)
        _, m, _, _ = fit_and_score(config, seeded, data, train, test)
        scores = {"probe": m["models"]["probe"], "selectivity": m.get("selectivity", {})}
        by_metric = {k: {name: s.get(k) for name, s in scores.items()} for k in metrics}
        per_seed.append({"seed": int(seed), **by_metric})
    pooled = {}
    for k in metrics:
        probe = [s[k]["probe"] for s in per_seed if s[k]["probe"]]
        sel = [s[k]["selectivity"] for s in per_seed if s[k]["selectivity"]]
        if not probe:
            continue
        # every pooled probe metric is a rate or an AUC in [0, 1]; selectivity their difference
        pooled_probe = seed_pooled(probe, config.confidence_level, bounds=(0.0, 1.0))
        pooled_probe["seeds_disagree"] = intervals_disjoint(probe)
        entry: dict[str, Any] = {"probe": pooled_probe, "selectivity": None}
        if sel:
            stat = seed_pooled(sel, config.confidence_level, bounds=(-1.0, 1.0))
            baselines = sorted({s["baseline"] for s in sel})
            stat["baseline"] = baselines[0] if len(baselines) == 1 else "/".join(baselines)
            stat["above_baseline"] = bool(Estimate.from_dict(stat).above(0))
            stat["seeds_disagree"] = intervals_disjoint(sel)
            stat["verdict"] = seed_verdict(sel, stat)
            entry["selectivity"] = stat
        pooled[k] = entry
    return {"seeds": [int(s) for s in seeds], "per_seed": per_seed, "pooled": pooled}


def intervals_disjoint(stats: Sequence[dict]) -> bool:
    """Whether two of the seeds' intervals do not overlap (the seeds disagree by more than
    their own uncertainty): the highest lower bound above the lowest upper bound."""
    bounded = [s for s in stats if s.get("ci_low") is not None and s.get("ci_high") is not None]
    if len(bounded) < 2:
        return False
    return max(s["ci_low"] for s in bounded) > min(s["ci_high"] for s in bounded)


def seed_verdict(per_seed: Sequence[dict], pooled: dict) -> str:
    """The verdict "above the baseline" across the seeds' selectivities and their ``pooled``
    statistic: ``"yes"`` where the pooled interval lies above 0; ``"unstable"`` where it does not
    and the seeds disagree or some seed alone says yes; else ``"no"``."""
    if Estimate.from_dict(pooled).above(0):
        return "yes"
    seed_yes = any(Estimate.from_dict(s).above(0) for s in per_seed)
    if intervals_disjoint(per_seed) or seed_yes:
        return "unstable"
    return "no"
