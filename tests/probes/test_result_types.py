"""The TypedDicts of the result JSON files name exactly the keys their writers write."""

from __future__ import annotations

import json
from typing import get_type_hints

import numpy as np
from goalprobe.probes.cell_probes import MajorityCellBaseline
from goalprobe.probes.plan_sweep import PlanSweepConfig, PlanSweepDict, PlanSweepResult
from goalprobe.probes.probe_sweep import (
    ProbeSweepConfig,
    ProbeSweepResult,
    ProbeSweepRun,
    ProbeSweepSplit,
    StoreProbeLoader,
    run_probe_sweep,
)
from goalprobe.probes.scoring.belief_table import BeliefScores, ScoresHeader, group_keys
from goalprobe.probes.scoring.meg_table import MegBody, MegScores
from store_fixtures import make_batch, write_store


def keys(typed_dict) -> set[str]:
    return set(get_type_hints(typed_dict))


def test_the_probe_sweep_json_has_the_keys_of_its_typed_dict(tmp_path):
    rng = np.random.default_rng(1)
    batches = [make_batch(rng, [f"g{i // 4}" for i in range(s, s + 20)], s) for s in (0, 20)]
    store = write_store(tmp_path / "s.h5", batches)
    config = ProbeSweepConfig(layers=(1,), controls=False, n_bootstrap=20)
    out = tmp_path / "sweep"
    result = run_probe_sweep(StoreProbeLoader(store), config, MajorityCellBaseline(), out_dir=out)
    written = json.loads((out / "sweep.json").read_text())
    assert set(written) == set(result) == keys(ProbeSweepResult)
    assert set(written["split"]) == keys(ProbeSweepSplit)
    assert len(written["runs"]) == 1 and set(written["runs"][0]) == keys(ProbeSweepRun)


def test_the_plan_sweep_dict_has_the_keys_of_its_typed_dict():
    result = PlanSweepResult(config=PlanSweepConfig(), decoder_params={}, runs=[], splits={})
    assert set(json.loads(json.dumps(result.to_dict()))) == keys(PlanSweepDict)


def test_the_meg_body_names_every_breakdown_the_grouping_makes():
    breakdowns = group_keys(np.array([5]), np.array([0.2]), np.array(["plain"], dtype=object))
    assert keys(MegBody) == {"probe", "grids", "overall", *breakdowns}
    assert keys(MegScores) == keys(MegBody) | keys(ScoresHeader) | {
        "schema",
        "schema_version",
        "method",
        "per_step",
    }
    assert keys(ScoresHeader) < keys(BeliefScores)
