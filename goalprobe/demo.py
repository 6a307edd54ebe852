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

With ``jobs > 1`` independent stages run at the same time in worker processes (``spawn``), each
with ``cpu_count // jobs`` torch threads: the bundled agent's generation uses little more than
one core (the second of two adds about 7%, docs/benchmarks.md), so two stages at once nearly
double the throughput of the generation-bound stages. A stage starts when every stage it reads
(:data:`~goalprobe.stages.DEPENDS_ON`, which a test checks against what each stage module
reads) has finished; ready stages start in study order. Results, cache keys and records are the
same as with one job.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

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


def default_jobs(device: str = "cpu") -> int:
    """Stages run at once by default: 2 on a CPU with at least 2 cores (generation leaves the
    second core nearly idle), 1 on an accelerator (stages would compete for its memory)."""
    return 1 if not device.startswith("cpu") or (os.cpu_count() or 1) < 2 else 2


def run_demo(
    run_dir: str | Path,
    config: DemoConfig | None = None,
    force: Iterable[str] = (),
    progress: bool = True,
    *,
    strict: bool = False,
    log: Callable[[str], None] | None = None,
    jobs: int = 1,
) -> DemoResult:
    """Run (or resume) the whole study in ``run_dir`` and write ``run_dir/report.html``.

    Args:
        run_dir: the run directory (created).
        config: what to run; None uses ``demo_config("default")``.
        force: stages to redo even when cached (``"all"`` redoes every stage).
        progress: show the stages' progress bars (rollouts, extraction) and a stage bar (with
            ``jobs > 1``, the stage bar only).
        strict: raise the first stage error instead of recording it and going on.
        log: called with one line per stage (default: print).
        jobs: stages run at once (1: in this process, in study order; see the module
            docstring).

    Raises:
        ValueError: an unknown stage in ``force``, or ``jobs < 1``.
    """
    started = time.perf_counter()
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    config = config or demo_config("default")
    force = check_force(force)
    layout = RunLayout(Path(run_dir))
    layout.root.mkdir(parents=True, exist_ok=True)
    runner = StageRunner(layout.root, force=force)
    write_json(layout.demo_config, config.to_dict())
    book = _Book(layout, config, force, strict, log or print)
    if jobs == 1:
        _run_in_order(book, runner, progress)
    else:
        _run_parallel(book, jobs, progress)
    return DemoResult(
        run_dir=layout.root,
        config=config,
        stages={n: book.outcomes[n] for n in STAGES if n in book.outcomes},
        report_path=layout.report if layout.report.is_file() else None,
        seconds=time.perf_counter() - started,
    )


@dataclass
class _Book:
    """What both schedulers share: the stages' keys, failures, fingerprints and outcomes."""

    layout: RunLayout
    config: DemoConfig
    force: set[str]
    strict: bool
    say: Callable[[str], None]
    outcomes: dict[str, StageOutcome] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)

    def blocked(self, name: str) -> bool:
        """Record ``name`` as not run (and return True) when a stage it reads did not finish."""
        failed_inputs = [d for d in DEPENDS_ON[name] if d not in self.fingerprints]
        if not failed_inputs or name == "report":
            return False
        self.not_run(name, f"not run: input stage(s) {', '.join(failed_inputs)} did not finish")
        return True

    @property
    def pool_died(self) -> bool:
        """Whether a stage failed because its worker process died (parallel runs)."""
        return any(o.error == f"failed: {_DIED}" for o in self.outcomes.values())

    def not_run(self, name: str, reason: str) -> None:
        self.outcomes[name] = StageOutcome(name, "not_run", 0.0, {}, reason)
        write_json(
            self.layout.stage_failure(name), {"stage": name, "status": "not_run", "error": reason}
        )
        self.say(f"[{name}] {reason}")

    def prepare(self, name: str, runner: StageRunner) -> tuple[Any, dict]:
        """``(what the stage receives, its cache key)``; a forced stage's old outputs go."""
        received = stage_module(name).inputs(self.config)
        key = {
            "config": received,
            "inputs": {d: self.fingerprints[d] for d in DEPENDS_ON[name] if d in self.fingerprints},
        }
        if name == "report":
            key["failures"] = {n: o.error for n, o in self.outcomes.items() if o.error}
        if name in self.force:
            runner.remove_outputs(name)
        return received, key

    def finished(self, result: StageResult) -> None:
        name = result.name
        self.layout.stage_failure(name).unlink(missing_ok=True)
        self.fingerprints[name] = result.summary["fingerprint"]
        self.outcomes[name] = _outcome(result)
        self.say(f"[{name}] " + ("cached" if result.skipped else f"done in {result.seconds:.1f} s"))

    def failed(self, name: str, error: str, trace: str) -> None:
        reason = f"failed: {error}"
        self.outcomes[name] = StageOutcome(name, "failed", 0.0, {}, reason)
        record = {"stage": name, "status": "failed", "error": reason, "traceback": trace}
        write_json(self.layout.stage_failure(name), record)
        self.say(f"[{name}] {reason}")


