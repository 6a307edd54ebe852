"""``goalprobe demo``: run the whole study (on both bundled agents, or on the model named) and
write RUN/report.html."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer import Option

from goalprobe.commands.common import model_format, user_error


def command(
    run_dir: Annotated[
        Path, Option("--run-dir", help="Run directory (created; reruns resume it).")
    ] = Path("runs/demo"),
    scale: Annotated[
        str,
        Option(
            help="tiny (CI, ~1 min), default (~14 min on 2 idle CPU cores) or paper (the study's "
            "sizes and counts; for a GPU)."
        ),
    ] = "default",
    model: Annotated[
        str | None,
        Option(
            help="Agent: a bundled agent ('bundled', 'bundled:map'), a local model directory or "
            "a Hugging Face id (also the model replayed for extraction and patching; with "
            "--backend server, the served model). Run alone; without it (local engine) the "
            "default agent 'bundled' runs with the positive control 'bundled:map' beside it."
        ),
    ] = None,
    backend: Annotated[
        str,
        Option(
            help="Rollout engine: local (in this process), server, or oracle (the optimal "
            "policy writes the episodes in the model's chat format, with a few random moves; "
            "the model itself only runs the activation stages: the pipeline on a model that "
            "cannot do the task yet, e.g. a random one)."
        ),
    ] = "local",
    base_url: Annotated[
        str | None,
        Option(help="OpenAI-compatible endpoint for --backend server (.../v1)."),
    ] = None,
    force: Annotated[
        list[str] | None,
        Option(
            "--force",
            help="Redo a stage even when cached (repeatable; 'all' redoes everything). Later "
            "stages rerun when its outputs change.",
        ),
    ] = None,
    settings: Annotated[
        list[str] | None,
        Option(
            "--set",
            help="Override one config field: section.field=value (value as JSON, else text; "
            "repeatable), e.g. --set rollouts.temperature=0 --set keys.episodes_per_grid=2.",
        ),
    ] = None,
    device: Annotated[str, Option(help="cpu or cuda (local model).")] = "cpu",
    seed: Annotated[int, Option(help="Seed of everything.")] = 0,
    progress: Annotated[bool, Option(help="Show progress bars.")] = True,
    allow_truncation: Annotated[
        bool,
        Option(
            "--allow-truncation",
            help="Run the rollouts even when the pre-flight (models other than the bundled "
            "ones) finds more than 5% of steps cut off by the token budget.",
        ),
    ] = False,
    generation_only: Annotated[
        bool,
        Option(
            "--generation-only",
            help="Run only the stages that load no weights (with --backend server: the "
            "server's generation), then stop. The one-GPU workflow: this first, then stop the "
            "server and rerun without it (e.g. with --device cuda) for the weight stages.",
        ),
    ] = False,
    jobs: Annotated[
        int | None,
        Option(
            min=1,
            max=64,
            help="Stages run at once in worker processes (default: 2 on a CPU with 2+ cores, "
            "1 on a GPU); 1 runs them in this process, in order.",
        ),
    ] = None,
) -> None:
    """Run the study end to end: grids, rollouts, iso-difficulty and key variants, activations,
    cell-type and distance probes, plan decoder, patching, belief scoring and MEG.

    Without --model, the default agent runs in RUN/ and the positive control (the map agent,
    whose agent, goal and local map are at the pre-reasoning anchors by construction) runs its
    behaviour and representational stages in RUN/control/; the report shows them side by side.

    Stages are cached in RUN/stages/ (a rerun skips finished ones; an interrupted run resumes).
    Writes RUN/report.html (self-contained) and ends with one line per headline verdict, the
    report's path and the `goalprobe view RUN` command that opens the run in the viewer.
    """
    from rich.console import Console

    from goalprobe.agents.bundled import DEFAULT_BUNDLED
    from goalprobe.config import control_config, demo_config
    from goalprobe.demo import check_force, default_jobs, run_demo
    from goalprobe.report.summary import terminal_summary
    from goalprobe.scheduler import RunStopped

    console = Console()

    def build(chat_format=None):
        return demo_config(
            scale,
            model=model or DEFAULT_BUNDLED,
            backend=backend,
            base_url=base_url,
            device=device,
            seed=seed,
            overrides=dict(parse_setting(text) for text in settings or ())
            | ({"preflight.allow_truncation": True} if allow_truncation else {}),
            chat_format=chat_format,
        )

    try:
        config = build()
        stages_forced = check_force(force or ())
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    if run_dir.exists() and not run_dir.is_dir():
        raise typer.BadParameter(f"{run_dir} exists and is not a directory", param_hint="--run-dir")
    # a model that cannot be loaded fails here, once, before any stage runs; its format enters
    # the cache keys and the budgets (no format: one error, no weights)
    config = build(model_format(config.agent.model))
    control = control_config(config) if model is None and backend == "local" else None
    if backend == "server":
        check_server_if_needed(run_dir, config, stages_forced)
    try:
        result = run_demo(
            run_dir,
            config,
            force=stages_forced,
            progress=progress,
            log=lambda line: console.print(line, markup=False, highlight=False),
            jobs=jobs or default_jobs(device),
            control=control,
            generation_only=generation_only,
        )
    except RunStopped as err:  # a pre-flight refusal: no other stage spends generation time
        raise user_error(str(err)) from err
    typer.echo(stage_tally(result, scale))
    for name, error in result.failed.items():
        typer.echo(f"  {name}: {' '.join(str(error).split())}"[:200])
    # plain echo, not rich: the summary fits 80 columns and the view command never wraps
    for line in terminal_summary(run_dir, with_control=result.control is not None):
        typer.echo(line)
    if result.failed:
        typer.echo(f"{len(result.failed)} stage(s) did not finish", err=True)
        raise typer.Exit(code=1)


def check_server_if_needed(run_dir: Path, config, force: set[str]) -> None:
    """Before any stage runs, the server must answer with token ids, unless every stage that
    generates on it is cached (the second call of the one-GPU workflow: the server stopped,
    the weight stages to run). Exits 2 with one ``error: --base-url: ...`` line otherwise."""
    from goalprobe.agents.agent_config import Agent
    from goalprobe.agents.server_backend import ServerError
    from goalprobe.demo import stages_to_run
    from goalprobe.stages import SERVER_STAGES

    if not stages_to_run(run_dir, config, SERVER_STAGES, force):
        typer.echo("every generation stage is cached: the server is not needed")
        return
    try:
        Agent(config.agent).check_server()
    except ServerError as err:
        raise user_error(f"--base-url: {err}") from err


def stage_tally(result, scale: str) -> str:
    """One line: how many stages ran, came from the cache or failed, and the wall time."""
    from collections import Counter

    counts = Counter(o.status for o in result.stages.values())
    if result.control is not None:
        counts.update(o.status for o in result.control.stages.values())
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"goalprobe demo ({scale}): {result.seconds:.0f} s; stages {parts}"


def parse_setting(text: str) -> tuple[str, object]:
    """``"section.field=value"`` -> ``("section.field", value)``: the value as JSON (lists
    become tuples, as configs hold them), else as text."""
    import json

    path, sep, raw = text.partition("=")
    if not sep or not path.strip():
        raise ValueError(f"--set {text!r}: expected section.field=value")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return path.strip(), tuple(value) if isinstance(value, list) else value
