"""``goalprobe demo``: the whole study in one run directory, as cached, resumable stages.

Stages run in study order (:data:`goalprobe.stages.STAGES`; one module each under
``goalprobe/stages/``). Each stage module has ``inputs(config) -> its config`` and
``run(context, its config, stage_dir) -> (outputs, summary)``; a stage never sees more of the
:class:`~goalprobe.config.DemoConfig` than ``inputs`` hands it, and its cache key is that
config (agents by their identity: weights digest and precision) plus the fingerprints of the
stages it reads (:data:`goalprobe.stages.DEPENDS_ON`). A rerun skips a stage whose key matches
and whose outputs exist; ``force`` redoes it, and the stages downstream rerun only when its
outputs actually changed. An interrupted demo resumes: finished stages are skipped, rollouts
resume per episode, extraction per part. A failing stage is recorded in
``RUN/stages/<stage>.failed.json`` (the report shows it); stages that read it are not run, the
others still run.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tqdm.auto import tqdm

from activations.gridworld.behaviour import finite
from activations.run_layout import RunLayout
from goalprobe.config import DemoConfig, demo_config
from goalprobe.runner import StageResult, StageRunner, fingerprint
from goalprobe.stages import DEPENDS_ON, STAGES
from goalprobe.stages.context import StageContext, write_json


@dataclass(frozen=True)
class StageOutcome:
    """What happened to one stage in :func:`run_demo`.

    Attributes:
        name: the stage.
        status: ``"ran"``, ``"cached"``, ``"failed"`` or ``"not_run"`` (an input failed).
        seconds: wall time of the run that produced the outputs (0 when failed or not run).
        summary: small facts the stage reported (counts, headline figures).
        error: why it failed or did not run (None otherwise).
    """

    name: str
    status: str
    seconds: float
    summary: dict
    error: str | None = None


@dataclass(frozen=True)
class DemoResult:
    """The outcome of :func:`run_demo`.

    Attributes:
        run_dir: the run directory.
        config: the config it ran with.
        stages: stage name -> :class:`StageOutcome`, in run order.
        report_path: ``RUN/report.html`` (None when the report itself failed).
        seconds: wall time of the whole call.
    """

    run_dir: Path
    config: DemoConfig
    stages: dict[str, StageOutcome]
    report_path: Path | None
    seconds: float

    @property
    def failed(self) -> dict[str, str]:
        """Stage -> error of every stage that failed or could not run."""
        return {n: o.error or o.status for n, o in self.stages.items() if o.error is not None}


def stage_module(name: str) -> ModuleType:
    """The module that implements stage ``name``."""
    return importlib.import_module(f"goalprobe.stages.{name}")


def check_force(force: Iterable[str]) -> set[str]:
    """``force`` as a set of stages (``all`` expanded).

    Raises:
        ValueError: an unknown stage.
    """
    force = set(force)
    if "all" in force:
        return set(STAGES)
    unknown = sorted(force - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; stages are {', '.join(STAGES)}, all")
    return force


def run_demo(
    run_dir: str | Path,
    config: DemoConfig | None = None,
    force: Iterable[str] = (),
    progress: bool = True,
    *,
    strict: bool = False,
    log: Callable[[str], None] | None = None,
) -> DemoResult:
    """Run (or resume) the whole study in ``run_dir`` and write ``run_dir/report.html``.

    Args:
        run_dir: the run directory (created).
        config: what to run; None uses ``demo_config("default")``.
        force: stages to redo even when cached (``"all"`` redoes every stage).
        progress: show the stages' progress bars (rollouts, extraction) and a stage bar.
        strict: raise the first stage error instead of recording it and going on.
        log: called with one line per stage (default: print).

    Raises:
        ValueError: an unknown stage in ``force``.
    """
    started = time.perf_counter()
    config = config or demo_config("default")
    force = check_force(force)
    layout = RunLayout(Path(run_dir))
    layout.root.mkdir(parents=True, exist_ok=True)
    say = log or print
    runner = StageRunner(layout.root, force=force)
    context = StageContext(layout, progress, tqdm.write if progress else None)
    write_json(layout.demo_config, config.to_dict())
    outcomes: dict[str, StageOutcome] = {}
    fingerprints: dict[str, str] = {}
    bar = tqdm(STAGES, desc="goalprobe demo", unit="stage", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        failed_inputs = [d for d in DEPENDS_ON[name] if d not in fingerprints]
        failure = layout.stage_failure(name)
        if failed_inputs and name != "report":
            reason = f"not run: input stage(s) {', '.join(failed_inputs)} did not finish"
            outcomes[name] = StageOutcome(name, "not_run", 0.0, {}, reason)
            write_json(failure, {"stage": name, "status": "not_run", "error": reason})
            say(f"[{name}] {reason}")
            continue
        module = stage_module(name)
        received = module.inputs(config)
        key = {
            "config": received,
            "inputs": {d: fingerprints[d] for d in DEPENDS_ON[name] if d in fingerprints},
        }
        if name == "report":
            key["failures"] = {n: o.error for n, o in outcomes.items() if o.error}
        if name in force:
            runner.remove_outputs(name)
        try:
            result = runner.run(name, key, _stage_function(module, context, received, layout))
        except Exception as err:  # recorded, shown in the report, re-raised when strict
            if strict:
                raise
            reason = f"failed: {type(err).__name__}: {err}"
            outcomes[name] = StageOutcome(name, "failed", 0.0, {}, reason)
            write_json(
                failure,
                {
                    "stage": name,
                    "status": "failed",
                    "error": reason,
                    "traceback": traceback.format_exc(),
                },
            )
            say(f"[{name}] {reason}")
            continue
        failure.unlink(missing_ok=True)
        fingerprints[name] = result.summary["fingerprint"]
        outcomes[name] = _outcome(result)
        say(f"[{name}] " + ("cached" if result.skipped else f"done in {result.seconds:.1f} s"))
    bar.close()
    return DemoResult(
        run_dir=layout.root,
        config=config,
        stages=outcomes,
        report_path=layout.report if layout.report.is_file() else None,
        seconds=time.perf_counter() - started,
    )


def _stage_function(module: ModuleType, context: StageContext, received, layout: RunLayout):
    def run(stage_dir: Path):
        outputs, summary = module.run(context, received, stage_dir)
        return outputs, {
            **finite(summary),
            "fingerprint": fingerprint(outputs.values(), layout.root),
        }

    return run


def _outcome(result: StageResult) -> StageOutcome:
    return StageOutcome(
        name=result.name,
        status="cached" if result.skipped else "ran",
        seconds=float(result.seconds),
        summary=dict(result.summary),
    )