def _run_in_order(book: _Book, runner: StageRunner, progress: bool) -> None:
    """Every stage in this process, in study order."""
    context = StageContext(book.layout, progress, tqdm.write if progress else None)
    bar = tqdm(STAGES, desc="goalprobe demo", unit="stage", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        if book.blocked(name):
            continue
        received, key = book.prepare(name, runner)
        module = stage_module(name)
        try:
            result = runner.run(name, key, _stage_function(module, context, received, book.layout))
        except Exception as err:  # recorded, shown in the report, re-raised when strict
            if book.strict:
                raise
            book.failed(name, f"{type(err).__name__}: {err}", traceback.format_exc())
            continue
        book.finished(result)
    bar.close()


def _run_parallel(book: _Book, jobs: int, progress: bool) -> None:
    """Up to ``jobs`` stages at once in worker processes, each as soon as its inputs are done."""
    runner = StageRunner(book.layout.root, force=book.force)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    waiting, running = list(STAGES), {}
    bar = tqdm(total=len(STAGES), desc="goalprobe demo", unit="stage", disable=not progress)
    pool = ProcessPoolExecutor(
        jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(threads,),
    )
    with pool:
        while waiting or running:
            for name in list(waiting):
                if len(running) >= jobs:
                    break
                if any(d in waiting or d in running.values() for d in DEPENDS_ON[name]):
                    continue
                waiting.remove(name)
                if book.blocked(name):
                    bar.update()
                    continue
                received, key = book.prepare(name, runner)
                root = str(book.layout.root)
                forced = name in book.force
                try:
                    future = pool.submit(_stage_in_worker, root, name, key, received, forced)
                except BrokenProcessPool:  # a worker died between two stages
                    book.failed(name, _DIED, traceback.format_exc())
                    bar.update()
                    break
                running[future] = name
            bar.set_postfix_str(", ".join(running.values()))
            if not running and not book.pool_died:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED) if running else (set(), None)
            for future in done:
                name = running.pop(future)
                try:
                    result, error, trace = future.result()
                except BrokenProcessPool:  # its worker was killed (e.g. out of memory)
                    result, error, trace = None, _DIED, traceback.format_exc()
                if error is not None:
                    if book.strict:
                        raise RuntimeError(f"stage {name} failed: {error}\n{trace}")
                    book.failed(name, error, trace)
                else:
                    book.finished(result)
                bar.update()
            if book.pool_died:  # the pool is gone: what is left does not run
                for name in [*running.values(), *waiting]:
                    book.not_run(name, f"not run: {_DIED}")
                    bar.update()
                break
    bar.close()


_DIED = "a worker process died (killed, or out of memory); rerun goalprobe demo to resume"


_WORKER_CONTEXTS: dict[str, StageContext] = {}
"""Per worker process: one context (and so one loaded agent) per run directory."""


def _init_worker(threads: int) -> None:
    """A worker process's share of the CPU: ``threads`` torch (OpenMP) threads."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(threads)


def _stage_in_worker(root: str, name: str, key: dict, received: Any, forced: bool):
    """Run one stage in a worker: ``(StageResult, None, None)`` or ``(None, error, trace)``."""
    layout = RunLayout(Path(root))
    context = _WORKER_CONTEXTS.setdefault(root, StageContext(layout, False, None))
    runner = StageRunner(layout.root, force={name} if forced else set())
    module = stage_module(name)
    try:
        return runner.run(name, key, _stage_function(module, context, received, layout)), None, None
    except Exception as err:  # sent back to the scheduler, which records it
        return None, f"{type(err).__name__}: {err}", traceback.format_exc()


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
