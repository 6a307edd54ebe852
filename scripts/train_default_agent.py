"""Train the bundled agent (a small GPT-OSS) from a seed, evaluate it and write its model card.

Usage::

    python scripts/train_default_agent.py                      # train + evaluate (CPU)
    python scripts/train_default_agent.py --device cuda        # minutes on a GPU
    python scripts/train_default_agent.py --eval-only          # re-evaluate the saved agent
    python scripts/train_default_agent.py --map --out DIR      # the map agent (below)

Writes ``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer files,
``training_log.json``, ``evaluation.json`` and ``MODEL_CARD.md`` into ``--out`` (default: the
packaged ``agents/bundled``). Progress goes to stdout.

``--map`` warm-starts from ``--init`` (default: the shipped agent, itself reproducible from its seed
by the plain command) and runs only the map agent's phases (:func:`map_recipe`: the three phases
that made ``bundled:map``; ``--map-recipe single`` runs one phase of :func:`map_phase` with the
ablation options, :mod:`agent_training.map_supervision`; ``--map-recipe walls`` runs
:func:`walls_phase` from the map agent's weights); it needs an ``--out`` other than the agent it
starts from. ``--stop-after-minutes`` ends a run early with its weights saved. ``--card-only`` rewrites ``MODEL_CARD.md`` from the files in ``--out`` (after
``scripts/measure_anchor_map.py`` has written ``anchor_map.json`` there). docs/map_agent.md records
the map agent's recipe, its ablations and its figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from agent_training.evaluation import (
    EvaluationConfig,
    evaluate_agent,
    heldout_grids,
    quality_table_markdown,
)
from agent_training.training import (
    GRID_PENALTY_SCOPES,
    TrainingConfig,
    build_model,
    train,
    with_layer_types,
)
from agent_training.training_data import (
    TIE_BREAKS,
    TrainingDataConfig,
)
from goalprobe.agents.bundled import (
    BUNDLED_AGENT_DIR,
    MAP_AGENT,
    BundledModelConfig,
    bundled_agent_dir,
    bundled_weights_digest,
    load_bundled_agent,
)
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.tokenizer import build_tokenizer

DETOUR_PHASE_STEPS = 600
"""Steps of the second training phase (see :func:`detour_phase`)."""

MAP_LAYER_TYPES = ("sliding_attention", "full_attention", "full_attention", "full_attention")
"""Block types of the map agent: the shipped agent's with the third block full attention (the
anchors read A in block 1 and A's neighbours in block 2, anywhere in the grid; a sliding window
of 128 tokens misses the top rows of grids above 9 x 9)."""

MAP_PHASE_STEPS = 600
"""Steps of the map phase (``--map``, see :func:`map_phase`)."""


def map_phase(
    config: TrainingConfig, data_config: TrainingDataConfig, steps: int
) -> tuple[TrainingConfig, TrainingDataConfig]:
    """The map agent's phase, warm-started from the default agent's weights (its third block
    turned into full attention, :data:`MAP_LAYER_TYPES`): every completion token is barred from
    the grid text by a log-odds barrier on its attention (``grid_penalty_scope="completion"``,
    floor 1e-3), so the reasoning and the answer can only use what the pre-reasoning anchors
    hold; the anchors learn to hold it from the map read-out (every cell, A, G, A's neighbours,
    the optimal moves) and from anchor routing of the attention supervision (the anchors read A
    and G in block 1 and A's neighbours in block 2; the coordinate tokens and the direction
    words read the anchors in block 3) (:mod:`agent_training.map_supervision`), plus the
    detour phase's decision weight and detour states so the behaviour holds. The cell-coordinate
    read-out moves to block 0's output, so the cells carry their coordinates by block 1. The
    barrier's weight rises from 0 over its first 300 steps: switched on cold it wrecks the
    warm-started model (docs/map_agent.md, runs ``c2`` and ``e1``)."""
    return (
        replace(
            config,
            steps=steps,
            learning_rate=config.learning_rate * 2 / 3,
            warmup_steps=20,
            seed=config.seed + 20,
            decision_loss_weight=1.0,
            map_loss_weight=1.0,
            object_attention_weight=20.0,
            barrier_ramp_steps=300,
            grid_penalty_scope="completion",
            grid_attention_floor=1e-3,
            anchor_routing=True,
            readout_warmup_steps=25,
            coordinate_layer=1,
        ),
        replace(data_config, detour_fraction=0.3),
    )


MAP_RECIPES = ("chain", "single", "walls", "walls-offset", "belief", "blocked")
"""``--map-recipe`` values: the three phases of the shipped map agent, one phase (ablations), the
walls phase from the map agent's weights (:func:`walls_phase`), that phase with each cell told
its offset from A (:func:`walls_offset_phase`), the belief phase (:func:`belief_phase`) or that
phase on blocked states (:func:`blocked_phase`)."""

WALLS_PHASE_STEPS = 320
"""Steps of the walls phase (``--map-recipe walls``; ``--map-steps`` changes it)."""


def walls_phase(
    config: TrainingConfig, data_config: TrainingDataConfig, steps: int
) -> tuple[TrainingConfig, TrainingDataConfig]:
    """A fourth map phase, from the map agent's weights (``--init`` defaults to
    ``agents/bundled_map``), that asks the anchors for the walls around A (issue 39, item 4):

    * the map read-out's cell term on grid cells only, each weighted by how uncertain its wall is
      given the grid's size and density, at 5 times the rest of the read-out
      (``map_cell_weighting="uncertain"``): the shipped read-out averaged all 225 canvas cells,
      padding included, and plateaued at the prior;
    * a read-out of the 12 cells within two steps of A after block 2 (weight 3) and attention
      supervision of block 2's free heads at the anchors to the eight cells at distance 2
      (:data:`agent_training.supervision.NEAR_ANCHOR_SLOTS`; ring 1 was already supervised);
    * a reasoning line copying those 12 cells (``The walls by A: ...``), read from the anchors
      (the barrier between the completion and the grid stays at full weight), so its accuracy is
      a behavioural measure of what the anchors hold;
    * the rest as the third phase (``map3``): fixed tie-breaks, detour states, the plan's first
      move weighted, fresh grids every step (a new data seed).
    """
    first, data = map_phase(config, data_config, steps)
    return (
        replace(
            first,
            learning_rate=1.5e-3,
            barrier_ramp_steps=0,
            readout_warmup_steps=10,
            seed=config.seed + 30,
            map_cell_weighting="uncertain",
            map_cell_weight=5.0,
            near_loss_weight=3.0,
        ),
        replace(data, tie_break="first", near_line=True),
    )


def walls_offset_phase(
    config: TrainingConfig, data_config: TrainingDataConfig, steps: int
) -> tuple[TrainingConfig, TrainingDataConfig]:
    """:func:`walls_phase` with a signal that tells every grid cell its offset from A before
    the anchors look the cells up (docs/map_agent.md, fifth session; the capacity note
    ``anchor-capacity.md`` found rings 1 and 2 learnt almost at once with it and not in 2,000
    steps without): in block 1, head 3 of every grid-cell token is supervised to attend to A's
    cell (weight 1), and a linear read-out of the cell's offset from A (the 25 offsets of the
    5 x 5 box around A, or "farther") reads the residual stream after block 1 (weight 1), so the
    ring-2 heads of block 2 can address a cell by a constant offset key."""
    walls, data = walls_phase(config, data_config, steps)
    return (
        replace(walls, offset_loss_weight=1.0, offset_attention_weight=1.0),
        data,
    )


def belief_phase(
    config: TrainingConfig, data_config: TrainingDataConfig, steps: int
) -> tuple[TrainingConfig, TrainingDataConfig]:
    """A phase from the map agent's weights that makes its moves a function of what its anchors
    hold (issue 39, item 5): :func:`walls_phase`, with plans (and the map read-out's optimal
    moves) optimal on the walls within two steps of A with every other cell open
    (``plan_belief="near"``, plain grids; key grids keep the true grid), at a lower peak rate.
    Plans on the true grid asked the completion for walls it cannot see (the barrier), so its
    moves followed the size-and-density prior about as well as its own walls."""
    walls, data = walls_phase(config, data_config, steps)
    return replace(walls, learning_rate=1e-3), replace(data, plan_belief="near")


def blocked_phase(
    config: TrainingConfig, data_config: TrainingDataConfig, steps: int
) -> tuple[TrainingConfig, TrainingDataConfig]:
    """:func:`belief_phase` with 40% of the states drawn where every move toward G runs into a
    wall next to A (``blocked_fraction``) and the plan's first move at three times the weight:
    the shipped control names such a wall in its copy line and still moves into it in about a
    fifth of those states (docs/map_agent.md, seventh session)."""
    belief, data = belief_phase(config, data_config, steps)
    return replace(belief, decision_loss_weight=3.0), replace(data, blocked_fraction=0.4)


WARM_PHASES = {
    "walls": walls_phase,
    "walls-offset": walls_offset_phase,
    "belief": belief_phase,
    "blocked": blocked_phase,
}
"""Recipes of one phase from the map agent's weights (``--init`` defaults to them)."""


