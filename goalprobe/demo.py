"""``goalprobe demo``: the whole study in one run directory, as cached, resumable stages.

Stages run in study order (:data:`goalprobe.stages.STAGES`), each seeing only what its
:class:`~goalprobe.stages.registry.Stage` declaration hands it; its cache key is that (agents
by weights digest and precision) plus the fingerprints of the stages it reads
(:data:`goalprobe.stages.DEPENDS_ON`). A rerun skips a stage whose key matches and whose
outputs exist; ``force`` redoes it, and downstream stages rerun only when its outputs changed.
An interrupted demo resumes; a failing stage is recorded in ``RUN/stages/<stage>.failed.json``
and only the stages that read it are skipped.

The schedulers are in :mod:`goalprobe.scheduler`: with ``jobs > 1`` independent stages run at
once in worker processes, each with ``cpu_count // jobs`` torch threads, a stage starting when
every stage it reads has finished; results are the same as with one job. A ``control`` config
(the positive-control agent) runs its :data:`~goalprobe.stages.CONTROL_STAGES` in
``RUN/control/`` in the same pool, and the report shows both agents side by side.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from goalprobe.config import DemoConfig, demo_config
from goalprobe.run_layout import RunLayout
from goalprobe.runner import demo_provenance, thread_counts
from goalprobe.scheduler import StageBook, StageOutcome, run_in_order, run_parallel
from goalprobe.stages import CONTROL_STAGES, STAGES, needs_weights
from goalprobe.stages.context import write_json


@dataclass(frozen=True)
class DemoResult:
    """The outcome of :func:`run_demo`: the run directory, the config it ran with, each stage's
    :class:`StageOutcome` in run order, ``report_path`` (None when the report failed), the wall
    time, and the positive control's own result (None without one)."""

    run_dir: Path
    config: DemoConfig
    stages: dict[str, StageOutcome]
    report_path: Path | None
    seconds: float
    control: DemoResult | None = None

    @property
    def failed(self) -> dict[str, str]:
        """Stage -> error of every stage that failed or could not run (the control's stages
        prefixed ``control/``)."""
        failed = {n: o.error or o.status for n, o in self.stages.items() if o.error is not None}
        if self.control is not None:
            failed |= {f"control/{n}": e for n, e in self.control.failed.items()}
        return failed


def check_force(force: Iterable[str]) -> set[str]:
    """``force`` as a set of stages (``all`` expanded; an unknown stage is ``ValueError``)."""
    force = set(force)
    if "all" in force:
        return set(STAGES)
    unknown = sorted(force - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; stages are {', '.join(STAGES)}, all")
    return force


def stages_to_run(
    run_dir: str | Path, config: DemoConfig, names: Iterable[str], force: Iterable[str] = ()
) -> tuple[str, ...]:
    """Which of ``names`` a :func:`run_demo` of ``config`` in ``run_dir`` would compute now
    rather than take from the cache (:meth:`goalprobe.scheduler.StageBook.to_run`); writes
    nothing (``goalprobe demo --backend server`` checks the server only when it must)."""
    layout = RunLayout(Path(run_dir))
    names = tuple(names)
    if not layout.stages_dir.is_dir():  # a fresh run: everything runs
        return tuple(n for n in STAGES if n in names)
    book = StageBook(layout, config, check_force(force), False, lambda line: None)
    return book.to_run(names)


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
    control: DemoConfig | None = None,
    generation_only: bool = False,
) -> DemoResult:
    """Run (or resume) the whole study in ``run_dir`` and write ``run_dir/report.html``.

    Args:
        config: what to run; None uses ``demo_config("default")``.
        force: stages to redo even when cached (``"all"``: every stage).
        progress: show progress bars (with ``jobs > 1``, the stage bar only).
        strict: raise the first stage error instead of recording it and going on.
        log: called with one line per stage (default: print).
        jobs: stages run at once (1: in this process, in study order).
        control: a positive-control agent's config, run in ``run_dir/control/`` (its
            :data:`~goalprobe.stages.CONTROL_STAGES`); None: ``config``'s agent alone.
        generation_only: run only the stages that load no weights, neither themselves nor
            through a stage they read (with a server, its generation; no report).

    Raises:
        ValueError: an unknown stage in ``force``, or ``jobs < 1``.
    """
    started = time.perf_counter()
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    config = config or demo_config("default")
    force = check_force(force)
    say = log or print
    layout = RunLayout(Path(run_dir))

    def chosen(stages: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in stages if not (generation_only and needs_weights(n)))

    book = StageBook(layout, config, force, strict, say, stages=chosen(STAGES))
    books = [book]
    if control is not None:
        companion = StageBook(
            layout.control,
            control,
            force & set(CONTROL_STAGES),
            strict,
            lambda line: say(f"control {line}"),
            stages=chosen(CONTROL_STAGES),
        )
        book.companions.append(companion)
        books.append(companion)
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    provenance = demo_provenance(
        jobs=jobs, threads_per_worker=threads or thread_counts()["torch_threads"]
    )
    for each in books:
        each.layout.root.mkdir(parents=True, exist_ok=True)
        write_json(each.layout.demo_config, each.config.to_dict())
        write_json(each.layout.provenance, provenance)
    if jobs == 1:
        run_in_order(books, progress)
    else:
        run_parallel(books, jobs, progress)
    seconds = time.perf_counter() - started
    results = [
        DemoResult(
            run_dir=each.layout.root,
            config=each.config,
            stages={n: each.outcomes[n] for n in each.stages if n in each.outcomes},
            report_path=each.layout.report if each.layout.report.is_file() else None,
            seconds=seconds,
        )
        for each in books
    ]
    return replace(results[0], control=results[1] if len(results) > 1 else None)
