"""The schedulers of ``goalprobe demo`` (:mod:`goalprobe.demo`): one run directory's stages as
a :class:`StageBook`, run in this process in study order (:func:`run_in_order`) or in worker
processes as soon as their inputs are done (:func:`run_parallel`)."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from goalprobe.config import DemoConfig
from goalprobe.run_layout import RunLayout
from goalprobe.runner import StageResult, StageRunner, fingerprint
from goalprobe.stages import STAGES, needs_weights, reads, server_first, stage, work_after
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Stage
from goalprobe.stats import json_ready

# A pre-flight refusal (:class:`~goalprobe.agents.preflight.PreflightRefused`: the model's token
# budget cuts its steps) says the same of every generation stage: the schedulers stop at it,
# record the stages left as not run and raise :class:`RunStopped` (``goalprobe demo``: one
# ``error:`` line, exit 2). In worker processes the other generation stages wait for the
# pre-flight's stage (:func:`preflight_gate`), so none of them has started when it refuses.

PREFLIGHT_STAGE = "rollouts"
"""The stage that runs the pre-flight."""


class RunStopped(RuntimeError):
    """A stage refused in a way that makes every stage left pointless (:func:`is_fatal`); the
    message is the refusal's, prefixed with the stage."""


def is_fatal(err: BaseException) -> bool:
    """Whether a stage's error stops the whole run: a pre-flight refusal."""
    from goalprobe.agents.preflight import PreflightRefused

    return isinstance(err, PreflightRefused)


def preflight_gate(config: DemoConfig, stages: tuple[str, ...], name: str) -> tuple[str, ...]:
    """The stage ``name`` waits for besides its inputs: with a model that gets a pre-flight, every
    other generation stage starts after :data:`PREFLIGHT_STAGE` (a refusal stops them all)."""
    from goalprobe.agents.bundled import is_bundled
    from goalprobe.stages import SERVER_STAGES

    if name == PREFLIGHT_STAGE or name not in SERVER_STAGES or PREFLIGHT_STAGE not in stages:
        return ()
    if config.preflight.steps < 1 or is_bundled(config.agent.model):
        return ()
    return (PREFLIGHT_STAGE,)


@dataclass(frozen=True)
class StageOutcome:
    """What happened to one stage in :func:`run_demo`: its ``status`` (``"ran"``, ``"cached"``,
    ``"failed"`` or ``"not_run"``: an input failed), the wall ``seconds`` of the run that produced
    its outputs (0 when failed or not run), the ``summary`` it reported and the ``error``."""

    name: str
    status: str
    seconds: float
    summary: dict
    error: str | None = None


