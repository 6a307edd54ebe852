"""``goalprobe view``: the interactive cognitive-map viewer, or a static HTML export of it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer import Argument, Option

from goalprobe.commands.common import OverwriteOption, check_host, check_new_output


def command(
    run_dir: Annotated[
        Path,
        Argument(
            help="Run directory (grids/, rollouts/, activations/, probes/decoded/, plans/, ...).",
            exists=True,
            file_okay=False,
            dir_okay=True,
            resolve_path=True,
        ),
    ],
    port: Annotated[int, Option("--port", min=1, max=65535, help="Port to serve on.")] = 8050,
    host: Annotated[
        str,
        Option(
            "--host",
            help="Interface to bind. The default serves this machine only; any other address "
            "exposes the run's data to the network.",
        ),
    ] = "127.0.0.1",
    export: Annotated[
        Path | None,
        Option(
            "--export",
            help="Write a self-contained static HTML file (plotly.js inlined, no server, no "
            "network) of the selected episodes instead of serving.",
        ),
    ] = None,
    episodes: Annotated[
        str | None,
        Option(
            "--episodes",
            help="Episodes to export, comma-separated GRID_ID:EPISODE or GRID_ID (all its "
            "episodes); default: the first three.",
        ),
    ] = None,
    probe: Annotated[
        str | None,
        Option(
            "--probe",
            help="Decoded-map file stem under probes/decoded/ for the export (default: "
            "pre-reasoning, mlp, middle layer).",
        ),
    ] = None,
    plan: Annotated[
        str | None,
        Option(
            "--plan",
            help="Plan source '<file stem>/<run>' for the export (default: the decoder that "
            "matches the probe's stage and layer).",
        ),
    ] = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Explore a run's decoded cognitive maps, plans and patching step by step in a browser.

    Serves a Dash app on HOST:PORT (127.0.0.1:8050 by default): pick a grid, step through its
    trajectory, and compare the true grid with the decoded map of any probe (stage, layer,
    family), the optimal actions on both, the decoded plan against the executed moves, the
    reasoning text and the step's patching results. A run directory that lacks some artefacts
    still opens and lists what is missing; a trajectory file that exists but is malformed (its
    header and summary lines; every line with --export) or holds no episode is an error, and a
    store extracted from another rollout a loud warning. A folder of run directories (one per
    agent) serves each at /NAME/ with links between them. With --export FILE.html (refused when
    it exists, unless --overwrite), writes a self-contained page of the selected episodes to
    share like a figure, and exits.
    """
    from rich.console import Console

    from goalprobe.viewer.data import RunData, UnknownKeyError, find_runs

    console = Console(stderr=True)
    if export is not None:
        check_new_output(export, overwrite, "--export")
    elif episodes or probe or plan:
        raise typer.BadParameter(
            "--episodes, --probe and --plan choose what --export writes; the server shows every "
            "episode and probe"
        )
    if export is None and not check_host(host):
        console.print(
            f"[bold red]warning[/bold red]: binding {host} makes the viewer (and the run's data) "
            "reachable from other machines"
        )
    runs = find_runs(run_dir)
    if export is None and len(runs) > 0 and run_dir.name not in runs:  # one server for them all
        from goalprobe.viewer.app import create_multi_run_app

        server, _ = create_multi_run_app(run_dir)
        _serve(server, f"{len(runs)} runs ({', '.join(runs)})", host, port, console)
        return
    if export is not None:  # an export reads whole episodes: every line is validated first
        from goalprobe.agents.trajectories import trajectory_stats
        from goalprobe.run_layout import RunLayout

        trajectory_stats(RunLayout(run_dir).trajectories).check_nonempty()
    run = RunData(run_dir)
    # a trajectory file that is unreadable or holds no episode is an error; a missing one only
    # a notice (the viewer still shows the rest)
    notice = next((m for m in run.missing if m.name == "trajectories"), None)
    if notice is not None and notice.reason != "not found":
        raise ValueError(notice.reason)
    if notice is None and not run.episodes:
        raise ValueError(f"{run.layout.trajectories}: holds no finished episode; nothing to view")
    mismatch = run.check_store()
    for missing in run.missing:
        if missing is not mismatch:
            console.print(f"[yellow]missing[/yellow] {missing}")
    if mismatch is not None:
        console.print(f"[bold red]warning[/bold red]: {mismatch}")
    if export is not None:
        from goalprobe.viewer.export import export_html

        specs = [s for s in episodes.split(",") if s.strip()] if episodes else None
        try:
            out = export_html(run, export, episodes=specs, map_source=probe, plan_source=plan)
        except UnknownKeyError as err:
            raise typer.BadParameter(str(err.args[0])) from err
        console.print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
        return
    from goalprobe.viewer.app import create_app

    app = create_app(run_dir)
    what = (
        f"{len(run.episodes)} episodes, {len(run.map_sources)} decoded-map files, "
        f"{len(run.plan_sources)} plan runs"
    )
    _serve(app, what, host, port, console)


def _serve(server, what: str, host: str, port: int, console) -> None:
    """Serve the viewer of ``what`` (its runs or its episodes and files) until Ctrl+C."""
    console.print(f"goalprobe viewer: {what}; serving http://{host}:{port}/ (Ctrl+C stops)")
    server.run(host=host, port=port, debug=False)
