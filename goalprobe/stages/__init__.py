"""The stages of ``goalprobe demo``: which modules declare them, and the tables derived from
their declarations.

One module per stage (``goalprobe/stages/<stage>.py``) holds the function that runs it and
declares the stage once (``STAGE = register(Stage(...))``, :mod:`goalprobe.stages.registry`).
:data:`MODULES` lists those modules; the run order (:data:`STAGES`), the dependencies
(:data:`DEPENDS_ON`), the server, weight and control sets and the time hints are computed from
their declarations the first time one of them is read (which imports the stage modules, and so
torch). Importing this package alone stays cheap: the headline constants below need nothing.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from goalprobe.stages.registry import Stage, register, registered, topological

__all__ = ["MODULES", "Stage", "needs_weights", "register", "server_first", "stage", "work_after"]

MODULES: tuple[str, ...] = (
    "grids",
    "rollouts",
    "behaviour",
    "iso",
    "keys",
    "harm",
    "fog",
    "intention",
    "false_belief_rollouts",
    "probing",
    "activations",
    "probes",
    "intention_map",
    "distance",
    "plans",
    "decision",
    "patching",
    "attribution",
    "steering",
    "scoring",
    "false_belief",
    "fog_map",
    "report",
)
"""The modules of ``goalprobe.stages`` that declare the demo's stages, in study order (the run
order keeps it where the stages' reads allow). A new stage of the demo is one line here."""

_TABLES: dict[str, Any] = {}
_LOADING: list[bool] = []


def _tables() -> dict[str, Any]:
    """The tables derived from the declarations of :data:`MODULES`' stages (computed once).
    ``RuntimeError`` when a stage module reads a table while they load (read it in the function
    that needs it), or a module of :data:`MODULES` registers no stage of its name."""
    if _LOADING:
        raise RuntimeError("goalprobe.stages' tables were read while its stage modules load")
    if not _TABLES:
        _LOADING.append(True)
        try:
            for module in MODULES:
                importlib.import_module(f"goalprobe.stages.{module}")
        finally:
            _LOADING.clear()
        known = registered()
        missing = [m for m in MODULES if m not in known]
        if missing:
            raise RuntimeError(f"stage module(s) {missing} register no stage of their name")
        order = topological(known, MODULES)
        specs = {name: known[name] for name in order}
        before = tuple(n for n in order if not specs[n].final)
        _TABLES.update(
            STAGES=order,
            DEPENDS_ON={n: before if s.final else s.reads for n, s in specs.items()},
            SERVER_STAGES=tuple(n for n in order if specs[n].generates),
            WEIGHT_STAGES=tuple(n for n in order if specs[n].weights),
            CONTROL_STAGES=tuple(n for n in order if specs[n].control),
            SECONDS_HINT={n: s.seconds for n, s in specs.items()},
        )
    return _TABLES


def __getattr__(name: str) -> Any:
    """The derived tables, computed on first use (PEP 562):

    - ``STAGES``: every stage of the demo, in run order.
    - ``DEPENDS_ON``: the stages whose outputs each stage reads (its key holds their
      fingerprints; the final stage, the report, reads every other).
    - ``SERVER_STAGES``: the stages that generate with the agent's rollout engine (the server,
      with ``--backend server``) and need no weights in the demo's process.
    - ``WEIGHT_STAGES``: the stages that load the weights in the demo's process; with
      ``--backend server`` none starts before every server stage has finished.
    - ``CONTROL_STAGES``: the stages the positive-control agent runs beside the default agent.
    - ``SECONDS_HINT``: rough seconds of each stage at the default scale on 2 cores.
    """
    if name in ("STAGES", "DEPENDS_ON", "SERVER_STAGES", "WEIGHT_STAGES", "CONTROL_STAGES",
                "SECONDS_HINT"):  # fmt: skip
        return _tables()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def stage(name: str) -> Stage:
    """The declaration of stage ``name`` (any registered one; ``KeyError`` for no such stage)."""
    _tables()
    known = registered()
    if name not in known:
        raise KeyError(f"unknown stage {name!r}; stages are {', '.join(known)}")
    return known[name]


def reads(name: str, among: tuple[str, ...]) -> tuple[str, ...]:
    """The stages ``name`` reads: its declared reads, or for a final stage (the report) every
    other stage of ``among``."""
    spec = stage(name)
    return tuple(n for n in among if n != name) if spec.final else spec.reads


def needs_weights(name: str, among: tuple[str, ...] | None = None) -> bool:
    """Whether ``name`` loads the weights or reads a stage of ``among`` (default: every stage)
    that does, directly or not (the report reads every stage)."""
    among = _tables()["STAGES"] if among is None else among
    return stage(name).weights or any(needs_weights(d, among) for d in reads(name, among))


def server_first(stages: tuple[str, ...]) -> tuple[str, ...]:
    """``stages`` with every stage that needs no weights, neither itself nor through a stage it
    reads, moved before those that do (study order kept within each group; still an order in
    which every stage comes after the ones it reads)."""
    return tuple(sorted(stages, key=lambda name: needs_weights(name, stages)))


def work_after(stages: tuple[str, ...]) -> dict[str, float]:
    """Each of ``stages``' own time hint plus the longest chain of hints of the stages among
    ``stages`` that read it, directly or not (the parallel scheduler starts the ready stage with
    the most work after it first: the critical path). ``stages`` is in run order."""
    readers: dict[str, list[str]] = {name: [] for name in stages}
    for name in (n for n in stages if not stage(n).final):
        for dependency in (d for d in stage(name).reads if d in readers):
            readers[dependency].append(name)
    work: dict[str, float] = {}
    for name in reversed(stages):  # readers come later
        work[name] = stage(name).seconds + max((work[r] for r in readers[name]), default=0.0)
    return work


HEADLINE_STAGE = "pre_reasoning"
"""The anchor stage of the headline representational findings (fixed in advance)."""

HEADLINE_PROBE = ("coordinate", "mlp")
"""The probe kind and family of the headline (the study's MLP probe), fixed in advance."""


def headline_layer(layers) -> int:
    """The layer of the headline findings, fixed in advance rather than picked on test data:
    the middle one of the stored layers (the middle block of three by default)."""
    ordered = sorted(int(x) for x in layers)
    if not ordered:
        raise ValueError("no layers stored")
    return ordered[len(ordered) // 2]


def headline_run(result: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The sweep run of the headline stage and layer (None if the sweep has no such run)."""
    runs = [r for r in result["runs"] if r["stage"] == HEADLINE_STAGE]
    if not runs:
        return None
    layer = headline_layer({r["layer"] for r in runs})
    return next(r for r in runs if r["layer"] == layer)


def committed_power() -> dict | None:
    """``probes/wall_power.json`` (package data: the committed power curve of the wall test and
    the headline probe, ``scripts/wall_power.py``), or None where it is absent or unreadable."""
    try:
        text = resources.files("goalprobe.probes").joinpath("wall_power.json").read_text()
        return json.loads(text)
    except (FileNotFoundError, OSError, ValueError):
        return None
