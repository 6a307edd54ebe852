"""``goalprobe train-plan-decoder``: the one-shot plan-decoder capacity sweep (study, sec. 5.3)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer import Argument, Option

from goalprobe.commands.common import (
    OverwriteOption,
    check_device,
    check_new_output,
    check_stored,
    parse_list,
    removed_on_error,
)
from goalprobe.viewer.figures.plans import prefix_accuracy_grid_figure, sweep_runs

if TYPE_CHECKING:
    from rich.table import Table

    from goalprobe.probes.plan_sweep import PlanSweepResult

TABLE_NS: tuple[int, ...] = (1, 2, 3, 4, 5, 10)
"""Prefix lengths shown in the summary table."""


def command(
    store: Annotated[Path, Argument(help="Activation store (.h5) from `goalprobe extract`.")],
    out: Annotated[
        Path, Option("--out", help="Output directory (models, plans HDF5, figure, JSON).")
    ],
    stages: Annotated[
        str,
        Option("--stages", help="Comma-separated anchor stages; empty: every stage with rows."),
    ] = "",
    layers: Annotated[
        str, Option("--layers", help="Comma-separated layers; empty: every stored layer.")
    ] = "",
    decoder_layers: Annotated[
        str, Option("--decoder-layers", help="Comma-separated decoder depths to sweep.")
    ] = "1,2,4",
    control_layers: Annotated[
        str,
        Option(
            "--control-layers",
            help="Decoder depths that also get the shuffled-activation control; empty: none.",
        ),
    ] = "2",
    d_bottleneck: Annotated[int, Option(min=1, help="Bottleneck / decoder width.")] = 1024,
    n_heads: Annotated[int, Option(min=1, help="Attention heads per layer.")] = 8,
    learning_rate: Annotated[float, Option(min=0.0, help="AdamW learning rate.")] = 3e-4,
    weight_decay: Annotated[float, Option(min=0.0, help="AdamW weight decay.")] = 1e-2,
    batch_size: Annotated[int, Option(min=1, help="Training batch size.")] = 64,
    max_epochs: Annotated[int, Option(min=1, help="Maximum training epochs.")] = 100,
    n_iter_no_change: Annotated[
        int, Option(min=1, help="Epochs without validation improvement before stopping.")
    ] = 10,
    dropout: Annotated[float, Option(min=0.0, max=0.99, help="Decoder dropout.")] = 0.1,
    test_fraction: Annotated[
        float, Option(min=0.0, max=0.9, help="Fraction of grids held out for testing.")
    ] = 0.15,
    validation_fraction: Annotated[
        float,
        Option(min=0.0, max=0.9, help="Fraction of non-test grids for early stopping."),
    ] = 0.15,
    first_step_only: Annotated[
        bool,
        Option(
            "--first-step-only",
            help="One example per trajectory (its first step), as in the study; default: "
            "every step.",
        ),
    ] = False,
    n_bootstrap: Annotated[
        int, Option(min=0, help="Grid-bootstrap resamples for the 95% intervals.")
    ] = 1000,
    device: Annotated[str, Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    seed: Annotated[int, Option(help="Seed of split, decoders, shuffle, bootstrap.")] = 0,
    overwrite: OverwriteOption = False,
) -> None:
    """Train one-shot plan decoders (1/2/4 layers x stage x layer) and report prefix accuracy.

    Splits by grid, early-stops on validation loss, scores the test grids against the 0.25^N
    baseline, the majority-plan baseline and a decoder trained on shuffled activations. Writes
    models (safetensors + JSON card), predicted_plans.h5, sweep.json and prefix_accuracy.html
    / .json to --out.
    """
    from rich.console import Console

    from goalprobe.activations.store import StoreFormatError
    from goalprobe.probes.plan_decoder import PlanDecoder
    from goalprobe.probes.plan_sweep import PlanSweepConfig, StorePlanLoader, run_plan_sweep

    console = Console()  # width from the terminal (COLUMNS when not a terminal)
    check_device(device)
    if d_bottleneck % n_heads:
        raise typer.BadParameter(
            f"--d-bottleneck {d_bottleneck} is not divisible by --n-heads {n_heads} (each head "
            "gets d_bottleneck / n_heads dimensions)",
            param_hint="--d-bottleneck",
        )
    if test_fraction + validation_fraction * (1 - test_fraction) >= 1:
        raise typer.BadParameter(
            "--test-fraction and --validation-fraction leave no training grids"
        )
    check_new_output(out, overwrite, "--out", directory=True)
    asked_stages = parse_list(stages, str, "--stages", empty_ok=True)
    asked_layers = parse_list(layers, int, "--layers", empty_ok=True)
    depths = parse_list(decoder_layers, int, "--decoder-layers")
    if min(depths) < 1:
        raise typer.BadParameter("needs positive depths", param_hint="--decoder-layers")
    controls = parse_list(control_layers, int, "--control-layers", empty_ok=True)
    if controls and min(controls) < 1:
        raise typer.BadParameter("needs positive depths", param_hint="--control-layers")
    try:
        loader = StorePlanLoader(store, first_step_only=first_step_only)
    except (FileNotFoundError, StoreFormatError) as err:
        raise typer.BadParameter(str(err), param_hint="STORE") from err
    if not loader.stages:
        raise ValueError(f"{store}: the store holds no rows; nothing to train on")
    config = PlanSweepConfig(
        stages=check_stored(
            asked_stages or tuple(loader.stages), loader.stages, "stages with rows", "--stages"
        ),
        layers=check_stored(
            asked_layers or tuple(loader.layers), loader.layers, "layers", "--layers"
        ),
        decoder_layers=depths,
        control_decoder_layers=controls,
        test_fraction=test_fraction,
        validation_fraction=validation_fraction,
        n_bootstrap=n_bootstrap,
        random_state=seed,
    )
    decoder = PlanDecoder(
        n_heads=n_heads,
        d_bottleneck=d_bottleneck,
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        batch_size=batch_size,
        max_epochs=max_epochs,
        n_iter_no_change=n_iter_no_change,
        dropout=dropout,
        device=device,
        random_state=seed,
    )
    try:
        with removed_on_error(out):
            result = run_plan_sweep(
                loader,
                config,
                decoder,
                out_dir=out,
                overwrite=overwrite,
                log=lambda message: console.log(message),
            )
    except FileExistsError as err:
        raise typer.BadParameter(f"{err}", param_hint="--out") from err

    console.print(summary_table(result))
    figure = prefix_accuracy_grid_figure(sweep_runs(result.to_dict()["runs"]))
    figure.write_html(out / "prefix_accuracy.html", include_plotlyjs=True)
    figure.write_json(out / "prefix_accuracy.json")
    console.print(f"wrote {out}/: sweep.json, predicted_plans.h5, models/, prefix_accuracy.html")


def summary_table(result: PlanSweepResult) -> Table:
    """Rich table of test prefix accuracy (%, 95% grid-bootstrap CI at N=1), over all examples
    and over examples with at least N actions, and the length analysis."""
    from rich.table import Table

    table = Table(
        title="One-shot plan decoding on the test grids: prefix accuracy (%)",
        caption="all: every example; >=N: examples with at least N actions (0.25^N is exact "
        "chance there). len: predicted vs true plan length (censored at T).",
    )
    for name in ("stage", "layer", "predictor", "ep"):
        table.add_column(name)
    table.add_column("N=1 [95% CI]", justify="right")
    for n in TABLE_NS[1:]:
        table.add_column(f"N={n}", justify="right")
    for name in (">=N: N=3", ">=N: N=5", "len exact", "len bias", "med |err|"):
        table.add_column(name, justify="right")
    for run in result.runs:
        m = run.metrics
        low, high = m.prefix_accuracy_ci[:, 0]
        predictor = {
            "decoder": f"decoder {run.decoder_layers}L",
            "shuffled_control": f"shuffled {run.decoder_layers}L",
            "majority_plan": "majority plan",
            "state_only": "state only (agent, goal cells)",
            "optimal_policy": "optimal policy's plan",
        }[run.kind]
        table.add_row(
            run.stage,
            str(run.layer),
            predictor,
            "-" if run.best_epoch is None else str(run.best_epoch),
            f"{_pct(m.prefix_accuracy[0])} [{_pct(low)}-{_pct(high)}]",
            *(_at(m.prefix_accuracy, n) for n in TABLE_NS[1:]),
            _at(m.prefix_accuracy_min_length, 3),
            _at(m.prefix_accuracy_min_length, 5),
            _pct(m.exact_length_match),
            f"{m.length_bias:+.2f}",
            f"{m.median_abs_length_error:.1f}",
        )
    if result.runs:
        baseline = result.runs[0].metrics.random_baseline
        table.add_row(
            "", "", "0.25^N", "", _at(baseline, 1), *(_at(baseline, n) for n in TABLE_NS[1:]),
            _at(baseline, 3), _at(baseline, 5), "", "", "",
        )  # fmt: skip
    return table


def _at(values, n: int) -> str:
    return _pct(values[n - 1]) if n <= len(values) else "-"


def _pct(value: float) -> str:
    return "nan" if value != value else f"{100 * value:.1f}"
