"""Stage ``probes``: cell-type probes on every stored stage x layer, with their controls, on
the main store (``RUN/probes/``: models, decoded maps of the test grids, sweep tables) and on
the probing set (``RUN/probes/probing/``), and the headline probe's learning curve.

The headline (stage, layer, probe) is fixed in advance (:data:`goalprobe.stages.HEADLINE_STAGE`,
:func:`~goalprobe.stages.headline_layer`, :data:`~goalprobe.stages.HEADLINE_PROBE`), never
chosen by test accuracy."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, cast

import numpy as np

from goalprobe.activations.store import ActivationStore
from goalprobe.config import DemoConfig
from goalprobe.probes.families import make_probe, probe_family
from goalprobe.probes.position import position_scores
from goalprobe.probes.probe_sweep import (
    ProbeSweepConfig,
    ProbeSweepResult,
    StoreProbeLoader,
    grid_counts,
    learning_curve,
    run_probe_sweep,
    seed_runs,
)
from goalprobe.probes.serialization import save_probe
from goalprobe.sections import DistanceConfig, ProbesConfig, ProbeTraining
from goalprobe.stages import HEADLINE_PROBE, HEADLINE_STAGE, headline_layer, headline_run
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.decode import write_headline_maps
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.wall_readouts import store_split, wall_readouts


def training_device(config: DemoConfig) -> str:
    """``cuda`` when the agent runs on a CUDA device, else ``cpu``."""
    return "cuda" if config.agent.device.startswith("cuda") else "cpu"


def estimator_params(training: ProbeTraining, device: str, seed: int, progress: bool) -> dict:
    """Keyword arguments every probe and regressor estimator of the demo shares."""
    return dict(dataclasses.asdict(training), device=device, progress=progress, random_state=seed)


def cell_params(kind: str, p: ProbesConfig) -> dict:
    """The cell probes' own hyperparameters (class balance; coordinates for the coordinate
    probe)."""
    params = {"class_balance": p.class_balance}
    if kind == "coordinate":
        params["coordinates"] = p.coordinates
    return params


def train_probe(
    store: Path, out: Path, probe: str, params: dict[str, Any], sweep: ProbeSweepConfig, *, log=None
) -> ProbeSweepResult:
    """The probes analysis on one activation store, the one path of ``goalprobe train-probe``
    and of this stage: the probe family ``probe`` built from ``params``, fitted and scored with
    its controls on every stage x layer of ``sweep`` (empty: every one stored); writes
    ``out/models/``, ``out/decoded/`` (cell types) and ``out/sweep.json``."""
    family = probe_family(probe)
    loader = StoreProbeLoader(store)
    with ActivationStore(store) as opened:  # the anchor stages some row holds
        stages = sweep.stages or opened.stages_with_rows()
    sweep = dataclasses.replace(
        sweep,
        target=cast(Any, family.target),
        stages=stages,
        layers=sweep.layers or tuple(loader.layers),
    )
    return run_probe_sweep(loader, sweep, family.make(**params), out_dir=out, log=log)


def sweep(
    context: StageContext,
    store: Path,
    probe: str,
    params: dict[str, Any],
    out: Path,
    sweep_path: Path,
    section: ProbesConfig | DistanceConfig,
) -> ProbeSweepResult:
    """Run one probe sweep (:func:`train_probe`) on ``store`` over every stage with rows x
    every stored layer, at ``section``'s test fraction, resamples and seed; its table lands at
    ``sweep_path`` (models and decoded test maps under ``out``)."""
    config = ProbeSweepConfig(
        stages=(),
        layers=(),
        test_fraction=section.test_fraction,
        controls=True,
        n_bootstrap=section.n_bootstrap,
        random_state=section.seed,
    )
    result = train_probe(store, out, probe, params, config, log=context.say)
    sweep_path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(out / "sweep.json", sweep_path)
    return result


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Fit every probe kind x family on every stage x layer of the main store (keeping the
    test grids' decoded maps) and of the probing set; then the headline probe's learning
    curve on the probing set."""
    layout, p = context.layout, config.probes
    for folder in (layout.decoded_dir, layout.probe_sweeps, layout.probing_probes):
        for file in [*folder.glob("cell_*"), *folder.glob("headline_*")]:
            file.unlink()
    summary, outputs = {}, {"decoded": layout.decoded_dir}
    for kind in p.types:
        for family in p.families:
            params = dict(
                family=family,
                **cell_params(kind, p),
                **estimator_params(p.training, config.device, p.seed, context.progress),
            )
            name = f"cell_{kind}_{family}"
            for where, store, out, path in targets(
                ("main", layout.store, stage_dir, layout.probe_sweep(name)),
                ("probing", layout.probing_store, layout.probing_probes,
                 layout.probing_probe_sweep(name)),
            ):  # fmt: skip
                result = sweep(context, store, kind, params, out, path, p)
                outputs[f"{where}_{kind}_{family}"] = path
                head = headline_run(result)
                if head is not None:
                    probe = head["metrics"]["models"]["probe"]
                    summary[f"{where}_{kind}_{family}"] = {
                        "run": head["name"],
                        "n_test_grids": head["n_test_grids"],
                        "accuracy_no_padding": probe["accuracy_no_padding"]["value"],
                    }
    outputs["wall_readout"] = write_json(layout.wall_readout, wall_readouts(context, p))
    if not layout.probing_store.is_file():
        return outputs, summary
    kind, family = (
        HEADLINE_PROBE
        if HEADLINE_PROBE in {(k, f) for k in p.types for f in p.families}
        else (p.types[0], p.families[0])
    )
    estimator = make_probe(
        kind,
        family=family,
        **cell_params(kind, p),
        **estimator_params(p.training, config.device, p.seed, False),
    )
    curve = probing_learning_curve(context, estimator, p, config.points)
    outputs["learning_curve"] = write_json(layout.learning_curve, curve)
    outputs["positions"] = write_json(layout.probing_positions, probing_positions(context, p))
    headline = write_headline_maps(layout)
    if headline is not None:
        outputs["headline_maps"] = headline
    if p.headline_seeds > 1:
        seeds = probing_seeds(context, estimator, p)
        outputs["headline_seeds"] = write_json(layout.probing_headline_seeds, seeds)
    return outputs, summary


