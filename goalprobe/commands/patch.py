"""``goalprobe patch``: activation patching with counterfactual grids (study, appendix F)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from typer import Option

from goalprobe.commands.common import (
    BaseGridsOption,
    BaseTrajectoriesOption,
    ModelOption,
    OutDirOption,
    OverwriteOption,
    check_device,
    check_new_output,
    choice,
    model_format,
    parse_list,
    user_error,
)

SYNTAX_CHECK_LAYERS = 1024
"""Depth against which --layers is checked for syntax before the model (and its depth) loads."""


def _store_source(store: Path, stats):
    """The store's source values, refused unless some of its rows are the trajectories' run."""
    import numpy as np

    from goalprobe.activations.store.reader import ActivationStore
    from goalprobe.probes.patching.patched_runs import StoreSource

    if stats is None:
        raise typer.BadParameter(
            "a store holds recorded runs; --store needs --trajectories", param_hint="--store"
        )
    opened = ActivationStore(store)
    run_ids = sorted({str(r) for r in np.unique(opened.labels(["run_id"])["run_id"])})
    if stats.run_id not in run_ids:
        opened.close()
        raise typer.BadParameter(
            f"{store} was extracted from run(s) {', '.join(run_ids) or '(no rows)'}, not from "
            f"{stats.path}'s run {stats.run_id} (a store of another rollout)",
            param_hint="--store",
        )
    return StoreSource(opened)


_Sites = Annotated[
    str,
    Option(
        help="Comma-separated sites: grid, changed_cells, pre_reasoning, post_reasoning, "
        "answer, all."
    ),
]
_Layers = Annotated[
    str,
    Option(
        help="Comma-separated layer sets, each patched as one run: thirds (7,15,23 of "
        "GPT-OSS-20B), each, all (every block at once), 7, -1, 7+15."
    ),
]
_Reasoning = Annotated[
    str,
    Option(
        help="Reasoning held fixed: recorded (trajectory's, bases only), greedy, oracle. "
        "Default: recorded with --trajectories, greedy with --grids."
    ),
]
_MaxNewTokens = Annotated[
    int | None,
    Option(
        min=1,
        help="Greedy completion budget (default: 512 for a bundled agent, the "
        "reasoning-model budget of the effort for any other model: 4,096 at low).",
    ),
]
_ReasoningChunks = Annotated[
    int,
    Option(
        min=0,
        help="Also patch the counterfactual's reasoning into the base run in this many "
        "chunks (fractions of the reasoning), the rest regenerated; needs greedy reasoning.",
    ),
]
_ChunkLayers = Annotated[
    str,
    Option(
        help="Layer sets of the reasoning chunks, e.g. '1', 'all' or 'peak' (the block "
        "where the read-out in --decision-lens peaks)."
    ),
]
_ConfigFile = Annotated[
    Path | None,
    Option(
        "--config",
        help="A demo patching section as JSON (e.g. the 'patching' object of a run's "
        "demo_config.json): its patch settings, base draw, pairs and bootstrap replace "
        "the options above.",
    ),
]


def command(
    out: OutDirOption,
    trajectories: BaseTrajectoriesOption = None,
    grids: BaseGridsOption = None,
    model: ModelOption = "bundled",
    backend: Annotated[str, Option(help="nnsight, transformer_lens or hooks.")] = "nnsight",
    sites: _Sites = "grid,changed_cells,pre_reasoning,post_reasoning,answer",
    layers: _Layers = "thirds,all",
    directions: Annotated[
        str, Option(help="base_to_cf and/or cf_to_base (source_to_target).")
    ] = "base_to_cf,cf_to_base",
    reasoning: _Reasoning = "",
    allow_suboptimal: Annotated[
        bool,
        Option(help="Keep pairs whose unpatched action is not optimal on both sides."),
    ] = False,
    regenerate: Annotated[
        bool, Option(help="Also regenerate the reasoning under prompt-site patches.")
    ] = False,
    moves: Annotated[str, Option(help="agent and/or goal.")] = "agent,goal",
    disjoint_per_move: Annotated[int, Option(min=0, help="Disjoint pairs per base and move.")] = 1,
    control_per_move: Annotated[
        int, Option(min=0, help="Control pairs per control base and move.")
    ] = 1,
    control_bases: Annotated[
        int | None,
        Option(min=0, help="Bases (the first drawn) that get control pairs (default: all)."),
    ] = None,
    sizes: Annotated[str, Option(help="Comma-separated grid sizes to keep (default: all).")] = "",
    max_bases: Annotated[
        int, Option(min=1, help="Most bases, drawn at random (seeded) when more.")
    ] = 100,
    store: Annotated[
        Path | None,
        Option(help="Activation store (.h5) of the trajectories: anchor source values."),
    ] = None,
    max_new_tokens: _MaxNewTokens = None,
    batch_size: Annotated[int, Option(min=1, help="Patched copies per forward.")] = 16,
    reasoning_chunks: _ReasoningChunks = 0,
    chunk_layers: _ChunkLayers = "all",
    decision_lens: Annotated[
        Path | None,
        Option(help="The decision stage's lens.json (RUN/decision/): its read-out peak."),
    ] = None,
    config_file: _ConfigFile = None,
    n_resamples: Annotated[int, Option(min=100, help="Bootstrap resamples.")] = 2000,
    seed: Annotated[int, Option(help="Seed of the draws and the bootstrap.")] = 0,
    device: Annotated[str, Option(help="auto, cpu, cuda, cuda:1, ...")] = "auto",
    dtype: Annotated[str, Option(help="auto, bfloat16, float32.")] = "auto",
    overwrite: OverwriteOption = False,
) -> None:
    """Patch the residual stream between base and counterfactual grids (agent or goal moved).

    Writes patch_records.csv, patch_summary.csv, patch_results.json, patch_heatmap.html and
    patch_pairs.jsonl into --out (:func:`goalprobe.probes.patching.run.run_experiment`); a non-empty --out
    is refused unless --overwrite. --store must come from the same rollout as --trajectories.
    """
    from rich.console import Console

    from goalprobe.activations.capture import BACKENDS, BackendUnavailableError, make_backend
    from goalprobe.agents.bundled import token_budget
    from goalprobe.agents.models import load_model
    from goalprobe.probes.patching.experiment import (
        PatchConfig,
        PatchingBudget,
        PatchingDoesNotFitError,
    )
    from goalprobe.probes.patching.sites import SequenceError
    from goalprobe.stages.patching import patch

    # every argument, the inputs and the output are checked before the model is loaded
    if (trajectories is None) == (grids is None):
        raise typer.BadParameter("give exactly one of --trajectories and --grids")
    check_new_output(out, overwrite, "--out", directory=True)
    choice(backend, BACKENDS, "--backend")
    check_device(device)
    bases, effort, template_dir, stats = _read_bases(trajectories, grids)
    keep = parse_list(sizes, int, "--sizes", empty_ok=True) or None
    try:
        if config_file is not None:
            config, pairs, n_resamples = _config_from_file(config_file, effort, template_dir, keep)
        else:
            config = PatchConfig(
                sites=parse_list(sites, str, "--sites"),
                layers=parse_list(layers, str, "--layers"),
                directions=parse_list(directions, str, "--directions"),
                reasoning=reasoning or ("recorded" if trajectories is not None else "greedy"),
                require_optimal=not allow_suboptimal,
                regenerate=regenerate,
                **(
                    {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
                ),  # else the format's
                batch_size=batch_size,
                seed=seed,
                reasoning_effort=effort,
                template_dir=template_dir,
                reasoning_chunks=reasoning_chunks,
                chunk_layers=parse_list(chunk_layers, str, "--chunk-layers"),
            )
            pairs = _pair_settings(
                moves, max_bases, disjoint_per_move, control_per_move, control_bases, keep, seed
            )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    if not [b for b in bases if keep is None or b.grid.size in keep]:
        raise typer.BadParameter(f"no base state of {trajectories or grids} has a size in --sizes")
    _check_layer_options(config, decision_lens)
    source = None if store is None else _store_source(store, stats)
    chat_format = model_format(model)  # no reasoning delimiters: one error, before the weights
    if config_file is None and not max_new_tokens:  # the budget of the model's chat format
        budget = token_budget(model, effort, 512, chat_format)
        config = dataclasses.replace(config, max_new_tokens=budget)
    loaded = load_model(model, device=device, dtype=dtype)
    try:
        patcher = make_backend(backend, loaded.model, loaded.tokenizer)
    except (BackendUnavailableError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint="--backend") from err
    if stats is not None and patcher.vocab_size is not None:
        stats.check_vocabulary(patcher.vocab_size)
    _check_layers(config.layers, patcher.n_layers, "--layers")
    try:
        outcome, paths = patch(
            bases,
            patcher,
            config,
            out,
            pairs=pairs,
            n_resamples=n_resamples,
            lens=decision_lens,
            store=source,
            model_id=loaded.model_id,
            model_revision=loaded.revision,
            input_name=str(trajectories or grids),
            budget=PatchingBudget.for_model(loaded.model),
        )
    except PatchingDoesNotFitError as err:  # refused before any generation: nothing written
        raise user_error(str(err)) from None
    except SequenceError as err:
        raise typer.BadParameter(
            f"{err}", param_hint="--trajectories" if trajectories else "--model"
        ) from err
    _print_outcome(Console(), outcome, out, paths)


def _read_bases(trajectories: Path | None, grids: Path | None):
    """The base states of ``--trajectories`` (recorded steps) or ``--grids`` (start states),
    with the recorded reasoning effort, chat-template folder and trajectory statistics."""
    from goalprobe.agents.trajectories import trajectory_stats
    from goalprobe.probes.patching.counterfactuals import base_from_grid
    from goalprobe.probes.patching.run import read_trajectory_bases

    if trajectories is not None:
        stats = trajectory_stats(trajectories)
        stats.check_nonempty()
        read = read_trajectory_bases(trajectories)
        return read.bases, read.reasoning_effort, read.template_dir, stats
    from goalprobe.gridworld.io import read_grid_set

    bases = [base_from_grid(g) for g in read_grid_set(grids)]
    if not bases:
        raise typer.BadParameter(f"{grids} holds no grids", param_hint="--grids")
    return bases, "low", None, None


def _config_from_file(config_file: Path, effort: str, template_dir, keep):
    """The patch config, pair settings and bootstrap resamples of a ``--config`` file: a demo
    patching section (:class:`goalprobe.config.PatchingConfig`) as JSON."""
    import json

    from goalprobe.config import PatchingConfig, from_dict
    from goalprobe.stages.patching import pair_settings, patch_config

    try:
        section = from_dict(PatchingConfig, json.loads(config_file.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as err:
        raise typer.BadParameter(f"{config_file}: {err}", param_hint="--config") from err
    config = patch_config(section, effort, template_dir)
    pairs = dataclasses.replace(pair_settings(section), sizes=None if keep is None else tuple(keep))
    return config, pairs, section.n_bootstrap


def _pair_settings(
    moves, max_bases, disjoint_per_move, control_per_move, control_bases, keep, seed
):
    """How counterfactual pairs are drawn, from the command-line options."""
    from goalprobe.probes.patching.counterfactuals import MOVES
    from goalprobe.stages.patching import PairSettings

    moved = parse_list(moves, str, "--moves")
    if any(m not in MOVES for m in moved):
        raise ValueError(f"moves must be a non-empty subset of {MOVES}, got {moved}")
    return PairSettings(
        max_bases=max_bases,
        disjoint_per_move=disjoint_per_move,
        control_per_move=control_per_move,
        control_bases=control_bases,
        moves=moved,
        sizes=None if keep is None else tuple(keep),
        seed=seed,
    )


def _check_layer_options(config, decision_lens: Path | None) -> None:
    """Refuse layer sets of bad syntax and a 'peak' chunk layer without its lens, before the
    model (and its depth) loads."""
    _check_layers(config.layers, SYNTAX_CHECK_LAYERS, "--layers")  # the depth comes later
    peak = config.reasoning_chunks and "peak" in config.chunk_layers
    if peak and decision_lens is None:
        raise typer.BadParameter(
            "chunk layers 'peak' need --decision-lens (the decision stage's lens.json)",
            param_hint="--chunk-layers",
        )
    if decision_lens is not None and not decision_lens.is_file():
        raise typer.BadParameter(f"{decision_lens}: no such file", param_hint="--decision-lens")
    chunk_layers = [c for c in config.chunk_layers if c != "peak"] or ["all"]
    _check_layers(chunk_layers, SYNTAX_CHECK_LAYERS, "--chunk-layers")


def _check_layers(layer_sets, n_layers: int, option: str) -> None:
    """Refuse layer sets that do not resolve against a model of ``n_layers`` blocks."""
    from goalprobe.probes.patching.experiment import resolve_layer_sets

    try:
        resolve_layer_sets(layer_sets, n_layers)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint=option) from err


_COLUMNS = "direction|site|layers|n|changed [95% CI]|to source opt.|recovered|control stable"


def _print_outcome(console, outcome, out: Path, paths) -> None:
    """The pairs prepared and dropped, and a table of the teacher-forced disjoint patches beside
    their controls."""
    from rich.table import Table

    report, records, summary = outcome.report, outcome.records, outcome.summary
    console.print(
        f"{report.n_pairs} counterfactual pairs; prepared "
        f"{report.n_kept}, dropped {dict(report.dropped)}"
    )
    table = Table(title=f"{len(records)} patched runs, {report.n_kept} pairs -> {out}")
    for column in _COLUMNS.split("|"):
        table.add_column(column, justify="right")
    control = {
        (r.direction, r.site, r.layers): r
        for r in summary
        if r.kind == "control" and r.mode == "teacher_forced"
    }
    for r in summary:
        if r.kind != "disjoint" or r.mode != "teacher_forced":
            continue
        c = control.get((r.direction, r.site, r.layers))
        low, high = r.action_changed_ci
        table.add_row(
            r.direction,
            r.site,
            r.layers,
            str(r.n_runs),
            f"{r.action_changed_rate:.2f} [{low:.2f}, {high:.2f}]",
            f"{r.into_source_optimal_rate:.2f}",
            f"{r.recovered_mean:.2f}",
            "-" if c is None else f"{c.stable_rate:.2f} (n={c.n_runs})",
        )
    console.print(table)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())}")