def map_recipe(
    config: TrainingConfig, data_config: TrainingDataConfig
) -> list[tuple[str, TrainingConfig, TrainingDataConfig]]:
    """The shipped map agent's recipe: three map phases in a row (docs/map_agent.md, runs
    ``e1`` -> ``e2`` -> ``e3``), each with a fresh optimizer and fresh read-outs.

    1. ``map``: :func:`map_phase` (600 steps, peak learning rate 2e-3, the barrier ramped in
       over 300 steps);
    2. ``map2``: 500 more steps at 1.5e-3, the barrier ramped in again (a fresh optimizer);
    3. ``map3``: 200 steps at 1e-3 on plans that break ties among equally short moves by a
       fixed order (``tie_break="first"``), the barrier at full weight: with a completion that
       depends only on the anchors, a random tie-break let the anchor patch flip a fifth of the
       control pairs (their optimal sets are equal) to the other optimal move.
    """
    first, data = map_phase(config, data_config, MAP_PHASE_STEPS)
    return [
        ("map", first, data),
        ("map2", replace(first, steps=500, learning_rate=1.5e-3), data),
        (
            "map3",
            replace(first, steps=200, learning_rate=1e-3, barrier_ramp_steps=0),
            replace(data, tie_break="first"),
        ),
    ]


