"""``goalprobe attribute``: attribution patching over every block x prompt position (issue 41)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from goalprobe.commands.common import (
    OVERWRITE_HELP,
    check_device,
    check_new_output,
    choice,
    parse_list,
    removed_on_error,
)

ATTRIBUTION_STEM = "attribution"
"""``--out``/attribution.safetensors + attribution.json (docs/formats.md)."""
HEATMAP_FILE = "attribution_heatmap.html"
"""The heat map of the first pair of each metric."""


def _mxfp4_refusal(model: str, device: str) -> None:
    """Refuse, before loading, a model that would load as MXFP4 here (forward-only kernels)."""
    from goalprobe.agents.bundled import is_bundled

    if is_bundled(model) or not (device.startswith("cuda") or device == "auto"):
        return
    config_file = Path(model) / "config.json"
    if not config_file.is_file():
        return  # a hub id: refused after loading, by the gradient run (GradientUnsupportedError)
    import json

    from goalprobe.activations.plan import mxfp4_status

    quant = json.loads(config_file.read_text(encoding="utf-8")).get("quantization_config") or {}
    if str(quant.get("quant_method", "")).lower() == "mxfp4" and mxfp4_status().available:
        raise typer.BadParameter(
            f"{model} would load with MXFP4 expert weights here, whose kernels are forward-only; "
            "attribution needs bf16 weights (a dequantised checkpoint, or --device cpu)",
            param_hint="--model",
        )


def command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")],
    trajectories: Annotated[
        Path | None,
        typer.Option(help="Trajectory JSONL (`goalprobe rollout`): its steps are the bases."),
    ] = None,
    grids: Annotated[
        Path | None,
        typer.Option(help="Grid-set JSONL (`goalprobe grids`): start states are the bases."),
    ] = None,
    model: Annotated[
        str, typer.Option(help="'bundled', a local model directory, or a Hugging Face id.")
    ] = "bundled",
    backend: Annotated[
        str, typer.Option(help="hooks (GradDrop) or nnsight (plain gradients).")
    ] = "hooks",
    metrics: Annotated[
        str, typer.Option(help="Comma-separated metrics: action, coordinates.")
    ] = "action,coordinates",
    positions: Annotated[
        str, typer.Option(help="prompt (every prompt position) or all (the reasoning too).")
    ] = "prompt",
    grad_drop: Annotated[
        bool, typer.Option(help="Also compute AtP*'s GradDrop magnitude (hooks only).")
    ] = True,
    reasoning: Annotated[
        str,
        typer.Option(
            help="The base's reasoning: recorded (trajectories only) or greedy. Default: "
            "recorded with --trajectories, greedy with --grids."
        ),
    ] = "",
    moves: Annotated[str, typer.Option(help="agent and/or goal.")] = "agent,goal",
    disjoint_per_move: Annotated[
        int, typer.Option(min=0, help="Disjoint pairs per base and move.")
    ] = 1,
    control_per_move: Annotated[
        int, typer.Option(min=0, help="Control pairs per base and move.")
    ] = 0,
    sizes: Annotated[
        str, typer.Option(help="Comma-separated grid sizes to keep (default: all).")
    ] = "",
    max_bases: Annotated[
        int, typer.Option(min=1, help="Most bases, drawn at random (seeded) when more.")
    ] = 20,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Greedy completion budget.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed of the draws.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1, ...")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, bfloat16, float32.")] = "auto",
    overwrite: Annotated[bool, typer.Option("--overwrite", help=OVERWRITE_HELP)] = False,
) -> None:
    """Attribute a metric to every block x prompt position of base/counterfactual pairs.

    For each pair both prompts are teacher-forced on the base's own reasoning and
    (a_cf - a_base) . dM/da_base is computed for every block and position (AtP, with AtP*'s
    GradDrop), for the answered action's logit difference and the log-probability of the
    coordinates the reasoning writes (goalprobe.probes.attribution). Writes attribution.safetensors,
    attribution.json (docs/formats.md) and attribution_heatmap.html into --out; a non-empty --out
    is refused unless --overwrite.
    """
    from goalprobe.activations.capture.gradients import GradientUnsupportedError
    from goalprobe.probes.attribution import METRICS, POSITION_SETS, AttributionConfig
    from goalprobe.probes.patching.counterfactuals import CounterfactualConfig, base_from_grid
    from goalprobe.probes.patching.run import draw_bases, read_trajectory_bases

    if (trajectories is None) == (grids is None):
        raise typer.BadParameter("give exactly one of --trajectories and --grids")
    check_new_output(out, overwrite, "--out", directory=True)
    choice(backend, ("hooks", "nnsight"), "--backend")
    choice(positions, POSITION_SETS, "--positions")
    for metric in parse_list(metrics, str, "--metrics"):
        choice(metric, METRICS, "--metrics")
    if grad_drop and backend != "hooks":
        raise typer.BadParameter(
            "GradDrop runs on the hooks backend; pass --no-grad-drop with nnsight",
            param_hint="--backend",
        )
    check_device(device)
    mode = reasoning or ("recorded" if trajectories is not None else "greedy")
    choice(mode, ("recorded", "greedy"), "--reasoning")
    if mode == "recorded" and trajectories is None:
        raise typer.BadParameter(
            "recorded reasoning needs --trajectories", param_hint="--reasoning"
        )
    effort, template_dir = "low", None
    if trajectories is not None:
        if not trajectories.is_file():
            raise typer.BadParameter(f"{trajectories} does not exist", param_hint="--trajectories")
        read = read_trajectory_bases(trajectories)
        bases, effort, template_dir = read.bases, read.reasoning_effort, read.template_dir
    elif grids is not None:
        from goalprobe.gridworld.io import read_grid_set

        if not grids.is_file():
            raise typer.BadParameter(f"{grids} does not exist", param_hint="--grids")
        bases = [base_from_grid(g) for g in read_grid_set(grids)]
    keep = parse_list(sizes, int, "--sizes", empty_ok=True) or None
    bases = draw_bases(bases, max_bases, seed, sizes=keep)
    if not bases:
        raise typer.BadParameter(f"no base state of {trajectories or grids} (with --sizes)")
    try:
        config = AttributionConfig(
            metrics=parse_list(metrics, str, "--metrics"), positions=positions, grad_drop=grad_drop
        )
        cf_config = CounterfactualConfig(
            moves=parse_list(moves, str, "--moves"),
            disjoint_per_move=disjoint_per_move,
            control_per_move=control_per_move,
            random_state=seed,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    _mxfp4_refusal(model, device)
    with removed_on_error(out):
        try:
            paths = _run(out, bases, model, backend, config, cf_config, mode, effort,
                         template_dir, max_new_tokens, device, dtype, str(trajectories or grids))  # fmt: skip
        except GradientUnsupportedError as err:
            raise typer.BadParameter(str(err), param_hint="--model") from err
    typer.echo(f"wrote {', '.join(str(p) for p in paths)}")


def _run(out, bases, model, backend, config, cf_config, mode, effort, template_dir,
         max_new_tokens, device, dtype, input_name):  # fmt: skip
    """Load the model, prepare the pairs, attribute, write (the verb's work after validation)."""
    from dataclasses import asdict

    from goalprobe.activations.capture import make_backend
    from goalprobe.agents.models import load_model
    from goalprobe.probes.attribution import attribute_pairs, where_read
    from goalprobe.probes.attribution_file import write_attributions
    from goalprobe.probes.patching.counterfactuals import build_counterfactuals
    from goalprobe.probes.patching.experiment import PatchConfig, PatchingContext, prepare_pairs
    from goalprobe.viewer.figures.attribution import attribution_map_figure

    loaded = load_model(model, device=device, dtype=dtype)
    runner = make_backend(backend, loaded.model, loaded.tokenizer)
    patch_config = PatchConfig(
        reasoning=mode, max_new_tokens=max_new_tokens, reasoning_effort=effort,
        template_dir=template_dir,
    )  # fmt: skip
    pairs = build_counterfactuals(bases, cf_config)
    prepared, report = prepare_pairs(pairs, PatchingContext(runner, patch_config))
    if not prepared:
        raise typer.BadParameter(
            f"no pair was kept for attribution ({report.n_pairs} offered; dropped "
            f"{dict(report.dropped)})"
        )
    _require_fits(runner, [len(p.base.sequence) for p in prepared])
    records = attribute_pairs(prepared, runner, config)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": loaded.model_id,
        "model_revision": loaded.revision,
        "backend": runner.name,
        "n_layers": runner.n_layers,
        "config": asdict(config),
        "counterfactuals": asdict(cf_config),
        "reasoning": mode,
        "input": input_name,
        "n_bases": len(bases),
        "preparation": report.to_dict(),
        "where": where_read(records),
    }
    paths = list(write_attributions(out / ATTRIBUTION_STEM, records, meta))
    figures = []
    for metric in config.metrics:
        first = next((r for r in records if r.metric == metric), None)
        if first is None:
            continue
        values = first.graddrop if first.graddrop is not None else first.atp
        figure = attribution_map_figure(
            values, first.positions, first.cell_positions, anchors=first.pre_reasoning,
            changed_cells=first.changed_cells, layers=first.layers,
            title=f"{metric}: {first.pair_id}",
        )  # fmt: skip
        figures.append(figure.to_html(full_html=False, include_plotlyjs=not figures))
    heatmap = out / HEATMAP_FILE
    heatmap.write_text("<html><body>" + "\n".join(figures) + "</body></html>", encoding="utf-8")
    return [*paths, heatmap]


def _require_fits(runner, lengths) -> None:
    """Refuse (one error line) gradient runs whose backward pass the device cannot hold, or a
    model with MXFP4 weights (goalprobe.activations.gradient_plan), before the first one."""
    from goalprobe.activations.capture.gradients import is_mxfp4
    from goalprobe.activations.gradient_plan import plan_attribution
    from goalprobe.activations.plan import ModelShape, device_memory_bytes

    device = str(runner.device)
    plan = plan_attribution(
        lengths,
        ModelShape.from_config(runner.config),
        memory_bytes=device_memory_bytes(device),
        mxfp4=is_mxfp4(runner.model),
        dtype_bytes=runner.dtype.itemsize,
        attention="flex_attention" if runner.attention == "flex_attention" else "eager",
    )
    if not plan.fits:
        raise typer.BadParameter(f"attribution does not fit on {device}: {plan.reason}")
