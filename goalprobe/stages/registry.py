"""The stage registry: what each stage of ``goalprobe demo`` is, declared once, in its module
(``STAGE = register(Stage(...))``; :class:`Stage` lists what a declaration states).

The run order and the other tables of :mod:`goalprobe.stages` are computed from the registered
stages; the scheduler (:mod:`goalprobe.scheduler`) looks each stage up here. A stage's cache key
is what it receives (:meth:`Stage.receives`) and the fingerprints of the stages it reads.
Imports nothing heavy (no torch): stage modules register on import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class Settings(SimpleNamespace):
    """The named config values a stage receives when it reads more than its own section
    (``settings.agent``, ``settings.rollout``); hashed as the dict of its values
    (:func:`goalprobe.runner.config_to_dict`)."""


@dataclass(frozen=True)
class Stage:
    """One stage of the demo, as its module declares it.

    Attributes:
        name: the stage (its outputs live under ``RUN/<name>/``; ``--force <name>``).
        run: ``run(context, received, stage_dir) -> (outputs, summary)``: outputs maps names to
            the paths it wrote (their contents are the stage's fingerprint), summary holds small
            JSON-ready facts.
        reads: the stages whose outputs it reads (it runs after them; their fingerprints are
            part of its key).
        writes: the run-directory artefacts it writes (names of
            :data:`goalprobe.run_layout.ARTEFACTS`).
        section: its own section of the demo config (an attribute of
            :class:`~goalprobe.config.DemoConfig`), or None.
        uses: other config sections it receives (``"agent"``: the agent).
        derived: named values computed from the config that it receives besides its sections
            (e.g. the rollout settings with its own episode count); part of its key.
        weights: it loads the model's weights in the demo's process (extraction, patching,
            decoding).
        generates: it generates with the agent's rollout engine (the server, with
            ``--backend server``); it receives the agent's generation config
            (:meth:`~goalprobe.agents.agent_config.AgentConfig.for_generation`).
        control: the positive-control agent runs it too.
        seconds: rough seconds at the default scale on 2 cores (docs/benchmarks.md); orders
            the ready stages only, never part of a key.
        torch_threads: torch and BLAS threads it computes with whatever ``--jobs`` and the cores
            (:func:`goalprobe.scheduler.fixed_torch_threads`), or None.
        final: it reads every other stage of its run (and of the runs beside it), runs even
            when some failed, and its key holds their failures (the report).
    """

    name: str
    run: Callable[..., tuple[dict[str, Path], dict]]
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    section: str | None = None
    uses: tuple[str, ...] = ()
    derived: Callable[[Any], Mapping[str, Any]] | None = None
    weights: bool = False
    generates: bool = False
    control: bool = False
    seconds: float = 0.0
    torch_threads: int | None = None
    final: bool = False

    def __post_init__(self) -> None:
        if self.weights and self.generates:
            raise ValueError(f"stage {self.name}: generates and loads weights (choose one)")
        if self.name in self.reads:
            raise ValueError(f"stage {self.name} reads itself")

    def receives(self, config: Any) -> Any:
        """What the stage is handed from the demo config (its cache key's config part): its
        section alone when it declares nothing else, its derived value alone when it declares
        only that, else :class:`Settings` of its section, the sections it uses and its derived
        values (by name)."""
        names = (*((self.section,) if self.section else ()), *self.uses)
        if self.derived is None and len(names) == 1 and self.section:
            return getattr(config, self.section)
        if self.derived is not None and not names:
            return self.derived(config)
        received = {name: getattr(config, name) for name in names}
        if self.derived is not None:
            received.update(self.derived(config))
        agent = received.get("agent")
        if self.generates and agent is not None and hasattr(agent, "for_generation"):
            received["agent"] = agent.for_generation()
        return Settings(**received)


_REGISTRY: dict[str, Stage] = {}


def register(stage: Stage) -> Stage:
    """Add ``stage`` to the registry and return it (``STAGE = register(Stage(...))``).

    Raises:
        ValueError: another module registered a stage of that name (a module reloaded
            replaces its own).
    """
    known = _REGISTRY.get(stage.name)
    if known is not None and known.run.__module__ != stage.run.__module__:
        raise ValueError(f"stage {stage.name!r} is already registered by {known.run.__module__}")
    _REGISTRY[stage.name] = stage
    return stage


def registered() -> Mapping[str, Stage]:
    """Every stage registered so far, by name."""
    return dict(_REGISTRY)


def topological(stages: Mapping[str, Stage], order: tuple[str, ...]) -> tuple[str, ...]:
    """``order``'s stages in an order where every stage comes after those it reads, ``order``
    kept where it allows (a final stage last).

    Raises:
        ValueError: a stage reads an unknown stage, or the reads form a cycle.
    """
    for name in order:
        unknown = [d for d in stages[name].reads if d not in stages]
        if unknown:
            raise ValueError(f"stage {name} reads unknown stage(s) {unknown}")
    placed: list[str] = []
    pending = [n for n in order if not stages[n].final]
    while pending:
        ready = next(
            (n for n in pending if all(d in placed or d not in pending for d in stages[n].reads)),
            None,
        )
        if ready is None:
            raise ValueError(f"the stages {pending} read each other in a cycle")
        placed.append(ready)
        pending.remove(ready)
    return (*placed, *(n for n in order if stages[n].final))
