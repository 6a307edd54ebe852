"""``goalprobe grids``: generate a seeded grid set and write it as JSONL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer import Option

from goalprobe.commands.common import OverwriteOption, check_new_output, parse_list

MAX_GRIDS = 1_000_000
"""Most grids one file holds (about 1 GB of JSONL at 15 x 15)."""


def command(
    out: Annotated[Path, Option("--out", help="Output grid-set JSONL file.")],
    sizes: Annotated[
        str, Option("--sizes", help="Comma-separated odd grid sides (>= 5).")
    ] = "7,9,11,13,15",
    densities: Annotated[
        str, Option("--densities", help="Comma-separated obstacle densities in [0, 1].")
    ] = "0,0.2,0.4,0.6,0.8,1.0",
    per_cell: Annotated[
        int, Option("--per-cell", min=1, help="Grids per (size, density) cell.")
    ] = 10,
    variant: Annotated[
        str,
        Option(
            "--variant",
            help="plain, key_door, key_no_door, key_door_control, two_path_key or two_path_no_key.",
        ),
    ] = "plain",
    seed: Annotated[int, Option("--seed", help="Base seed of the grid set.")] = 0,
    min_distance: Annotated[
        int,
        Option("--min-distance", min=1, help="Minimum start-goal path length (plain grids)."),
    ] = 1,
    overwrite: OverwriteOption = False,
) -> None:
    """Generate a seeded grid set (sizes x densities x per-cell grids) and write it as JSONL."""
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
    from goalprobe.gridworld.io import write_grid_set
    from goalprobe.gridworld.optimal import solve
    from goalprobe.gridworld.variants import VARIANTS

    check_new_output(out, overwrite, "--out")
    if variant not in VARIANTS:
        raise typer.BadParameter(
            f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}",
            param_hint="--variant",
        )
    size_list = parse_list(sizes, int, "--sizes")
    density_list = parse_list(densities, float, "--densities")
    n_grids = len(size_list) * len(density_list) * per_cell
    if n_grids > MAX_GRIDS:  # days of work and a full disk: refused before any starts
        raise typer.BadParameter(
            f"the grid set's size {n_grids:,} is more than {MAX_GRIDS:,}; split the job into "
            "several runs",
            param_hint="--per-cell",
        )
    try:
        config = GridSetConfig(
            sizes=size_list,
            densities=density_list,
            n_per_cell=per_cell,
            variant=variant,
            seed=seed,
            min_distance=min_distance,
        )
        grids = generate_grid_set(config)
    except (TypeError, ValueError) as err:
        raise typer.BadParameter(str(err)) from err
    count = write_grid_set(out, grids)

    lengths: dict[tuple[int, float | None], list[int]] = {}
    for grid in grids:
        lengths.setdefault((grid.size, grid.density), []).append(solve(grid).shortest_path_length)
    table = Table(
        title=f"{count} grids ({variant}, seed {seed}) -> {out}",
        caption="each cell: count / mean shortest path length L",
    )
    table.add_column("size", justify="right")
    for density in config.densities:
        table.add_column(f"d={density:g}", justify="right")
    for size in config.sizes:
        cells = [lengths.get((size, density), []) for density in config.densities]
        table.add_row(str(size), *(f"{len(v)} / {np.mean(v):.1f}" if v else "0 / -" for v in cells))
    Console().print(table)