def probing_seeds(context: StageContext, estimator, p: ProbesConfig) -> dict:
    """The headline probe with ``p.headline_seeds`` training seeds on the probing set (headline
    stage and layer, the sweep's split by grid; controls: the priors), pooled over seeds."""
    layer, data, in_test, config = _headline_data(context, p)
    config = dataclasses.replace(config, shuffled_control=False)
    seeds = range(p.seed, p.seed + p.headline_seeds)
    train, test = np.flatnonzero(~in_test), np.flatnonzero(in_test)
    runs = seed_runs(estimator, data, train, test, config, seeds)
    return {"schema": "goalprobe.headline_seeds/1", "stage": HEADLINE_STAGE, "layer": layer} | runs


def probing_positions(context: StageContext, p: ProbesConfig) -> dict:
    """Agent and goal position probes on the probing set (headline stage and layer, the
    sweep's split by grid), each against the size prior, a uniform guess among the grid's open
    cells and the same probe on positions shuffled between grids of a size."""
    layer, data, test, _ = _headline_data(context, p)
    out = {"schema": "goalprobe.positions/1", "stage": HEADLINE_STAGE, "layer": layer}
    fitted: dict = {}
    scores = position_scores(
        data, test, n_boot=p.n_bootstrap, random_state=p.seed, log=context.say, fitted=fitted
    )
    for target, probe in fitted.items():  # the read-out of the headline decoded maps
        save_probe(
            probe,
            context.layout.position_probe(target),
            source=data.source,
            metrics={"test": scores[target]["models"]["probe"]},
        )
    return out | scores


def targets(*candidates: tuple[str, Path, Path, Path]):
    """The ``(where, store, out, table)`` sweep targets whose store exists (the probing set is
    absent when its stage did not run; the main store always has to be there)."""
    for candidate in candidates:
        if candidate[0] == "main" or candidate[1].is_file():
            yield candidate


def probing_learning_curve(context: StageContext, estimator, p: ProbesConfig, points: int):
    """The headline probe's learning curve on the probing set (headline stage and layer), on
    the sweep's own split by grid."""
    layer, data, in_test, config = _headline_data(context, p)
    train, test = np.flatnonzero(~in_test), np.flatnonzero(in_test)
    n_strata = len(np.unique(data.grid_sizes[train]))
    n_train_grids = len(np.unique(data.grid_ids[train]))
    counts = grid_counts(n_train_grids, points, smallest=min(2 * n_strata + 2, n_train_grids))
    if context.say:
        context.say(f"learning curve: {HEADLINE_STAGE} L{layer}, {counts} training grids")
    curve = learning_curve(data, train, test, estimator, config, counts=counts)
    return {
        "schema": "goalprobe.learning_curve/1",
        "estimator": {"class": type(estimator).__name__, **estimator.get_params()},
        "stage": HEADLINE_STAGE,
        "layer": layer,
        **curve,
    }


def _headline_data(context: StageContext, p: ProbesConfig):
    """The probing set's headline layer, its rows at the headline stage, which of them are
    test rows (:func:`~goalprobe.stages.wall_readouts.store_split`), and the sweep config of
    that stage and layer."""
    loader = StoreProbeLoader(context.layout.probing_store)
    layer = headline_layer(loader.layers)
    data = loader(HEADLINE_STAGE, layer)
    config = ProbeSweepConfig(
        stages=(HEADLINE_STAGE,),
        layers=(layer,),
        test_fraction=p.test_fraction,
        n_bootstrap=p.n_bootstrap,
        random_state=p.seed,
    )
    in_test = np.isin(data.grid_ids, store_split(loader, p.test_fraction, p.seed))
    return layer, data, in_test, config


STAGE = register(
    Stage(
        name="probes",
        run=run,
        reads=("activations", "probing"),
        writes=(
            "probe models",
            "decoded maps",
            "probe sweeps",
            "probing-set probes",
            "learning curve",
            "position probes",
            "headline probe seeds",
            "wall read-out",
        ),
        section="probes",
        derived=lambda c: {"device": training_device(c), "points": c.probing.learning_curve_points},
        control=True,
        seconds=220,
        torch_threads=1,
    )
)