@dataclass
class StageBook:
    """One run directory's stages as both schedulers see them: their keys, failures,
    fingerprints and outcomes (``companions``: runs whose every stage this run's report waits
    for and reads, i.e. the positive control's)."""

    layout: RunLayout
    config: DemoConfig
    force: set[str]
    strict: bool
    say: Callable[[str], None]
    stages: tuple[str, ...] = STAGES
    companions: list[StageBook] = field(default_factory=list)
    outcomes: dict[str, StageOutcome] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)
    runner: StageRunner = field(init=False)

    def __post_init__(self) -> None:
        self.runner = StageRunner(self.layout.root, force=self.force)
        if self.config.agent.backend == "server":  # its generation first, then the weight stages
            self.stages = server_first(self.stages)

    def waits_for_server(self, name: str) -> tuple[str, ...]:
        """The server stages ``name`` waits for besides its inputs: with a server, a stage that
        needs the weights starts after every stage of the book that generates."""
        if self.config.agent.backend != "server" or not needs_weights(name):
            return ()
        return tuple(n for n in self.stages if stage(n).generates)

    def stop(self, name: str, error: str, left: list[tuple[StageBook, str]]) -> RunStopped:
        """Record that ``name`` stopped the run (``left``: the stages not finished, recorded
        as not run) and return the error to raise."""
        for book, other in left:
            if other not in book.outcomes:
                book.not_run(other, f"not run: stage {name} stopped the run")
        return RunStopped(f"{name}: {' '.join(error.split())}")

    def blocked(self, name: str) -> bool:
        """Record ``name`` as not run (and return True) when a stage it reads did not finish."""
        failed_inputs = [d for d in reads(name, self.stages) if d not in self.fingerprints]
        if not failed_inputs or stage(name).final:
            return False
        self.not_run(name, f"not run: input stage(s) {', '.join(failed_inputs)} did not finish")
        return True

    @property
    def pool_died(self) -> bool:
        """Whether a stage failed because its worker process died (parallel runs)."""
        return any(o.error == f"failed: {_DIED}" for o in self.outcomes.values())

    def not_run(self, name: str, reason: str) -> None:
        self._unfinished(name, "not_run", reason, {})

    def prepare(self, name: str) -> tuple[Any, dict]:
        """``(what the stage receives, its cache key)``; a forced stage's old outputs go."""
        received, key = self._key(name, self.fingerprints)
        if stage(name).final:
            key["failures"] = {n: o.error for n, o in self.outcomes.items() if o.error}
            for companion in self.companions:
                key[companion.layout.root.name] = {
                    "inputs": dict(companion.fingerprints),
                    "failures": {n: o.error for n, o in companion.outcomes.items() if o.error},
                }
        if name in self.force:
            self.runner.remove_outputs(name)
        return received, key

    def _key(self, name: str, fingerprints: dict[str, str]) -> tuple[Any, dict]:
        received = stage(name).receives(self.config)
        inputs = {d: fingerprints[d] for d in reads(name, self.stages) if d in fingerprints}
        return received, {"config": received, "inputs": inputs}

    def to_run(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """Which of ``names`` (stages of this book other than ``report``) a run now would
        compute rather than take from the cache: forced, without a record matching its key, or
        reading a stage that would run. Reads the records only; writes nothing."""
        wanted = set(names)
        for name in reversed(self.stages):  # with every stage they read
            if name in wanted:
                wanted.update(d for d in reads(name, self.stages) if d in self.stages)
        if any(stage(n).final for n in wanted):
            raise ValueError("to_run does not decide the final stage (the report)")
        fingerprints: dict[str, str] = {}
        runs: set[str] = set()
        for name in self.stages:
            if name not in wanted:
                continue
            if name in self.force or any(d in runs for d in reads(name, self.stages)):
                runs.add(name)
                continue
            hit = self.runner.cached(name, self._key(name, fingerprints)[1])
            if hit is None:
                runs.add(name)
            else:
                fingerprints[name] = hit.summary["fingerprint"]
        return tuple(n for n in self.stages if n in runs and n in names)

    def finished(self, result: StageResult) -> None:
        name = result.name
        self.layout.stage_failure(name).unlink(missing_ok=True)
        self.fingerprints[name] = result.summary["fingerprint"]
        status = "cached" if result.skipped else "ran"
        self.outcomes[name] = StageOutcome(
            name, status, float(result.seconds), dict(result.summary)
        )
        self.say(f"[{name}] " + ("cached" if result.skipped else f"done in {result.seconds:.1f} s"))

    def failed(self, name: str, error: str, trace: str) -> None:
        self._unfinished(name, "failed", f"failed: {error}", {"traceback": trace})

    def _unfinished(self, name: str, status: str, reason: str, details: dict) -> None:
        """Record why ``name`` did not finish (its outcome and ``stages/<name>.failed.json``)."""
        self.outcomes[name] = StageOutcome(name, status, 0.0, {}, reason)
        record = {"stage": name, "status": status, "error": reason, **details}
        write_json(self.layout.stage_failure(name), record)
        self.say(f"[{name}] {reason}")


def run_in_order(books: list[StageBook], progress: bool) -> None:
    """Every stage in this process, in study order (the companions' runs first, so that the
    report that reads them comes after)."""
    for book in [*books[1:], books[0]]:
        context = StageContext(book.layout, progress, tqdm.write if progress else None)
        bar = tqdm(book.stages, desc="goalprobe demo", unit="stage", disable=not progress)
        for name in bar:
            bar.set_postfix_str(name)
            if book.blocked(name):
                continue
            received, key = book.prepare(name)
            function = _stage_function(stage(name), context, received, book.layout)
            try:
                result = book.runner.run(name, key, function)
            except Exception as err:  # recorded, shown in the report, re-raised when strict
                if book.strict:
                    raise
                book.failed(name, f"{type(err).__name__}: {err}", traceback.format_exc())
                if is_fatal(err):
                    left = [(b, n) for b in books for n in b.stages if n not in b.outcomes]
                    raise book.stop(name, str(err), left) from err
                continue
            book.finished(result)
        bar.close()


def run_parallel(books: list[StageBook], jobs: int, progress: bool) -> None:
    """Up to ``jobs`` stages (of any of ``books``) at once in worker processes, each as soon as
    its inputs are done; a run's report also waits for its companions' stages."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    # the ready stage with the most work after it first (study order among equals)
    work = [work_after(book.stages) for book in books]
    ranked = sorted(
        ((-work[i][name], i, j, book, name)
         for i, book in enumerate(books) for j, name in enumerate(book.stages)),
        key=lambda entry: entry[:3],
    )  # fmt: skip
    waiting = [(book, name) for *_, book, name in ranked]
    running: dict[Any, tuple[StageBook, str]] = {}

    def pending(book: StageBook, name: str) -> bool:
        return (book, name) in waiting or (book, name) in running.values()

    def ready(book: StageBook, name: str) -> bool:
        gate = preflight_gate(book.config, book.stages, name)  # a pre-flight's stage first
        waits = (*reads(name, book.stages), *book.waits_for_server(name), *gate)
        if any(pending(book, d) for d in waits):
            return False
        final = stage(name).final
        return not final or not any(pending(c, n) for c in book.companions for n in c.stages)

    bar = tqdm(total=len(waiting), desc="goalprobe demo", unit="stage", disable=not progress)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        jobs, mp_context=spawn, initializer=_init_worker, initargs=(threads,)
    ) as pool:
        while waiting or running:
            for book, name in list(waiting):
                if len(running) >= jobs:
                    break
                if not ready(book, name):
                    continue
                waiting.remove((book, name))
                if book.blocked(name):
                    bar.update()
                    continue
                received, key = book.prepare(name)
                root, module = str(book.layout.root), stage(name).run.__module__
                try:
                    future = pool.submit(
                        _stage_in_worker, root, module, name, key, received, name in book.force
                    )
                except BrokenProcessPool:  # a worker died between two stages
                    book.failed(name, _DIED, traceback.format_exc())
                    bar.update()
                    break
                running[future] = (book, name)
            bar.set_postfix_str(", ".join(name for _, name in running.values()))
            if not running and not any(b.pool_died for b in books):
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED) if running else (set(), None)
            for future in done:
                book, name = running.pop(future)
                try:
                    result, error, trace, fatal = future.result()
                except BrokenProcessPool:  # its worker was killed (e.g. out of memory)
                    result, error, trace, fatal = None, _DIED, traceback.format_exc(), False
                if error is not None:
                    if book.strict:
                        raise RuntimeError(f"stage {name} failed: {error}\n{trace}")
                    book.failed(name, error, trace)
                    if fatal:  # stop: the stages running are ended, the others not started
                        left = [*running.values(), *waiting]
                        for process in list(getattr(pool, "_processes", {}).values()):
                            process.terminate()
                        raise book.stop(name, error, left)
                else:
                    book.finished(result)
                bar.update()
            if any(b.pool_died for b in books):  # the pool is gone: what is left does not run
                for book, name in [*running.values(), *waiting]:
                    book.not_run(name, f"not run: {_DIED}")
                    bar.update()
                break
    bar.close()


_DIED = "a worker process died (killed, or out of memory); rerun goalprobe demo to resume"


_WORKER_CONTEXTS: dict[str, StageContext] = {}
"""Per worker process: one context (and so one loaded agent) per run directory."""


def _init_worker(threads: int) -> None:
    """A worker process's share of the CPU: ``threads`` torch threads and ``threads`` in every
    BLAS pool (threadpoolctl for the pools already loaded, the environment for later ones)."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import scipy.linalg  # noqa: F401  (load scipy's OpenBLAS now, under the limit below)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(limits=threads)


def _stage_in_worker(root: str, module: str, name: str, key: dict, received: Any, forced: bool):
    """Run one stage (declared in ``module``) in a worker: ``(StageResult, None, None, False)``
    or ``(None, error, trace, fatal)``."""
    layout = RunLayout(Path(root))
    context = _WORKER_CONTEXTS.setdefault(root, StageContext(layout, False, None))
    runner = StageRunner(layout.root, force={name} if forced else set())
    try:
        importlib.import_module(module)
        function = _stage_function(stage(name), context, received, layout)
        return runner.run(name, key, function), None, None, False
    except Exception as err:  # sent back to the scheduler, which records it
        return None, f"{type(err).__name__}: {err}", traceback.format_exc(), is_fatal(err)


def _stage_function(spec: Stage, context: StageContext, received, layout: RunLayout):
    threads = spec.torch_threads

    def run(stage_dir: Path):
        # torch_threads: numbers that must not depend on --jobs or the machine's cores
        with nullcontext() if threads is None else fixed_torch_threads(threads):
            outputs, summary = spec.run(context, received, stage_dir)
        return outputs, {
            **json_ready(summary),
            "fingerprint": fingerprint(outputs.values(), layout.root),
        }

    return run


@contextmanager
def fixed_torch_threads(threads: int):
    """Run the block with ``threads`` torch intra-op threads and ``threads`` BLAS/OpenMP threads
    in numpy's, scipy's and torch's native pools (threadpoolctl; restored after). Reductions
    split over another number of threads round differently and probe fits amplify that into
    other verdicts, so a stage that declares ``torch_threads`` runs under it whatever ``--jobs``
    and the core count (oversubscribed BLAS pools are also many times slower)."""
    import scipy.linalg  # noqa: F401  (loads scipy's own OpenBLAS, so that the limit covers it)
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        torch.set_num_threads(before)
