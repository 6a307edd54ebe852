"""``goalprobe extract``: replay trajectories through the model and store residual activations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer import Argument, Option

from goalprobe.commands.common import (
    ModelOption,
    OverwriteOption,
    check_device,
    check_new_output,
    choice,
    model_format,
    parse_list,
)

_Trajectories = Annotated[Path, Argument(help="Trajectory JSONL written by `goalprobe rollout`.")]
_Layers = Annotated[
    str,
    Option(
        help="Comma-separated decoder blocks (0-based output of block L); default: the "
        "last block of each third (GPT-OSS-20B: 7,15,23)."
    ),
]
_Stages = Annotated[str, Option(help="Comma-separated anchor stages.")]
_GridCells = Annotated[bool, Option(help="Also store every grid-cell token (225 tokens per row).")]
_ReasoningEvery = Annotated[
    int,
    Option(
        help="Also store the residual stream along each step's reasoning: every k-th "
        "token of the analysis message and its last token (ragged rows); 0: none."
    ),
]
_Backend = Annotated[str, Option(help="Capture backend: nnsight, transformer_lens or hooks.")]
_Remote = Annotated[bool, Option(help="Run the nnsight trace on NDIF (needs NDIF_API_KEY).")]
_SimulateRemote = Annotated[
    bool,
    Option(help="Dry run of the remote path here (nnsight's local simulation)."),
]
_NdifHost = Annotated[
    str | None, Option(help="NDIF base URL (default: nnsight's configured host).")
]
_MaxBatchTokens = Annotated[
    int | None,
    Option(
        min=0,
        help="Most padded tokens per forward pass (a batch's longest replayed step times "
        "its size; at least one step). Default: planned from the replayed lengths and the "
        "device's memory (goalprobe.activations.plan; none with --remote); 0: only "
        "--batch-size limits.",
    ),
]
_AttnImplementation = Annotated[
    str,
    Option(
        help="auto (default: GPT-OSS's sinks through SDPA on CPU, eager on CUDA), eager, "
        "sink_attention, flex_fp32_sinks (FlexAttention, the sinks in fp32: eager's rows "
        "within 1e-4 in fp32, memory linear on CUDA) or flex_attention (CUDA; memory linear "
        "in the replayed length, but its rows differ from eager's: never mix kernels in one "
        "study)."
    ),
]
_RowsPerPart = Annotated[int, Option(help="Steps per crash-safe part (the most a kill can lose).")]
_Shard = Annotated[str, Option(help="i/N: extract the grids of shard i of N (merge with `merge`).")]
_Dtype = Annotated[str, Option(help="auto (bf16 on CUDA, fp32 on CPU), bfloat16, float32.")]
_DeviceMap = Annotated[
    str | None, Option(help="transformers device map, e.g. 'auto' (overrides --device).")
]
_WorkDir = Annotated[Path | None, Option(help="Parts directory (default: <out>.parts).")]


def command(
    trajectories: _Trajectories,
    out: Annotated[Path, Option("--out", "-o", help="Activation store (.h5) to write.")],
    model: ModelOption = "bundled",
    revision: Annotated[str, Option(help="Hub revision of the model.")] = "",
    layers: _Layers = "",
    stages: _Stages = "pre_reasoning,post_reasoning",
    grid_cells: _GridCells = False,
    reasoning_every: _ReasoningEvery = 0,
    backend: _Backend = "nnsight",
    remote: _Remote = False,
    simulate_remote: _SimulateRemote = False,
    ndif_host: _NdifHost = None,
    batch_size: Annotated[int, Option(help="Sequences per forward pass.")] = 8,
    max_batch_tokens: _MaxBatchTokens = None,
    attn_implementation: _AttnImplementation = "auto",
    rows_per_part: _RowsPerPart = 256,
    compression: Annotated[str, Option(help="none, lzf or gzip.")] = "none",
    shard: _Shard = "0/1",
    device: Annotated[str, Option(help="auto, cpu, cuda, cuda:1, ...")] = "auto",
    dtype: _Dtype = "auto",
    device_map: _DeviceMap = None,
    work_dir: _WorkDir = None,
    keep_parts: Annotated[bool, Option(help="Keep the parts after assembling.")] = False,
    overwrite: OverwriteOption = False,
    progress: Annotated[bool, Option(help="Show a progress bar.")] = True,
) -> None:
    """Replay every recorded step teacher-forced and store the residual stream (HDF5).

    Resumable: after an interruption (even SIGKILL), rerun the same command to continue; a
    rerun after it finished reports the store complete. An existing --out of anything else is
    refused unless --overwrite.
    """
    from goalprobe.activations.capture import BACKENDS
    from goalprobe.activations.extract import ExtractConfig, holds_other_extraction
    from goalprobe.agents.attention import ATTENTION_CHOICES
    from goalprobe.agents.chat_format import format_name
    from goalprobe.agents.trajectories import read_run_header, trajectory_stats
    from goalprobe.stages.activations import extract_store

    # every argument and the input file are checked before the (possibly long) model load
    choice(backend, BACKENDS, "--backend")
    check_device(device)
    choice(attn_implementation, (*ATTENTION_CHOICES, "flex_attention"), "--attn-implementation")
    if attn_implementation == "flex_attention" and (remote or not device.startswith("cuda")):
        raise typer.BadParameter(
            "--attn-implementation flex_attention needs a local model on --device cuda "
            "(GPT-OSS's attention sinks run under flex attention on CUDA only)"
        )
    if (remote or simulate_remote) and backend != "nnsight":
        raise typer.BadParameter("--remote runs through nnsight; use --backend nnsight")
    chosen = parse_list(layers, int, "--layers", empty_ok=True)
    try:
        config = ExtractConfig(
            layers=chosen,  # empty: the default spread, once the model's depth is known
            stages=parse_list(stages, str, "--stages"),
            grid_cells=grid_cells,
            batch_size=batch_size,
            max_batch_tokens=max_batch_tokens or 0,
            rows_per_part=rows_per_part,
            compression=compression,
            shard=shard,
            reasoning_every=reasoning_every,
        )
    except ValueError as err:
        hint = "--reasoning-every" if "reasoning_every" in str(err) else None
        raise typer.BadParameter(str(err), param_hint=hint) from err
    stats = trajectory_stats(trajectories)
    stats.check_nonempty()
    check_new_output(out, True, "--out")  # a directory is refused; an existing file below
    if (
        out.exists()
        and not overwrite
        and holds_other_extraction(out, trajectories, config, compare_layers=bool(chosen))
    ):
        raise typer.BadParameter(
            f"{out} exists and is not this extraction's store (resumed or finished); pass "
            "--overwrite to replace it",
            param_hint="--out",
        )

    # the model's chat format exists and is the one the trajectories were written in
    chat_format = model_format(model)
    recorded = format_name(read_run_header(trajectories).chat_format)
    if recorded != chat_format.name:
        raise typer.BadParameter(
            f"{trajectories} was written in the {recorded} chat format, but {model}'s tokenizer "
            f"uses {chat_format.name}",
            param_hint="--model",
        )
    from goalprobe.agents.models import load_model

    loaded = load_model(
        model,
        revision=revision,
        device=device,
        dtype=dtype,
        device_map=device_map,
        remote=remote,
        attention="eager" if attn_implementation == "flex_attention" else attn_implementation,
    )
    capture = _capture_backend(
        backend, loaded, remote, simulate_remote, ndif_host, attn_implementation
    )
    if capture.vocab_size is not None:
        stats.check_vocabulary(capture.vocab_size)
    plan_device = None
    if max_batch_tokens is None and not remote:  # the planner's token budget
        plan_device = str(next(loaded.model.parameters()).device)
    report, config = extract_store(
        trajectories,
        out,
        loaded,
        capture,
        config,
        plan_device=plan_device,
        overwrite=overwrite,
        progress=progress,
        work_dir=work_dir,
        keep_parts=keep_parts,
    )
    _print_report(report, config, capture.name)


def _capture_backend(backend, loaded, remote, simulate_remote, ndif_host, attn_implementation):
    """The capture backend of the loaded model (nnsight runs it locally, simulated remote or on
    NDIF; transformer_lens takes the model without a copy)."""
    from goalprobe.activations.capture import BackendUnavailableError, make_backend

    options = {}
    if backend == "nnsight":
        options = {
            "remote": True if remote else ("local" if simulate_remote else False),
            "model_id": loaded.model_id,
            "revision": loaded.revision or None,
            "host": ndif_host,
        }
    elif backend == "transformer_lens":  # full forwards only: the bridge may take the model
        options = {"model_id": loaded.model_id, "copy_model": False}
    if not remote and attn_implementation == "flex_attention":
        loaded.model.set_attn_implementation(attn_implementation)
    try:
        return make_backend(backend, loaded.model, loaded.tokenizer, **options)
    except (BackendUnavailableError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint="--backend") from err


def _print_report(report, config, backend_name: str) -> None:
    """What the extraction stored, the reasoning rows, and a warning when some rows replay ids
    re-tokenised from a server's text."""
    from goalprobe.activations.store import ActivationStore

    state = (
        "already complete"
        if report.already_complete
        else (f"{report.parts_computed} part(s) computed, {report.parts_reused} reused")
    )
    typer.echo(
        f"{report.output}: {report.rows} rows (of {report.trajectory_steps} steps in the file), "
        f"layers {list(config.layers)}, backend {backend_name}, batches of <= "
        f"{config.batch_size} steps and {config.max_batch_tokens or 'any number of'} tokens; "
        f"{state}; {report.seconds:.1f} s"
    )
    with ActivationStore(report.output) as opened:
        along = int(opened.reasoning_offsets()[-1]) if config.reasoning_every else 0
        retokenized = int(opened.attrs.get("retokenized_steps", 0) or 0)
    if config.reasoning_every:
        typer.echo(f"  {along} reasoning rows (every {config.reasoning_every} tokens + the last)")
    if retokenized:
        typer.echo(
            f"warning: {report.output}: {retokenized} step(s) replay token ids re-tokenised from "
            "a server's text, not the ids the model read (the server returned none; use vLLM "
            ">= 0.11.1 with --server-token-ids)",
            err=True,
        )
