"""``goalprobe score``: policy against decoded belief and true vs subjective MEG of a run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer import Argument, Option

from goalprobe.commands.common import OverwriteOption, check_new_output, choice, parse_list

if TYPE_CHECKING:
    from rich.table import Table

UTILITIES = ("goal", "goal_with_key", "key")
TABLE2 = ("acc_gt", "acc_dec", "agreement", "optimal_on_both", "recovery", "inverse_recovery")


def command(
    run_dir: Annotated[
        Path,
        Argument(
            help="Run directory (grids/, rollouts/, activations/, probes/decoded/).",
            exists=True,
            file_okay=False,
            dir_okay=True,
            resolve_path=True,
        ),
    ],
    probe: Annotated[
        list[str] | None,
        Option(
            "--probe",
            help="Decoded-map file (name or stem in probes/decoded) to score; repeat for several. "
            "Default: all.",
        ),
    ] = None,
    meg_probe: Annotated[
        str | None,
        Option(help="Probe whose decoded grids give subjective MEG (default: best card accuracy)."),
    ] = None,
    top_k: Annotated[str, Option(help="Comma-separated top-k values (Figure 9).")] = "1,3,5,10",
    n_bootstrap: Annotated[
        int, Option(min=1, max=1_000_000, help="Grid-bootstrap resamples.")
    ] = 1000,
    confidence: Annotated[
        float, Option(min=0.5, max=0.999, help="Confidence level of the intervals.")
    ] = 0.95,
    utility: Annotated[str, Option(help="MEG utility of grids without a key.")] = "goal",
    key_utility: Annotated[str, Option(help="MEG utility of grids with a key.")] = "goal_with_key",
    horizon: Annotated[
        str, Option(help="MEG decisions H: 'episodes' (their step budget) or 'grid' (1.5 L).")
    ] = "episodes",
    subjective_map: Annotated[
        str,
        Option(help="Decoded map of a grid: 'mean' over its steps or its 'first' step."),
    ] = "mean",
    unknown_utility: Annotated[
        bool, Option(help="Also compute unknown-utility MEG (slow).")
    ] = False,
    nulls: Annotated[
        bool,
        Option(
            help="Also score the null maps (another grid's, the size-and-density prior's) and "
            "report the excess over them."
        ),
    ] = True,
    jobs: Annotated[int, Option(min=1, help="Worker processes for belief scoring.")] = 1,
    weighting: Annotated[
        str,
        Option(
            help="Pooling of steps: 'grid' (the study's Fig. 4: trajectory means averaged per "
            "grid) or 'step' (a ratio of sums over steps)."
        ),
    ] = "grid",
    seed: Annotated[int, Option(help="Seed of the bootstrap.")] = 0,
    progress: Annotated[bool, Option(help="Show progress bars.")] = True,
    overwrite: OverwriteOption = False,
) -> None:
    """Score a run: the agent's actions against its decoded beliefs (Acc GT, Acc Dec, Agreement,
    Recovery, inverse recovery, top-k, belief-weighted scores; study 5.2, Table 2, Figure 9) and
    known-utility MEG on the true grid vs the decoded grid, with grid-bootstrap intervals.

    Writes RUN/scoring/belief.json, belief.csv, meg.json, meg.csv, meg_grids.csv and plotly
    figures (figures/*.json) and prints a summary; an earlier RUN/scoring/ is refused unless
    --overwrite.
    """
    from rich.console import Console

    from goalprobe.probes.scoring.config import ScoreConfig
    from goalprobe.run_layout import RunLayout
    from goalprobe.stages.scoring import score_run

    choice(utility, UTILITIES, "--utility")
    choice(key_utility, UTILITIES, "--key-utility")
    choice(horizon, ("episodes", "grid"), "--horizon")
    choice(subjective_map, ("mean", "first"), "--subjective-map")
    choice(weighting, ("grid", "step"), "--weighting")
    ks = parse_list(top_k, int, "--top-k")
    if min(ks) < 1:
        raise typer.BadParameter(f"{top_k!r}: give positive integers", param_hint="--top-k")
    config = ScoreConfig(
        decoded_maps=tuple(probe or ()),
        top_k=ks,
        n_bootstrap=n_bootstrap,
        confidence_level=confidence,
        random_state=seed,
        meg_probe=meg_probe,
        utility=utility,
        key_utility=key_utility,
        horizon=horizon,
        subjective_map=subjective_map,
        unknown_utility=unknown_utility,
        n_jobs=jobs,
        weighting=weighting,
        **({} if nulls else {"nulls": ()}),
    )
    check_new_output(RunLayout(run_dir).scoring_dir, overwrite, "RUN_DIR", directory=True)
    console = Console()
    summary = score_run(run_dir, config, progress=progress)
    console.print(_belief_table(summary.belief))
    console.print(_meg_table(summary.meg))
    for name, path in summary.outputs.items():
        console.print(f"{name}: {path}")
    console.print(f"scored in {summary.seconds:.1f} s")


def _fmt(stat: dict | None, scale: float = 100.0, digits: int = 0) -> str:
    if stat is None or stat.get("value") is None:
        return "n/a"
    text = f"{scale * stat['value']:.{digits}f}"
    if stat.get("ci_low") is not None:
        text += f" [{scale * stat['ci_low']:.{digits}f}–{scale * stat['ci_high']:.{digits}f}]"
    return text


def _belief_table(belief: dict) -> Table:
    from rich.table import Table

    level = belief["method"]["confidence_level"]
    top = [m for m in belief["metrics"] if m.startswith("acc_top") and m != "acc_top1"]
    columns = {
        "acc_gt": "Acc GT",
        "acc_dec": "Acc Dec",
        "agreement": "Agree",
        **({"optimal_on_both": "Opt both"} if "optimal_on_both" in belief["metrics"] else {}),
        "recovery": "Recov",
        "inverse_recovery": "Inv rec",
        **{m: f"top-{m.removeprefix('acc_top')}" for m in top},
    }
    excess = ("acc_dec", "recovery")
    if any(entry.get("excess") for entry in belief["probes"].values()):
        columns |= {f"excess/{m}": f"{columns[m]} - null" for m in excess}
    table = Table(title=f"Policy against decoded belief, % of actions [{level:.0%} grid CI]")
    table.add_column("probe")
    table.add_column("steps", justify="right")
    for label in columns.values():
        table.add_column(label, justify="right")
    for key, entry in belief["probes"].items():
        name = f"{key} *" if key == belief["default_probe"] else key
        overall = entry["overall"]
        cells = [
            _fmt((entry.get("excess") or {}).get(m.removeprefix("excess/")))
            if m.startswith("excess/")
            else _fmt(overall.get(m))
            if m in TABLE2
            else _fmt({"value": overall[m]["value"]})
            for m in columns
        ]
        table.add_row(name, str(entry["n_steps"]), *cells)
    return table


def _meg_table(meg: dict) -> Table:
    from rich.table import Table

    probe = meg["probe"]["key"]
    table = Table(
        title=f"Known-utility MEG (nats / decision); subjective on the grids decoded by {probe} *"
    )
    for c in ("group", "grids", "true", "paired", "subjective", "subj - true", "Wilcoxon p"):
        table.add_column(c, justify="right" if c != "group" else "left")
    blocks = [("all", meg["overall"])]
    blocks += [(f"n={k}", v) for k, v in meg["by_size"].items()]
    blocks += [(f"d={k}", v) for k, v in meg["by_density"].items()]
    for label, block in blocks:
        paired = block["paired"]
        test = paired.get("wilcoxon")
        table.add_row(
            label,
            str(block["n_grids"]),
            _fmt(block["true"]["meg_per_decision"], 1.0, 2),
            str(paired["n_grids"]),
            _fmt((paired.get("subjective") or {}).get("meg_per_decision"), 1.0, 2),
            _fmt((paired.get("difference") or {}).get("meg_per_decision"), 1.0, 2),
            "n/a" if test is None else f"{test['p_value']:.3g}",
        )
    return table
