"""The ``steering`` demo stage (issue 39 item 6) on a real tiny run of the positive control
(``bundled:map``): the stage runs under the scheduler after ``probing``, writes its results with
the per-state records, the headline reads its row; and on the same real model and states, an
edit of strength 0 (a direction with no effect) can never say yes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from goalprobe.activations.capture import make_backend
from goalprobe.agents.agent_config import Agent
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.probes.steering import CONDITIONS, SteeringConfig, fit_probe, run_steering, summarise

from goalprobe.config import control_config, demo_config
from goalprobe.run_layout import RunLayout
from goalprobe.scheduler import StageBook, run_in_order
from goalprobe.stages.steering import read_states

pytestmark = pytest.mark.slow

STAGES = ("grids", "rollouts", "probing", "steering")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny scale's stages up to ``steering`` for the positive control."""
    root = tmp_path_factory.mktemp("steering_stage") / "run"
    # a probing set large enough to fit the probe and find edits (the tiny preset's 12 grids x 3
    # states steer none); every other setting the tiny preset's
    overrides = {"probing.grids.n_per_cell": 6, "probing.states.states_per_grid": 6}
    config = control_config(demo_config("tiny", overrides=overrides))
    book = StageBook(RunLayout(root), config, set(), True, lambda _: None, stages=STAGES)
    run_in_order([book], progress=False)
    return root, config


def test_the_stage_steers_test_states_and_the_headline_reads_its_row(tiny_run):
    from goalprobe.report.headline import headline_rows
    from goalprobe.report.page import SECTION_TITLES, write_report

    root, config = tiny_run
    data = json.loads((root / "steering" / "results.json").read_text())
    assert data["schema"] == "goalprobe.steering/1" and data["role"] == "verdict"
    assert data["config"] == json.loads(json.dumps(dataclasses.asdict(config.steering)))
    records = data["records"]
    assert (
        len(records) == data["n_states"]
        and data["n_states"] + sum(data["dropped"].values()) <= data["n_states_offered"]
    )
    for r in records:
        assert set(r["actions"]) == set(CONDITIONS)
        # success is scored against the edited map for every edit
        for c in CONDITIONS:
            a = r["actions"][c]
            expected = a is not None and a in r["edited_optimal"] and a not in r["true_optimal"]
            assert r["success"][c] == expected
        assert r["norm"]["probe"] > 0
    assert data["verdict"] in ("yes", "no", "undecided")
    (row,) = [r for r in headline_rows(root) if r.id == "steering.walls"]
    assert "edited map" in row.finding and row.answer in ("yes", "no", "undecided")
    assert f"n={data['n_states']} states" in row.finding
    page = write_report(root).read_text()
    section = page[page.index('id="steering"') :]
    assert SECTION_TITLES["steering"].split("? ")[1] in section
    assert "probe direction (the wall toggled)" in section.split("</section>")[0]
    assert "Positive control" not in section.split("</section>")[0]  # no control run beside it


def test_an_edit_of_strength_zero_never_says_yes_on_the_real_model(tiny_run):
    """The real agent, the real states, every edit scaled to 0: the probe's, the random and the
    irrelevant edits equal the unedited run, so the test must not find an effect."""
    root, config = tiny_run
    from goalprobe.probes.probe_sweep import StoreProbeLoader

    from goalprobe.stages import headline_layer

    loader = StoreProbeLoader(root / "probing" / "activations.h5")
    layer = headline_layer(loader.layers)
    data = loader("pre_reasoning", layer)
    steering = dataclasses.replace(config.steering, n_bootstrap=200, require_optimal=False)
    probe, calibration = fit_probe(
        data.acts.astype(np.float64), data.cell_types, data.grid_sizes, data.densities,
        data.agent_row_col, data.grid_ids, steering,
    )  # fmt: skip
    calibration = {**calibration, "alpha": [0.0 if a is not None else None
                                            for a in calibration["alpha"]]}  # fmt: skip
    loaded = Agent(config.agent).loaded()
    states = read_states(root / "probing" / "states.jsonl")
    records, dropped = run_steering(
        states, make_backend("hooks", loaded.model, loaded.tokenizer),
        chat_format_for(loaded.tokenizer), probe, calibration, layer, steering,
    )  # fmt: skip
    assert records
    for r in records:
        assert r["actions"]["probe"] == r["actions"]["none"] == r["actions"]["random"]
    out = summarise(records, dropped, SteeringConfig(n_bootstrap=200))
    assert out["verdict"] != "yes"
    assert out["differences"]["random"]["value"] == 0
