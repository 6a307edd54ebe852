"""``goalprobe merge``: join the shard stores of one extraction into one store, or the shard
trajectory files of one rollout run into one trajectory file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer import Argument, Option

from goalprobe.commands.common import OverwriteOption, check_new_output


def command(
    shards: Annotated[
        list[Path],
        Argument(help="The N shard stores, or trajectory files (.jsonl), in any order."),
    ],
    out: Annotated[
        Path, Option("--out", "-o", help="Merged store (.h5) or trajectory file to write.")
    ],
    compression: Annotated[
        str | None, Option(help="none, lzf or gzip (default: the shards').")
    ] = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Merge `extract --shard i/N` stores, checking every step is covered exactly once, or
    `rollout --shard i/N` trajectory files (.jsonl), checking every episode appears once.

    Rows come out in trajectory-file order, as an unsharded extraction writes them. Some shards
    may be empty (their grids hashed elsewhere); all of them empty is an error.
    """
    from goalprobe.activations.store import ActivationStore, merge_shards

    check_new_output(out, overwrite, "--out")
    if out.resolve() in {s.resolve() for s in shards}:
        raise typer.BadParameter(f"{out} is one of the shards being merged", param_hint="--out")
    if all(s.suffix == ".jsonl" for s in shards):
        from goalprobe.agents.rollout import merge_trajectory_files

        if compression is not None:
            raise typer.BadParameter(
                "trajectory files have no compression", param_hint="--compression"
            )
        n = merge_trajectory_files(shards, out)
        typer.echo(f"{out}: {n} episode(s) from {len(shards)} trajectory file(s)")
        return

    rows = 0
    for shard in shards:
        with ActivationStore(shard) as opened:
            rows += len(opened)
    if not rows:
        raise ValueError(
            f"{', '.join(str(s) for s in shards)}: the shards hold no rows; nothing to merge"
        )
    path = merge_shards(shards, out, compression=compression)
    with ActivationStore(path) as store:
        typer.echo(f"{path}: {len(store)} rows from {len(shards)} shard(s)")
