"""The probes stage's wall read-out (``RUN/probes/wall_readout.json``, schema
``goalprobe.wall_readouts/2``): the conditional wall test in both frames
(:func:`goalprobe.probes.wall_test.wall_readout`) on every store, stage and layer it covers,
with each verdict's power, and the decoded maps' wall probes (both frames, fit on the probing
set's training grids at the headline stage and layer).

Every store is split by grid exactly as its probe sweep is (same test grids, same seed), so the
wall rows and the cell-probe rows read the same held-out grids."""

from __future__ import annotations

import numpy as np

from goalprobe.probes.probe_sweep import StoreProbeLoader
from goalprobe.probes.serialization import save_probe
from goalprobe.probes.splits import GridSplit, split_by_grid
from goalprobe.probes.wall_test import WallTestConfig, design_power, wall_readout
from goalprobe.sections import ProbesConfig
from goalprobe.stages import HEADLINE_STAGE, committed_power, headline_layer
from goalprobe.stages.context import StageContext

WALL_READOUTS_SCHEMA = "goalprobe.wall_readouts/2"
"""``schema`` of ``RUN/probes/wall_readout.json``."""


def store_split(loader: StoreProbeLoader, test_fraction: float, seed: int) -> np.ndarray:
    """The test grids of the store's probe sweep (its split by grid, stratified by size): the
    one split of the probe sweeps, the headline probe's seeds, the position probes, the
    learning curve, the wall read-out and steering, so that they cannot drift apart."""
    split = split_by_grid(
        loader.all_grid_ids,
        test_fraction=test_fraction,
        stratify=loader.all_grid_sizes,
        random_state=seed,
    )
    return np.unique(loader.all_grid_ids[split.test])


def wall_readouts(context: StageContext, p: ProbesConfig) -> dict:
    """The wall read-out of every store of ``p.wall_stores`` present (``probing``, ``main``), at
    every stage of ``p.wall_stages`` it holds and every stored layer; saves the probing set's
    headline-layer wall probes (:meth:`~goalprobe.run_layout.RunLayout.wall_probe`)."""
    layout = context.layout
    power = committed_power()
    stores = {"probing": layout.probing_store, "main": layout.store}
    out: dict = {
        "schema": WALL_READOUTS_SCHEMA,
        "power_file": "probes/wall_power.json" if power else None,
        "readouts": [],
    }
    config = WallTestConfig(n_bootstrap=p.n_bootstrap, random_state=p.seed)
    for where in p.wall_stores:
        path = stores[where]
        if not path.is_file():
            continue
        loader = StoreProbeLoader(path)
        test_grids = store_split(loader, p.test_fraction, p.seed)
        head_layer = headline_layer(loader.layers)
        for stage in (s for s in p.wall_stages if s in loader.stages):
            for layer in loader.layers:
                data = loader(stage, int(layer))
                in_test = np.isin(data.grid_ids, test_grids)
                split = GridSplit(
                    np.flatnonzero(~in_test), np.zeros(0, np.int64), np.flatnonzero(in_test)
                )
                n_test = int(np.unique(data.grid_ids[in_test]).size)
                n_grids = int(np.unique(data.grid_ids).size)
                features = int(np.prod(data.acts.shape[1:]))
                curves, power_info = design_power(power, n_grids, n_test, features)
                fitted: dict = {}
                result = wall_readout(data, split, config=config, power=curves, fitted=fitted)
                out["readouts"].append({"store": where, **result, "power": power_info})
                if context.say:
                    verdicts = ", ".join(
                        f"{f} {v['verdict']}" for f, v in result["verdicts"].items()
                    )
                    context.say(f"walls: {where} {stage} L{layer}: {verdicts}")
                if where == "probing" and stage == HEADLINE_STAGE and int(layer) == head_layer:
                    for frame, probe in fitted.items():
                        save_probe(
                            probe,
                            layout.wall_probe(frame),
                            source=data.source,
                            metrics={"test": result["frames"][frame]["overall"]},
                        )
    return out