def detour_phase(
    config: TrainingConfig, data_config: TrainingDataConfig, steps: int
) -> tuple[TrainingConfig, TrainingDataConfig]:
    """The second phase: half the states drawn among detour states, extra weight on the plan's
    first move, a short warm-up to a lower peak learning rate, a fresh data stream.

    After the first phase the agent heads straight for G almost perfectly but errs on 40% of
    the states where an obstacle is in the way (9 x 9 - 11 x 11 grids at density 0.4); a
    300-step trial of this phase on the first phase's weights halved those errors
    (docs/benchmarks.md).
    """
    return (
        replace(
            config,
            steps=steps,
            learning_rate=config.learning_rate / 3,
            warmup_steps=20,
            seed=config.seed + 10,
            decision_loss_weight=1.0,
        ),
        replace(data_config, detour_fraction=0.5),
    )


SINGLE_PHASE_OPTIONS = (
    "map_steps",
    "grid_penalty_scope",
    "grid_attention_floor",
    "interchange_weight",
    "object_attention_weight",
    "barrier_ramp_steps",
    "isolate_objects",
    "tie_break",
    "map_batch_size",
    "map_learning_rate",
)
"""Options (``argparse`` destinations) of a single map phase (``--map-recipe single``)."""


def _open_fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = TrainingConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUNDLED_AGENT_DIR, help="output directory")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="training seed")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument(
        "--detour-steps",
        type=_non_negative_int,
        default=DETOUR_PHASE_STEPS,
        help="steps of the second phase, on detour states (0 skips it)",
    )
    parser.add_argument(
        "--map",
        action="store_true",
        help="train the map agent: warm-start from --init and run only the map phase",
    )
    parser.add_argument(
        "--init",
        type=Path,
        default=None,
        help="weights the map phase starts from (default: the default bundled agent; for "
        "--map-recipe walls the map agent)",
    )
    parser.add_argument(
        "--map-recipe",
        choices=MAP_RECIPES,
        default="chain",
        help="chain: the map agent's three phases; single: one phase, with the options below "
        "(ablations); walls: a fourth phase from the map agent asking the anchors for the walls "
        "around A (--map-steps applies)",
    )
    parser.add_argument(
        "--map-steps",
        type=_non_negative_int,
        default=None,
        help=f"single map phase: steps (default {MAP_PHASE_STEPS})",
    )
    parser.add_argument(
        "--grid-penalty-scope",
        choices=GRID_PENALTY_SCOPES,
        default=None,
        help="single map phase: completion tokens barred from reading the grid text",
    )
    parser.add_argument(
        "--grid-attention-floor",
        type=_open_fraction,
        default=None,
        help="single map phase: log-barrier attention penalties down to this mass "
        "(default -log(1-w))",
    )
    parser.add_argument(
        "--interchange-weight",
        type=float,
        default=None,
        help="single map phase: weight of the interchange objective (0 turns it off)",
    )
    parser.add_argument(
        "--object-attention-weight",
        type=float,
        default=None,
        help="single map phase: weight of the attention penalties",
    )
    parser.add_argument(
        "--barrier-ramp-steps",
        type=_non_negative_int,
        default=None,
        help="single map phase: steps over which the attention penalties' weight rises from 0",
    )
    parser.add_argument(
        "--isolate-objects",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="single map phase: bar the grid's tokens from attending to A and G",
    )
    parser.add_argument(
        "--tie-break",
        choices=TIE_BREAKS,
        default=None,
        help="single map phase: how training plans choose among equally short moves",
    )
    parser.add_argument(
        "--map-batch-size", type=int, default=None, help="single map phase: examples per step"
    )
    parser.add_argument(
        "--map-learning-rate", type=float, default=None, help="single map phase: peak learning rate"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--log-every", type=int, default=25, help="print every N steps")
    parser.add_argument(
        "--checkpoint-every", type=int, default=250, help="save the model every N steps"
    )
    parser.add_argument(
        "--stop-after-minutes",
        type=float,
        default=None,
        help="end the training after this many minutes (the weights are saved as at the end)",
    )
    parser.add_argument("--eval-only", action="store_true", help="evaluate the saved agent")
    parser.add_argument("--skip-eval", action="store_true", help="train without evaluating")
    parser.add_argument(
        "--card-only",
        action="store_true",
        help="rewrite MODEL_CARD.md from the files in --out (after measure_anchor_map.py)",
    )
    parser.add_argument(
        "--eval-grids-per-cell", type=int, default=EvaluationConfig().grids_per_cell
    )
    parser.add_argument(
        "--eval-episodes-per-grid", type=int, default=EvaluationConfig().episodes_per_grid
    )
    parser.add_argument("--eval-batch-size", type=int, default=EvaluationConfig().batch_size)
    return parser.parse_args(argv)


def save(model, tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def run_training(args: argparse.Namespace, eval_config: EvaluationConfig) -> dict:
    model_config = BundledModelConfig()
    data_config = TrainingDataConfig()
    config = replace(
        TrainingConfig(),
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )
    if args.map:
        model, tokenizer = load_bundled_agent("cpu", args.init)
        if args.grid_penalty_scope in (None, "completion"):
            model = with_layer_types(model, MAP_LAYER_TYPES)
    else:
        tokenizer = build_tokenizer()
        model = build_model(model_config, tokenizer, seed=config.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: GptOssForCausalLM, {n_params / 1e6:.2f} M parameters, vocab {len(tokenizer)}")
    print(f"model config: {asdict(model_config)}")
    print(f"training: {asdict(config)}")
    exclude = frozenset(heldout_grids(eval_config))
    print(f"held-out evaluation grids excluded from training: {len(exclude)}", flush=True)

    phases = [("base", config, data_config)]
    if args.map and args.map_recipe in WARM_PHASES:
        phase = WARM_PHASES[args.map_recipe]
        walls_config, walls_data = phase(config, data_config, args.map_steps or WALLS_PHASE_STEPS)
        if args.map_batch_size is not None:
            walls_config = replace(walls_config, batch_size=args.map_batch_size)
        phases = [("walls", walls_config, walls_data)]
        print(f"walls phase from {args.init} ({bundled_weights_digest(args.init)}): {walls_config}")
    elif args.map and args.map_recipe == "chain":
        phases = map_recipe(config, data_config)
        print(f"map phases from {args.init} ({bundled_weights_digest(args.init)}):")
        for name, phase_config, phase_data in phases:
            print(f"  {name}: {phase_config}, tie_break {phase_data.tie_break}")
    elif args.map:
        map_config, map_data = map_phase(config, data_config, args.map_steps or MAP_PHASE_STEPS)
        overrides = {
            "grid_penalty_scope": args.grid_penalty_scope,
            "grid_attention_floor": args.grid_attention_floor,
            "interchange_loss_weight": args.interchange_weight,
            "object_attention_weight": args.object_attention_weight,
            "isolate_objects": args.isolate_objects,
            "barrier_ramp_steps": args.barrier_ramp_steps,
            "batch_size": args.map_batch_size,
            "learning_rate": args.map_learning_rate,
        }
        map_config = replace(map_config, **{k: v for k, v in overrides.items() if v is not None})
        if args.tie_break is not None:
            map_data = replace(map_data, tie_break=args.tie_break)
        phases = [("map", map_config, map_data)]
        print(f"map phase from {args.init} ({bundled_weights_digest(args.init)}): {phases[0][1]}")
    elif args.detour_steps > 0:
        detour_config, detour_data = detour_phase(config, data_config, args.detour_steps)
        print(
            f"detour phase: {asdict(detour_config)}, detour_fraction {detour_data.detour_fraction}"
        )
        phases.append(("detour", detour_config, detour_data))
    total_steps = sum(phase_config.steps for _, phase_config, _ in phases)
    log: list[dict] = []
    started = time.perf_counter()
    deadline = None if args.stop_after_minutes is None else started + 60 * args.stop_after_minutes
    for phase, phase_config, phase_data in phases:
        log += train(
            model,
            tokenizer,
            phase_config,
            phase_data,
            device=args.device,
            exclude=exclude,
            on_step=_progress_printer(
                args, model, tokenizer, phase, len(log), total_steps, deadline
            ),
        )
        if deadline is not None and time.perf_counter() >= deadline:
            print(f"stopped after {len(log)} of {total_steps} steps (--stop-after-minutes)")
            break
    seconds = time.perf_counter() - started
    model.to("cpu")
    save(model, tokenizer, args.out)
    info = {
        "model_config": asdict(model_config),
        "training_config": asdict(config),
        "data_config": asdict(data_config),
        "phases": [
            {"name": phase, "training_config": asdict(c), "data_config": asdict(d)}
            for phase, c, d in phases
        ],
        "parameters": n_params,
        "layer_types": list(model.config.layer_types),
        "init": (
            {"directory": str(args.init), "weights_digest": bundled_weights_digest(args.init)}
            if args.map
            else None
        ),
        "training_seconds": seconds,
        "device": str(args.device),
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "final_loss": sum(x["loss"] for x in log[-50:]) / len(log[-50:]),
        "steps_run": len(log),
    }
    (args.out / "training_log.json").write_text(
        json.dumps({"info": info, "log": log}, indent=1), encoding="utf-8"
    )
    print(f"trained in {seconds:.0f}s; saved to {args.out}", flush=True)
    return info


def _progress_printer(
    args, model, tokenizer, phase: str, offset: int, total_steps: int, deadline=None
):
    """An ``on_step`` callback printing progress every ``--log-every`` steps (numbered over all
    phases), checkpointing every ``--checkpoint-every`` and asking to stop (True) once
    ``deadline`` (a ``time.perf_counter`` value) has passed."""
    records: list[dict] = []
    started = time.perf_counter()

    def on_step(record: dict) -> None:
        record["phase"] = phase
        records.append(record)
        done = offset + record["step"] + 1
        if done % args.log_every == 0 or done == total_steps:
            recent = records[-args.log_every :]
            loss = sum(r["loss"] for r in recent) / len(recent)
            accuracy = sum(r["answer_accuracy"] for r in recent) / len(recent)
            auxiliary = ""
            for name in (
                "coordinate_loss",
                "attention_loss",
                "decision_loss",
                "map_loss",
                "map_cell_accuracy",
                "near_loss",
                "near_accuracy",
                "offset_loss",
                "offset_accuracy",
                "offset_attention_loss",
                "ring2_attention",
                "interchange_loss",
                "object_attention_loss",
            ):
                values = [r[name] for r in recent if name in r]
                if values:
                    auxiliary += f"  {name.removesuffix('_loss')} {sum(values) / len(values):.4f}"
            elapsed = time.perf_counter() - started
            rate = elapsed / len(records)
            print(
                f"[{phase}] step {done}/{total_steps}  loss {loss:.4f}{auxiliary}  answer acc "
                f"{accuracy:.3f}  {elapsed:.0f}s in phase  eta {rate * (total_steps - done):.0f}s"
                f"  {record['tokens'] / record['seconds']:.0f} tokens/s",
                flush=True,
            )
        if args.checkpoint_every and done % args.checkpoint_every == 0:
            save(model, tokenizer, args.out)
            model.train()
        return deadline is not None and time.perf_counter() >= deadline

    return on_step


def run_evaluation(args: argparse.Namespace, eval_config: EvaluationConfig) -> dict:
    model, tokenizer = load_bundled_agent(args.device, args.out)
    backend = LocalBackend(model, tokenizer)
    started = time.perf_counter()
    result = evaluate_agent(backend, eval_config, progress=True)
    seconds = time.perf_counter() - started
    result["seconds"] = seconds
    (args.out / "evaluation.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(quality_table_markdown(result))
    print(f"evaluated in {seconds:.0f}s", flush=True)
    return result


def write_model_card(out: Path, *, map_agent: bool) -> None:
    """``MODEL_CARD.md`` from the directory's training log and evaluation, with the anchor
    measurements of both bundled agents when the directory holds ``anchor_map.json``
    (``scripts/measure_anchor_map.py``), the walls phase's section when it holds
    ``training_log_walls.json`` and ``walls.json`` (``scripts/measure_map_walls.py``) and the
    blocked phase's when it holds ``training_log_blocked.json`` and ``blocked.json``."""
    from agent_training.evaluation import map_model_card_text, model_card_text

    training = json.loads((out / "training_log.json").read_text(encoding="utf-8"))["info"]
    evaluation = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    anchors_path = out / "anchor_map.json"
    anchors = (
        json.loads(anchors_path.read_text(encoding="utf-8")) if anchors_path.is_file() else None
    )

    def phase(name: str, measured: str) -> tuple[dict, dict] | None:
        log, figures = out / f"training_log_{name}.json", out / measured
        if not (log.is_file() and figures.is_file()):
            return None
        return (
            json.loads(log.read_text(encoding="utf-8"))["info"],
            json.loads(figures.read_text(encoding="utf-8")),
        )

    text = (
        map_model_card_text(
            training,
            evaluation,
            anchors,
            phase("walls", "walls.json"),
            phase("blocked", "blocked.json"),
        )
        if map_agent
        else model_card_text(training, evaluation, anchors)
    )
    (out / "MODEL_CARD.md").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    single = [f"--{name.replace('_', '-')}" for name in SINGLE_PHASE_OPTIONS]
    given = [flag for name, flag in zip(SINGLE_PHASE_OPTIONS, single, strict=True)
             if getattr(args, name) is not None]  # fmt: skip
    walls = args.map_recipe in WARM_PHASES
    if args.map_recipe != "chain" and not args.map:
        print(f"error: --map-recipe {args.map_recipe}: only with --map", file=sys.stderr)
        return 2
    if walls:
        given = [flag for flag in given if flag not in ("--map-steps", "--map-batch-size")]
    if given and args.map_recipe != "single":
        print(f"error: {', '.join(given)}: only with --map --map-recipe single", file=sys.stderr)
        return 2
    if args.init is None:
        args.init = bundled_agent_dir(MAP_AGENT if walls else "bundled")
    if args.map and args.out.resolve() in (args.init.resolve(), BUNDLED_AGENT_DIR.resolve()):
        print("error: --map needs an --out other than the agent it starts from", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    eval_config = replace(
        EvaluationConfig(),
        grids_per_cell=args.eval_grids_per_cell,
        episodes_per_grid=args.eval_episodes_per_grid,
        batch_size=args.eval_batch_size,
    )
    if args.card_only:
        write_model_card(args.out, map_agent=args.map)
        print(f"model card: {args.out / 'MODEL_CARD.md'}")
        return 0
    if not args.eval_only:
        run_training(args, eval_config)
    if not args.skip_eval:
        run_evaluation(args, eval_config)
        write_model_card(args.out, map_agent=args.map)
        print(f"model card: {args.out / 'MODEL_CARD.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
