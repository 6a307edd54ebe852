"""``goalprobe train-probe``: cell-type (cognitive map), goal-distance (study 5.1, E) and agent /
goal position probes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer import Argument, Option

from goalprobe.commands.common import (
    OverwriteOption,
    check_device,
    check_new_output,
    check_stored,
    choice,
    parse_list,
    removed_on_error,
)
from goalprobe.viewer.figures.probes import sweep_comparison_figure, sweep_main_metric

if TYPE_CHECKING:
    from rich.table import Table

TARGETS = ("cell-type", "distance", "position")
FAMILIES = ("mlp", "linear", "quadratic")


def command(
    store: Annotated[Path, Argument(help="Activation store (.h5) from `goalprobe extract`.")],
    out: Annotated[
        Path,
        Option("--out", help="Output directory (models/, decoded/, sweep.json, figure)."),
    ],
    target: Annotated[
        str,
        Option(
            help="What to decode: cell-type (cognitive map), distance (to goal) or position "
            "(the agent's and the goal's cell)."
        ),
    ] = "cell-type",
    probe: Annotated[
        str,
        Option(
            help="Cell-type probe family: coordinate ([act, row, col], the study's), per-cell, "
            "or any registered family (goalprobe.probes.families; --target distance: distance)."
        ),
    ] = "coordinate",
    family: Annotated[str, Option(help="mlp or linear (ridge for distance).")] = "mlp",
    stage: Annotated[str, Option(help="Anchor stage of a single run.")] = "pre_reasoning",
    layer: Annotated[int, Option(help="Layer of a single run.")] = 15,
    stages: Annotated[
        str, Option("--stages", help="Comma-separated stages: sweep (overrides --stage).")
    ] = "",
    layers: Annotated[
        str, Option("--layers", help="Comma-separated layers: sweep (overrides --layer).")
    ] = "",
    grid_size: Annotated[
        int | None,
        Option(help="Size-specific probe: only grids of this size, no padding class."),
    ] = None,
    coordinates: Annotated[str, Option(help="raw (study) or onehot cell coordinates.")] = "raw",
    hidden_size: Annotated[int, Option(min=1, help="MLP hidden width.")] = 1024,
    class_balance: Annotated[
        str, Option(help="upsample (study), weighted_loss or none.")
    ] = "upsample",
    alpha: Annotated[float, Option(min=0.0, help="Ridge penalty (linear distance).")] = 1.0,
    lr: Annotated[float, Option(min=0.0, help="AdamW learning rate.")] = 1e-3,
    weight_decay: Annotated[float, Option(min=0.0, help="AdamW weight decay.")] = 1e-2,
    max_epochs: Annotated[int, Option(min=1, help="Maximum training epochs.")] = 20,
    batch_size: Annotated[int, Option(min=1, help="Examples per step.")] = 128,
    patience: Annotated[int, Option(min=1, help="Epochs without improvement.")] = 3,
    test_fraction: Annotated[
        float, Option(min=0.01, max=0.9, help="Fraction of grids held out for testing.")
    ] = 0.2,
    validation_fraction: Annotated[
        float,
        Option(min=0.01, max=0.9, help="Fraction of training grids for early stopping."),
    ] = 0.1,
    controls: Annotated[
        bool, Option(help="Fit the majority/mean and shuffled-label controls.")
    ] = True,
    n_bootstrap: Annotated[
        int, Option(min=1, max=1_000_000, help="Grid-bootstrap replicates.")
    ] = 1000,
    device: Annotated[str, Option(help="cpu or cuda.")] = "cpu",
    seed: Annotated[int, Option(help="Seed of split, probes, shuffle and bootstrap.")] = 0,
    progress: Annotated[bool, Option(help="Show progress bars.")] = True,
    overwrite: OverwriteOption = False,
) -> None:
    """Train probes on an activation store: cell types (cognitive map), distance to the goal, or
    the agent's and goal's positions.

    Splits by grid (one split for all stages and layers), early-stops on validation grids carved
    from the training grids, and scores the test grids with grid-bootstrap 95% intervals against
    the controls (majority class or mean predictor; the same probe on labels shuffled by grid).
    Lists in --stages/--layers run a sweep and print a comparison table. Writes models/
    (safetensors + JSON card), decoded/ (HDF5 maps, cell types), sweep.json and
    sweep_figure.html/.json to --out. --target position fits a logistic regression per
    coordinate of the agent and of the goal (on the same test grids as a cell-type sweep with the
    same --seed and --test-fraction) against the size prior, a uniform guess among open cells
    and the shuffled-position control, and writes positions.json.
    """
    from rich.console import Console

    from goalprobe.probes.families import probe_families
    from goalprobe.probes.probe_sweep import ProbeSweepConfig
    from goalprobe.stages.probes import train_probe

    choice(target, TARGETS, "--target")
    families = probe_families()
    probe = probe.replace("-", "_")
    sweepable = sorted(n for n, f in families.items() if f.target in ("cell_type", "distance"))
    choice(probe, tuple(sweepable), "--probe")
    if target == "distance":
        probe = "distance"
    elif target == "cell-type" and families[probe].target != "cell_type":
        raise typer.BadParameter(
            f"{probe} learns {families[probe].target}, not cell types", param_hint="--probe"
        )
    choice(family, FAMILIES, "--family")
    choice(coordinates, ("raw", "onehot"), "--coordinates")
    choice(class_balance, ("upsample", "weighted_loss", "none"), "--class-balance")
    check_new_output(out, overwrite, "--out", directory=True)
    check_device(device)
    console = Console()
    loader, stage_list, layer_list = _open_store(store, stages, stage, layers, layer)
    if target == "position":
        _position_sweep(loader, stage_list, layer_list, test_fraction, n_bootstrap, seed, out)
        return
    params: dict[str, Any] = dict(  # each family takes those of these it has
        family=family,
        alpha=alpha,
        hidden_size=hidden_size,
        coordinates=coordinates,
        grid_size=grid_size,
        class_balance=class_balance,
        learning_rate=lr,
        weight_decay=weight_decay,
        max_epochs=max_epochs,
        batch_size=batch_size,
        validation_fraction=validation_fraction,
        n_iter_no_change=patience,
        device=device,
        progress=progress,
        random_state=seed,
    )
    config = ProbeSweepConfig(
        stages=stage_list,
        layers=tuple(layer_list),
        grid_size=grid_size,
        test_fraction=test_fraction,
        controls=controls,
        n_bootstrap=n_bootstrap,
        random_state=seed,
    )
    try:
        with removed_on_error(out):
            result = train_probe(store, out, probe, params, config, log=console.log)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="STORE") from err
    console.print(summary_table(result))
    figure = sweep_comparison_figure(result)
    figure.write_html(out / "sweep_figure.html", include_plotlyjs=True)
    figure.write_json(out / "sweep_figure.json")
    console.print(
        f"wrote {out}/: sweep.json, models/, sweep_figure.html"
        + (", decoded/" if result["config"]["target"] == "cell_type" else "")
    )


def _open_store(store: Path, stages: str, stage: str, layers: str, layer: int):
    """The store's probe loader and the stages and layers to sweep, refused unless it holds them
    (``--stages``/``--layers`` lists, else the single ``--stage``/``--layer``)."""
    from goalprobe.activations.store import StoreFormatError
    from goalprobe.probes.probe_sweep import StoreProbeLoader

    try:
        loader = StoreProbeLoader(store)
    except (FileNotFoundError, StoreFormatError) as err:
        raise typer.BadParameter(str(err), param_hint="STORE") from err
    if not len(loader.all_grid_ids):
        raise ValueError(f"{store}: the store holds no rows; nothing to train on")
    stage_list = parse_list(stages, str, "--stages", empty_ok=True) or (stage,)
    layer_list = parse_list(layers, int, "--layers", empty_ok=True) or (layer,)
    return (
        loader,
        check_stored(stage_list, loader.stages, "stages", "--stages"),
        check_stored(layer_list, loader.layers, "layers", "--layers"),
    )


def _position_sweep(loader, stages, layers, test_fraction, n_bootstrap, seed, out: Path) -> None:
    """``--target position``: :func:`goalprobe.probes.position.position_sweep` into ``out/positions.json``
    and a table of top-1 accuracies."""
    import json

    from rich.console import Console
    from rich.table import Table

    from goalprobe.probes.position import POSITION_TARGETS, position_sweep

    console = Console()
    with removed_on_error(out):
        result = position_sweep(
            loader, tuple(stages), tuple(layers), test_fraction=test_fraction,
            n_boot=n_bootstrap, random_state=seed, log=console.log,
        )  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        (out / "positions.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    table = Table(title="position probes (top-1 cell), test grids")
    for header in ("stage", "layer", "test rows", "object", "probe", "size prior", "shuffled",
                   "uniform"):  # fmt: skip
        table.add_column(header)
    for run in result["runs"]:
        for target in POSITION_TARGETS:
            models = run[target]["models"]
            table.add_row(
                run["stage"], str(run["layer"]), str(run["n_test"]), target,
                *(_fmt(models[m]["top1"]) for m in ("probe", "prior_size", "shuffled", "uniform")),
            )  # fmt: skip
    console.print(table)
    console.print(f"wrote {out}/positions.json")


_CELL_COLUMNS = (
    ("accuracy", "acc"),
    ("accuracy_no_padding", "acc (grid)"),
    ("balanced_accuracy", "bal. acc"),
    ("agent_top1", "agent top-1"),
    ("goal_top1", "goal top-1"),
    ("agent_manhattan", "agent dist"),
    ("goal_manhattan", "goal dist"),
)
_DISTANCE_COLUMNS = (("mae", "MAE"), ("r2", "R2"))


def _fmt(entry: dict | None) -> str:
    if not entry or entry.get("value") is None:
        return "-"
    text = f"{entry['value']:.3f}"
    if entry.get("ci_low") is not None:
        text += f" [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"
    return text


def summary_table(result: dict) -> Table:
    """One row per stage and layer: test metrics with 95% intervals and selectivity."""
    from rich.table import Table

    cell = result["config"]["target"] == "cell_type"
    columns = _CELL_COLUMNS if cell else _DISTANCE_COLUMNS
    main = sweep_main_metric(result)
    table = Table(
        title=f"{result['estimator']['class']} ({result['config']['target']}), test grids"
    )
    for header in ("stage", "layer", "test rows", *(label for _, label in columns)):
        table.add_column(header)
    controls = sorted(
        {k.split(" - ")[1] for run in result["runs"] for k in run["metrics"].get("differences", {})}
    )
    for name in controls:
        table.add_column(f"{main} - {name}")
    for run in result["runs"]:
        probe = run["metrics"]["models"]["probe"]
        diffs = run["metrics"].get("differences", {})
        table.add_row(
            run["stage"],
            str(run["layer"]),
            str(run["n_test"]),
            *(_fmt(probe.get(key)) for key, _ in columns),
            *(_fmt(diffs.get(f"probe - {name}", {}).get(main)) for name in controls),
        )
    return table
