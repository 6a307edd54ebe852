"""The stage registry (goalprobe.stages.registry): a stage declared in one module, with one
config section, runs under the demo's schedulers; the tables of goalprobe.stages come from the
declarations.

This module is the toy stage's whole declaration: its config section (``ToySection``, added to
the demo config by ``ToyDemoConfig``), its run function and ``STAGE = register(Stage(...))``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from goalprobe.gridworld.io import read_grid_set

from goalprobe.config import DemoConfig, demo_config
from goalprobe.run_layout import ARTEFACTS, RunLayout
from goalprobe.runner import config_hash, config_to_dict
from goalprobe.scheduler import StageBook, run_in_order, run_parallel
from goalprobe.stages import DEPENDS_ON, MODULES, STAGES, stage
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Stage, register, topological


@dataclass(frozen=True)
class ToySection:
    """The toy stage's config section."""

    weight: int = 3
    """What each grid of the main set counts for."""


@dataclass(frozen=True)
class ToyDemoConfig(DemoConfig):
    """The demo config with the toy stage's section."""

    toy: ToySection = field(default_factory=ToySection)
    """The toy stage."""


def run_toy(context: StageContext, config: ToySection, stage_dir: Path):
    """Count the main grids (the ``grids`` stage's output) and weigh them."""
    grids = list(read_grid_set(context.layout.grids))
    out = write_json(stage_dir / "toy.json", {"score": len(grids) * config.weight})
    return {"toy": out}, {"grids": len(grids)}


STAGE = register(Stage(name="toy", run=run_toy, reads=("grids",), section="toy", seconds=1))


def toy_config(weight: int = 3) -> ToyDemoConfig:
    base = demo_config("tiny")
    sections = {f.name: getattr(base, f.name) for f in dataclasses.fields(DemoConfig)}
    return ToyDemoConfig(**sections, toy=ToySection(weight))


def book(root: Path, config: DemoConfig) -> StageBook:
    return StageBook(RunLayout(root), config, set(), True, lambda line: None, ("grids", "toy"))


def test_the_scheduler_runs_a_stage_declared_in_one_module(tmp_path):
    first = book(tmp_path / "run", toy_config())
    run_in_order([first], progress=False)
    assert {n: o.status for n, o in first.outcomes.items()} == {"grids": "ran", "toy": "ran"}
    grids = first.outcomes["toy"].summary["grids"]
    assert grids > 0
    out = tmp_path / "run" / "toy" / "toy.json"
    assert json.loads(out.read_text()) == {"score": 3 * grids}
    record = json.loads((tmp_path / "run" / "stages" / "toy.json").read_text())
    assert record["config"]["config"] == {"weight": 3}  # its section is its key
    assert set(record["config"]["inputs"]) == {"grids"}  # with what it reads

    again = book(tmp_path / "run", toy_config())
    run_in_order([again], progress=False)
    assert {o.status for o in again.outcomes.values()} == {"cached"}

    changed = book(tmp_path / "run", toy_config(weight=5))  # its section changed: it alone reruns
    run_in_order([changed], progress=False)
    assert {n: o.status for n, o in changed.outcomes.items()} == {"grids": "cached", "toy": "ran"}
    assert json.loads(out.read_text()) == {"score": 5 * grids}


def test_the_parallel_scheduler_runs_it_in_a_worker(tmp_path):
    """A worker process imports the module that declares the stage (this one) to find it."""
    parallel = book(tmp_path / "run", toy_config(weight=2))
    run_parallel([parallel], jobs=2, progress=False)
    assert {n: o.status for n, o in parallel.outcomes.items()} == {"grids": "ran", "toy": "ran"}
    grids = parallel.outcomes["toy"].summary["grids"]
    assert json.loads((tmp_path / "run" / "toy" / "toy.json").read_text()) == {"score": 2 * grids}


def test_a_stage_key_is_its_section_and_not_the_others():
    toy = stage("toy")
    assert toy.receives(toy_config()) == ToySection(3)
    other = dataclasses.replace(toy_config(), behaviour=dataclasses.replace(
        toy_config().behaviour, random_walks_per_grid=7))  # fmt: skip
    assert toy.receives(other) == toy.receives(toy_config())


def test_a_stage_receives_its_sections_by_name_and_is_keyed_by_them():
    keys = stage("keys").receives(toy_config())
    assert keys.keys == toy_config().keys  # a section named like a dict method is the section
    assert keys.agent == toy_config().agent.for_generation()  # a generating stage's agent
    assert keys.rollout.horizon_steps == toy_config().keys.horizon  # a derived value
    assert set(config_to_dict(keys)) == {"keys", "agent", "rollout", "intervals"}
    assert config_hash(keys) == config_hash(stage("keys").receives(toy_config()))


def test_a_registered_stage_is_not_one_of_the_demos():
    """The demo runs the stages of goalprobe.stages.MODULES; another module's stage runs where
    a book names it."""
    assert "toy" not in STAGES and "toy" not in DEPENDS_ON["report"]
    assert STAGES == tuple(MODULES)  # the modules' order is a run order


def test_a_second_stage_of_a_name_is_refused():
    def other(context, config, stage_dir):
        return {}, {}

    with pytest.raises(ValueError, match="already registered"):
        register(Stage(name="grids", run=other))
    with pytest.raises(ValueError, match="generates and loads weights"):
        Stage(name="both", run=other, weights=True, generates=True)


def test_the_tables_come_from_the_declarations():
    for name in STAGES:
        spec = stage(name)
        assert spec.run.__module__ == f"goalprobe.stages.{name}"
        assert DEPENDS_ON[name] == (STAGES[:-1] if spec.final else spec.reads)
        assert all(STAGES.index(d) < STAGES.index(name) for d in DEPENDS_ON[name]), name
        # what it declares it writes is what the run layout says it writes
        assert set(spec.writes) == {a.name for a in ARTEFACTS.values() if a.stage == name}, name


def test_importing_the_stages_package_loads_no_stage():
    """``goalprobe.stages`` itself stays cheap (the headline constants, the registry): the stage
    modules, and torch with them, load when a derived table is first read."""
    import subprocess
    import sys

    code = (
        "import sys, goalprobe.stages as s\n"
        "assert 'torch' not in sys.modules and 'goalprobe.stages.grids' not in sys.modules\n"
        "assert s.HEADLINE_STAGE and s.STAGES[0] == 'grids'\n"
        "assert 'goalprobe.stages.grids' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_run_order_puts_each_stage_after_what_it_reads():
    def spec(name, *reads, final=False):
        return Stage(name=name, run=run_toy, reads=reads, final=final)

    specs = {s.name: s for s in (spec("a"), spec("b", "c"), spec("c", "a"), spec("r", final=True))}
    assert topological(specs, ("r", "a", "b", "c")) == ("a", "c", "b", "r")  # order kept if it can
    specs["a"] = spec("a", "b")
    with pytest.raises(ValueError, match="cycle"):
        topological(specs, ("a", "b", "c"))
    specs["a"] = spec("a", "nowhere")
    with pytest.raises(ValueError, match="unknown stage"):
        topological(specs, ("a",))
