"""The wall rows of the headline and report (issue 39): both frames from the probes stage's wall
read-out file, in the declared Holm family; a verdict without shown power reads "undecided",
never "no"; a "no" carries the effect its design could detect."""

from __future__ import annotations

import copy

import pytest
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.wall_planting import PowerDesign, as_probe_data, demo_layouts, planted_walls
from goalprobe.probes.wall_test import WallTestConfig, wall_readout, wall_verdict

from goalprobe.report import write_report
from goalprobe.report.causal_rows import wall_auc_power
from goalprobe.report.headline import headline_rows
from goalprobe.report.readers import Reading
from goalprobe.report.row_specs import family
from goalprobe.run_layout import RunLayout
from goalprobe.stages.context import write_json
from goalprobe.stages.wall_readouts import WALL_READOUTS_SCHEMA


@pytest.fixture(scope="module")
def planted_readout():
    """Agent-centred walls planted strongly, none in the absolute frame: the agent frame must
    say "yes"; the absolute frame, with no power for this small design, "undecided"."""
    design = PowerDesign(n_grids=64, sizes=(7, 9), densities=(0.4, 0.8), grid_seed=8)
    planted = planted_walls(
        demo_layouts(design), frame="agent", strength=3.0, sizes=design.sizes, d_model=32
    )
    data = as_probe_data(planted)
    split = split_by_grid(data.grid_ids, test_fraction=0.3, stratify=data.grid_sizes)
    return wall_readout(data, split, config=WallTestConfig(n_bootstrap=100), power=None)


def _run(tmp_path, readout, power=None):
    layout = RunLayout(tmp_path / "run")
    entry = {
        "store": "probing",
        **readout,
        "stage": "pre_reasoning",  # planted data name no stage of their own
        "power": power or {"applies": False, "reason": "x"},
    }
    write_json(
        layout.wall_readout,
        {"schema": WALL_READOUTS_SCHEMA, "power_file": None, "readouts": [entry]},
    )
    return layout


def test_wall_rows_read_both_frames_and_say_no_only_with_power(tmp_path, planted_readout):
    layout = _run(tmp_path, planted_readout)
    rows = {r.id: r for r in headline_rows(layout.root)}
    assert {"walls.absolute", "walls.agent"} <= set(family("default")) & set(family("control"))
    agent, absolute = rows["walls.agent"], rows["walls.absolute"]
    assert agent.answer == "yes" and "ring 1 (A's 4 neighbours, one step) accuracy" in agent.value
    assert "ring 2 (8 cells two steps away)" in agent.value and "ring" not in absolute.value
    assert "another same-size-and-density grid" in agent.baseline
    assert absolute.answer == "undecided" and "no power shown" in absolute.verdict
    assert absolute.holm_p is not None and absolute.detectable
    # with the committed power of its design the same null result may say "no", with the
    # minimum detectable bits beside it
    power = {"minimum_detectable_strength": 0.5, "bits_at_mds": 0.5}
    withpower = copy.deepcopy(planted_readout)
    withpower["verdicts"]["absolute"] = wall_verdict(
        withpower["frames"]["absolute"]["overall"], power
    )
    assert withpower["verdicts"]["absolute"]["verdict"] == "no"
    layout = _run(tmp_path / "b", withpower, {"applies": True, "reason": "meets the design"})
    row = {r.id: r for r in headline_rows(layout.root)}["walls.absolute"]
    assert row.answer == "no" and row.detectable == "0.500"
    assert "minimum detectable planted strength 0.5" in row.verdict


def test_the_report_shows_both_frames_by_ring(tmp_path, planted_readout):
    layout = _run(tmp_path, planted_readout)
    page = write_report(layout.root).read_text()
    assert "Walls in both frames" in page
    for part in ("ring 1", "ring 2", "ring 3", "ring 6", "absolute", "agent"):
        assert part in page


def test_the_cell_probe_wall_auc_no_without_power_is_undecided():
    reading = Reading("wall AUC", "50%", "prior", answer="no", question="above prior")
    out = wall_auc_power(reading)
    assert out.answer == "undecided" and "power:" in out.baseline and out.reason
    assert wall_auc_power(Reading("x", "y", "z", answer="yes")).answer == "yes"


def test_a_file_no_without_power_is_printed_undecided(tmp_path, planted_readout):
    forged = copy.deepcopy(planted_readout)
    forged["verdicts"]["absolute"] = {
        **forged["verdicts"]["absolute"],
        "verdict": "no",
        "minimum_detectable_bits": None,
    }
    layout = _run(tmp_path, forged)
    row = {r.id: r for r in headline_rows(layout.root)}["walls.absolute"]
    assert row.answer == "undecided" and "no power shown" in row.verdict
