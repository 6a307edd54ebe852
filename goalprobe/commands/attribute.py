"""``goalprobe attribute``: attribution patching over every block x prompt position (issue 41)."""

from __future__ import annotations

from dataclasses import asdict
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
    parse_list,
    removed_on_error,
)


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
    out: OutDirOption,
    trajectories: BaseTrajectoriesOption = None,
    grids: BaseGridsOption = None,
    model: ModelOption = "bundled",
    backend: Annotated[
        str, Option(help="hooks (GradDrop) or nnsight (plain gradients).")
    ] = "hooks",
    metrics: Annotated[
        str, Option(help="Comma-separated metrics: action, coordinates.")
    ] = "action,coordinates",
    positions: Annotated[
        str, Option(help="prompt (every prompt position) or all (the reasoning too).")
    ] = "prompt",
    grad_drop: Annotated[
        bool, Option(help="Also compute AtP*'s GradDrop magnitude (hooks only).")
    ] = True,
    reasoning: Annotated[
        str,
        Option(
            help="The base's reasoning: recorded (trajectories only) or greedy. Default: "
            "recorded with --trajectories, greedy with --grids."
        ),
    ] = "",
    moves: Annotated[str, Option(help="agent and/or goal.")] = "agent,goal",
    disjoint_per_move: Annotated[int, Option(min=0, help="Disjoint pairs per base and move.")] = 1,
    control_per_move: Annotated[int, Option(min=0, help="Control pairs per base and move.")] = 0,
    pairs: Annotated[
        Path | None,
        Option(
            help="Pairs JSONL of `goalprobe patch` / the patching stage (patch_pairs.jsonl): "
            "attribute those pairs (their bases from --trajectories) instead of drawing new ones."
        ),
    ] = None,
    kinds: Annotated[
        str, Option(help="Pair kinds to attribute: disjoint and/or control.")
    ] = "disjoint,control",
    max_pairs: Annotated[int, Option(min=1, help="Most pairs, the first ones.")] = 100,
    check_pairs: Annotated[
        int,
        Option(
            min=0, help="Pairs (the first) checked against the real patch of every affected site."
        ),
    ] = 0,
    top_k: Annotated[int, Option(min=1, help="The check's top-k hit rate.")] = 5,
    require_optimal: Annotated[
        bool, Option(help="Keep only pairs whose unpatched action is optimal on both sides.")
    ] = True,
    sizes: Annotated[str, Option(help="Comma-separated grid sizes to keep (default: all).")] = "",
    max_bases: Annotated[
        int, Option(min=1, help="Most bases, drawn at random (seeded) when more.")
    ] = 20,
    max_new_tokens: Annotated[int, Option(min=1, help="Greedy completion budget.")] = 512,
    seed: Annotated[int, Option(help="Seed of the draws.")] = 0,
    device: Annotated[str, Option(help="auto, cpu, cuda, cuda:1, ...")] = "auto",
    dtype: Annotated[str, Option(help="auto, bfloat16, float32.")] = "auto",
    overwrite: OverwriteOption = False,
) -> None:
    """Attribute a metric to every block x prompt position of base/counterfactual pairs.

    For each pair both prompts are teacher-forced on the base's own reasoning and
    (a_cf - a_base) . dM/da_base is computed for every block and position (AtP, with AtP*'s
    GradDrop), for the answered action's logit difference and the log-probability of the
    coordinates the reasoning writes (goalprobe.probes.attribution); the first --check-pairs
    pairs are checked against real patches. Writes attribution.safetensors, attribution.json
    (docs/formats.md), attribution_check.json (with --check-pairs) and attribution_heatmap.html
    into --out; a non-empty --out is refused unless --overwrite. The demo's ``attribution`` stage
    runs the same task (goalprobe.stages.attribution.attribute) on the patching stage's pairs
    (--pairs RUN/patching/patch_pairs.jsonl --trajectories RUN/rollouts/trajectories.jsonl).
    """
    from goalprobe.activations.capture.gradients import GradientUnsupportedError
    from goalprobe.probes.attribution import METRICS, POSITION_SETS, AttributionConfig
    from goalprobe.probes.patching.counterfactuals import CounterfactualConfig
    from goalprobe.probes.patching.experiment import PatchConfig
    from goalprobe.sections import AttributionSection
    from goalprobe.stages.attribution import (
        DoesNotFitError,
        NoPairError,
        attribute,
    )

    if (trajectories is None) == (grids is None):
        raise typer.BadParameter("give exactly one of --trajectories and --grids")
    if pairs is not None and trajectories is None:
        raise typer.BadParameter("--pairs needs --trajectories (its bases)", param_hint="--pairs")
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
    try:
        section = AttributionSection(
            attribution=AttributionConfig(
                metrics=parse_list(metrics, str, "--metrics"),
                positions=positions,
                grad_drop=grad_drop,
            ),
            kinds=parse_list(kinds, str, "--kinds"),
            max_pairs=max_pairs,
            check_pairs=check_pairs,
            top_k=top_k,
            backend=backend,
        )
        cf_config = CounterfactualConfig(
            moves=parse_list(moves, str, "--moves"),
            disjoint_per_move=disjoint_per_move,
            control_per_move=control_per_move,
            random_state=seed,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    chosen, source, effort, template_dir = _choose_pairs(
        trajectories, grids, pairs, section, cf_config, sizes, max_bases, seed
    )
    if not chosen:
        raise typer.BadParameter(f"no pair of {pairs or trajectories or grids} to attribute")
    patch_config = PatchConfig(
        reasoning=mode, require_optimal=require_optimal, max_new_tokens=max_new_tokens,
        reasoning_effort=effort, template_dir=template_dir,
    )  # fmt: skip
    _mxfp4_refusal(model, device)
    from goalprobe.agents.models import load_model

    with removed_on_error(out):
        try:
            loaded = load_model(model, device=device, dtype=dtype)
            outcome = attribute(out, chosen, loaded, section, patch_config, source=source)
        except (GradientUnsupportedError, NoPairError, DoesNotFitError) as err:
            raise typer.BadParameter(str(err), param_hint="--model") from err
    typer.echo(f"wrote {', '.join(str(p) for p in outcome.paths.values())}")


def _choose_pairs(trajectories, grids, pairs, section, cf_config, sizes, max_bases, seed):
    """The pairs to attribute (read from ``--pairs``, else drawn from the bases), where they
    came from, and the recorded reasoning effort and chat-template folder."""
    from goalprobe.probes.patching.counterfactuals import base_from_grid
    from goalprobe.probes.patching.run import draw_bases, read_trajectory_bases
    from goalprobe.stages.attribution import pair_source, read_pairs

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
    if pairs is not None:
        if not pairs.is_file():
            raise typer.BadParameter(f"{pairs} does not exist", param_hint="--pairs")
        try:
            chosen = read_pairs(pairs, bases, section.kinds, section.max_pairs)
        except (ValueError, KeyError) as err:
            raise typer.BadParameter(str(err), param_hint="--pairs") from err
        source = pair_source(str(pairs), str(trajectories), len(read.bases))
    else:
        from goalprobe.probes.patching.counterfactuals import build_counterfactuals

        keep = parse_list(sizes, int, "--sizes", empty_ok=True) or None
        bases = draw_bases(bases, max_bases, seed, sizes=keep)
        drawn = build_counterfactuals(bases, cf_config)
        chosen = [p for p in drawn if p.kind in section.kinds][: section.max_pairs]
        source = pair_source(None, str(trajectories or grids), len(bases), asdict(cf_config))
    return chosen, source, effort, template_dir
