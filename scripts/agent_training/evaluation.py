"""Behavioural quality of an agent on held-out grids, next to a random-walk baseline.

Episodes run through :func:`goalprobe.agents.rollout.run_rollouts` (batched across episodes,
study settings: temperature 0.7, top-p 0.95, horizon ``ceil(1.5 L)``); the random walk takes
uniformly random moves under the same horizon. Per (size, density) cell the table reports the
success rate and the per-action accuracy (fraction of an episode's actions that are optimal,
averaged over episodes; an invalid answer counts as not optimal), with percentile-bootstrap
95% confidence intervals over grids.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from goalprobe.agents.backend import Backend
from goalprobe.agents.bundled import MAP_ANCHOR_READING, SHIPPED_ANCHOR_READING
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import EpisodeSummary, read_trajectories
from goalprobe.gridworld.behaviour import random_walk
from goalprobe.gridworld.core import Grid, Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.optimal import solve

from goalprobe.stats import Estimate, grid_mean


@dataclass(frozen=True)
class EvaluationConfig:
    """The held-out evaluation of an agent."""

    sizes: tuple[int, ...] = (7, 9, 11, 13, 15)
    """Grid sides."""

    densities: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    """Obstacle densities."""

    grids_per_cell: int = 4
    """Held-out plain grids per (size, density) cell."""

    episodes_per_grid: int = 3
    """Agent episodes per grid."""

    random_walk_episodes_per_grid: int = 200
    """Random-walk episodes per grid (cheap)."""

    seed: int = 7_000_001
    """Base seed of the held-out grid set (training never sees these grids)."""

    temperature: float = 0.7
    """Sampling temperature (study: 0.7)."""

    top_p: float = 0.95
    """Nucleus mass (study: 0.95)."""

    max_new_tokens: int = 96
    """Token limit per answer (the bundled agent's completions are about 40 tokens)."""

    batch_size: int = 32
    """Episodes in flight per generate call."""

    bootstrap_samples: int = 1000
    """Bootstrap resamples (over grids) for the confidence intervals."""


def heldout_grids(config: EvaluationConfig) -> list[Grid]:
    """The held-out plain grids, ordered by size, density, index."""
    return generate_grid_set(
        GridSetConfig(
            sizes=config.sizes,
            densities=config.densities,
            n_per_cell=config.grids_per_cell,
            variant=Variant.PLAIN,
            seed=config.seed,
        )
    )


def _interval(
    per_grid: Sequence[float | np.floating], samples: int, rng: np.random.Generator
) -> list[float]:
    """``[low, high]``: the 95% interval of the mean rate over grids (Clopper-Pearson on the
    grids, honest at 0% and 100%; ``nan`` below two grids)."""
    stat = grid_mean(per_grid, n_resamples=samples, random_state=rng, rate=True)
    return list(Estimate.from_dict(stat).bounds())


def evaluate_agent(backend: Backend, config: EvaluationConfig, *, progress: bool = False) -> dict:
    """Run the agent and the random walk on :func:`heldout_grids`; JSON-ready results.

    Returns:
        ``{"config": ..., "cells": [{"size", "density", "episodes", "success_rate",
        "success_ci95", "action_accuracy", "action_accuracy_ci95", "invalid_rate",
        "random_success_rate", "random_action_accuracy"}, ...], "overall": {...}}``.
    """
    grids = heldout_grids(config)
    rollout_config = RolloutConfig(
        episodes_per_grid=config.episodes_per_grid,
        retries=0,
        batch_size=config.batch_size,
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "evaluation.jsonl"
        run_rollouts(grids, backend, rollout_config, path, progress=progress)
        summaries = [episode.summary for episode in read_trajectories(path)]
    return summarize(grids, summaries, config)


def summarize(
    grids: Sequence[Grid], summaries: Sequence[EpisodeSummary], config: EvaluationConfig
) -> dict:
    """The quality table of ``summaries`` (episodes on ``grids``) with the random walk."""
    rng = np.random.default_rng(config.seed)
    by_grid: dict[str, list[EpisodeSummary]] = defaultdict(list)
    for summary in summaries:
        by_grid[summary.grid_id].append(summary)
    cells = []
    for size in config.sizes:
        for density in config.densities:
            cell_grids = [g for g in grids if g.size == size and g.density == density]
            success, accuracy, invalid, rw_success, rw_accuracy = [], [], [], [], []
            n_episodes = 0
            for grid in cell_grids:
                episodes = by_grid.get(grid.grid_id, [])
                if not episodes:
                    continue
                n_episodes += len(episodes)
                success.append(np.mean([e.success for e in episodes]))
                accuracy.append(np.mean([e.optimal_steps / e.length for e in episodes]))
                invalid.append(
                    sum(e.invalid_steps for e in episodes) / sum(e.length for e in episodes)
                )
                walk = random_walk(
                    grid, solve(grid).horizon, config.random_walk_episodes_per_grid, rng
                )
                rw_success.append(walk.success_rate)
                rw_accuracy.append(walk.accuracy)
            if not n_episodes:
                continue
            cells.append(
                {
                    "size": size,
                    "density": density,
                    "grids": len(success),
                    "episodes": n_episodes,
                    "success_rate": float(np.mean(success)),
                    "success_ci95": _interval(success, config.bootstrap_samples, rng),
                    "action_accuracy": float(np.mean(accuracy)),
                    "action_accuracy_ci95": _interval(accuracy, config.bootstrap_samples, rng),
                    "invalid_rate": float(np.mean(invalid)),
                    "random_success_rate": float(np.mean(rw_success)),
                    "random_action_accuracy": float(np.mean(rw_accuracy)),
                }
            )
    overall = {
        key: float(np.mean([c[key] for c in cells]))
        for key in (
            "success_rate",
            "action_accuracy",
            "invalid_rate",
            "random_success_rate",
            "random_action_accuracy",
        )
    }
    return {"config": asdict(config), "cells": cells, "overall": overall}


def quality_table_markdown(result: dict) -> str:
    """The size x density table of :func:`evaluate_agent`'s result as Markdown."""
    lines = [
        "| size | density | episodes | success % (95% CI) | random-walk success % "
        "| per-action accuracy % (95% CI) | random-walk accuracy % | invalid % |",
        "|---:|---:|---:|---|---:|---|---:|---:|",
    ]
    for c in result["cells"]:
        lo, hi = c["success_ci95"]
        alo, ahi = c["action_accuracy_ci95"]
        lines.append(
            f"| {c['size']} | {c['density']:.1f} | {c['episodes']} "
            f"| {100 * c['success_rate']:.1f} ({100 * lo:.0f}-{100 * hi:.0f}) "
            f"| {100 * c['random_success_rate']:.1f} "
            f"| {100 * c['action_accuracy']:.1f} ({100 * alo:.0f}-{100 * ahi:.0f}) "
            f"| {100 * c['random_action_accuracy']:.1f} | {100 * c['invalid_rate']:.1f} |"
        )
    o = result["overall"]
    lines.append(
        f"| all | all | | {100 * o['success_rate']:.1f} | {100 * o['random_success_rate']:.1f} "
        f"| {100 * o['action_accuracy']:.1f} | {100 * o['random_action_accuracy']:.1f} "
        f"| {100 * o['invalid_rate']:.1f} |"
    )
    return "\n".join(lines)


TARGET_ACTION_ACCURACY = 0.90
"""Per-action accuracy the bundled agent must reach on sizes 7-11 at densities <= 0.4."""


def quality_status(evaluation: dict) -> dict:
    """Whether the evaluated agent meets the bundled agent's quality bar.

    Returns:
        ``{"target_accuracy", "target_cells_accuracy"`` (mean per-action accuracy over the cells
        of sizes 7-11 at densities <= 0.4), ``"meets_target"``, ``"cells_above_random_walk"``,
        ``"n_cells"}``.
    """
    cells = evaluation["cells"]
    target = [c for c in cells if 7 <= c["size"] <= 11 and c["density"] <= 0.4 + 1e-9]
    accuracy = float(np.mean([c["action_accuracy"] for c in target])) if target else float("nan")
    above = sum(c["action_accuracy_ci95"][0] > c["random_action_accuracy"] for c in cells)
    return {
        "target_accuracy": TARGET_ACTION_ACCURACY,
        "target_cells_accuracy": accuracy,
        "meets_target": bool(accuracy >= TARGET_ACTION_ACCURACY),
        "cells_above_random_walk": int(above),
        "n_cells": len(cells),
    }


def quality_status_markdown(evaluation: dict) -> str:
    """A status paragraph for the model card, computed from the evaluation (never hand-written)."""
    s = quality_status(evaluation)
    overall = evaluation.get("overall", {})
    accuracy = overall.get("action_accuracy", float("nan"))
    random_accuracy = overall.get("random_action_accuracy", float("nan"))
    comparison = (
        f"overall per-action accuracy {100 * accuracy:.1f}% against the random walk's "
        f"{100 * random_accuracy:.1f}%"
    )
    if s["meets_target"]:
        verdict = f"**meets** the target ({comparison})"
    elif accuracy >= random_accuracy + 0.15:
        verdict = (
            f"**does not meet** the target, though it is far from random ({comparison}): treat "
            "it as a goal-directed but imperfect agent"
        )
    else:
        verdict = (
            f"**does not meet** the target ({comparison}): treat this agent as a weak, "
            "near-random stand-in that exercises every code path, not as a goal-directed agent"
        )
    return (
        f"**Status.** Mean per-action accuracy on sizes 7-11 at densities <= 0.4: "
        f"{100 * s['target_cells_accuracy']:.1f}% (target {100 * s['target_accuracy']:.0f}%); "
        f"the lower 95% bound is above the random walk in {s['cells_above_random_walk']} of "
        f"{s['n_cells']} cells. This agent {verdict}."
    )


def _detour_phases(training: dict) -> list[dict]:
    return [p for p in training.get("phases", []) if p["name"] == "detour"]


def _detour_phase_markdown(training: dict) -> str:
    """The card's sentence on the second (detour) phase, empty when it did not run."""
    phases = _detour_phases(training)
    if not phases:
        return ""
    t, d = phases[0]["training_config"], phases[0]["data_config"]
    return (
        f"\nThen a detour phase of {t['steps']} steps (peak learning rate {t['learning_rate']}, "
        f"warm-up {t['warmup_steps']}, data seed {t['seed']}): with probability "
        f"{d['detour_fraction']} the state is drawn among its episode's detour states, where "
        "heading straight for G is not exactly optimal (an obstacle is in the way), and the "
        "plan's first move gets an extra cross-entropy term of weight "
        f"{t['decision_loss_weight']}. (The previous agent, trained by the first phase alone, "
        "answered 39% of such states wrongly and 1% of the others; docs/benchmarks.md.)"
    )


def _detour_flag(training: dict) -> str:
    phases = _detour_phases(training)
    return f" --detour-steps {phases[0]['training_config']['steps']}" if phases else ""


def model_card_text(training: dict, evaluation: dict, anchor_map: dict | None = None) -> str:
    """``MODEL_CARD.md`` of the bundled agent from its training info and evaluation result
    (and the anchor measurements of both bundled agents, :func:`anchor_map_markdown`)."""
    m = training["model_config"]
    t = training["training_config"]
    d = training["data_config"]
    e = evaluation["config"]
    return f"""# goalprobe bundled agent

A small GPT-OSS (`transformers.GptOssForCausalLM`) trained from scratch by
`scripts/train_default_agent.py` to play goalprobe's grid world through the same harmony prompts
as GPT-OSS-20B (`agents/templates`). It lets the whole pipeline (rollout, capture,
probes, patching, MEG) run offline on a CPU. It is a research stand-in, not a model of
GPT-OSS-20B's internals.

## Architecture

| field | value |
|---|---|
| class | `GptOssForCausalLM` (mixture-of-experts, attention sinks, RoPE) |
| parameters | {training["parameters"]:,} |
| layers | {m["num_hidden_layers"]} (sliding-window {m["sliding_window"]} and full attention alternate) |
| d_model | {m["hidden_size"]} |
| heads | {m["num_attention_heads"]} query / {m["num_key_value_heads"]} key-value, head_dim {m["head_dim"]} |
| experts | {m["num_local_experts"]}, top-{m["num_experts_per_tok"]}, SwiGLU width {m["intermediate_size"]} |
| max positions | {m["max_position_embeddings"]}, RoPE theta {m["rope_theta"]:g} |
| tokenizer | word-level (`agents/tokenizer.py`), harmony special tokens, one token per grid cell |

## Training data

Each example is one step of an episode on a freshly generated grid: sizes {d["sizes"]} (weights
{d["size_weights"]}), density uniform in {d["density_range"]}; a fraction
{d["key_prompt_probability"]} of the batches use the key-and-door prompt with variants
{sorted(d["key_variant_weights"])}. The state is drawn from an episode of the optimal policy
perturbed by random moves (probability {d["epsilon"]}). Target: the analysis channel
`A is at (r, c). G is at (r, c). [K/D positions, key status.] Next to A: UP <symbol> DOWN
<symbol> LEFT <symbol> RIGHT <symbol>. Plan: <next {d["plan_steps"]} moves>.`
(a shortest path, ties broken uniformly at random), then the final channel `{{"action": "..."}}`.
Next-token loss on the completion tokens only, plus two auxiliary losses used in training and
then discarded (`scripts/agent_training/supervision.py`): a linear read-out of the residual stream
after block {t.get("coordinate_layer", "-")} must name every grid cell's (row, col) (weight
{t.get("coordinate_loss_weight", 0)}), and designated heads of the full-attention layers must
attend to the cell whose coordinates or neighbours the reasoning is writing (weight
{t.get("attention_loss_weight", 0)}). Without them the model never learns to locate A and G
(coordinates stay at chance). The held-out evaluation grids are excluded from training.

## Training

Seed {t["seed"]}; {t["steps"]} AdamW steps of {t["batch_size"]} examples, peak learning rate
{t["learning_rate"]} (warm-up {t["warmup_steps"]} steps, cosine decay to 10%), weight decay
{t["weight_decay"]}, gradient clipping {t["grad_clip"]}.{_detour_phase_markdown(training)} Trained in
{training["training_seconds"] / 60:.1f} min on `{training["device"]}`
({training["torch_threads"]} torch thread(s), machine `{training["machine"]}`, shared with other
jobs). Final training loss {training["final_loss"]:.3f}.

Reproduce: `python scripts/train_default_agent.py --seed {t["seed"]} --steps {t["steps"]}{_detour_flag(training)}`
(add `--device cuda` on a GPU).

## Quality on held-out grids

{e["grids_per_cell"]} plain grids per cell (seed {e["seed"]}), {e["episodes_per_grid"]} episodes
per grid, temperature {e["temperature"]}, top-p {e["top_p"]}, horizon ceil(1.5 L), no retries
(an invalid answer is a non-optimal step). Random walk: {e["random_walk_episodes_per_grid"]}
uniformly random episodes per grid, same horizon. 95% CIs: percentile bootstrap over grids.

{quality_table_markdown(evaluation)}

{quality_status_markdown(evaluation)}

Evaluation took {evaluation.get("seconds", float("nan")) / 60:.1f} min.
{_anchor_section(anchor_map, SHIPPED_ANCHOR_READING)}"""


def _anchor_section(anchor_map: dict | None, reading: str) -> str:
    if anchor_map is None:
        return ""
    return (
        "\n## What the pre-reasoning anchors hold\n\n"
        f"{reading}\n\n{anchor_map_markdown(anchor_map)}"
    )


def _pct(e: dict) -> str:
    return f"{100 * e['value']:.1f}% [{100 * e['ci_low']:.1f}, {100 * e['ci_high']:.1f}]"


def _bits(e: dict) -> str:
    return f"{e['value']:+.2f} [{e['ci_low']:.2f}, {e['ci_high']:.2f}]"


def blocked_phase_section(blocked_training: dict, blocked: dict) -> str:
    """The card's section on the blocked phase (the weights shipped now): ``blocked_training``,
    the ``info`` of ``training_log_blocked.json``; ``blocked``, ``blocked.json`` (copy line and
    behaviour from ``scripts/measure_map_walls.py``, moves on the demo's control grids from
    ``scripts/measure_control_moves.py`` for these weights and the walls phase's)."""
    phase = blocked_training["phases"][0]
    t, data = phase["training_config"], phase["data_config"]
    copy, b = blocked["copy_line"], blocked["behaviour"]
    now, before = blocked["moves"]["blocked_phase"], blocked["moves"]["walls_phase"]
    return f"""## Blocked phase: the weights shipped now

The weights in this directory are the walls-phase weights (next section, digest
`{blocked_training["init"]["weights_digest"]}`) **plus a fifth phase, `--map-recipe blocked`**
(docs/map_agent.md, seventh session; {blocked_training["steps_run"]} steps of {t["batch_size"]}
examples at peak learning rate {t["learning_rate"]}, {blocked_training["training_seconds"] / 60:.1f}
minutes on `{blocked_training["device"]}`; log `training_log_blocked.json`, every 10th step):
plans, and the map read-out's optimal moves, are optimal on the true walls within two steps of A
with every other cell open (`plan_belief="{data["plan_belief"]}"`: what the copy line names), a
share {data["blocked_fraction"]} of the states is drawn where every move toward G runs into a
wall next to A, and the plan's first move weighs {t["decision_loss_weight"]}. Its moves are thereby
a function of what its anchors hold.

Measured (`{blocked["command"]}`): the copy line writes the prior-uncertain cells of ring 1 right
{_pct(copy["1"]["copy"])} of the time ({copy["1"]["n_cells"]} cells; prior {_pct(copy["1"]["prior"])})
and of ring 2 {_pct(copy["2"]["copy"])} ({copy["2"]["n_cells"]} cells; prior
{_pct(copy["2"]["prior"])}); per-action accuracy at sizes 7-11, d <= 0.4:
{100 * b["action_accuracy"]:.1f}% (walls phase {100 * blocked["previous_action_accuracy"]:.1f}%).
On the demo's 60 control grids (`{blocked["moves_command"]}`; true A and G), this phase against
the walls phase: moves optimal on the true walls {_pct(now["true"])} against
{_pct(before["true"])}; on the walls within two steps of A plus the prior's beyond, minus on the
prior map, {_pct(now["near_prior_minus_prior"])} against {_pct(before["near_prior_minus_prior"])};
moves into a wall {_pct(now["bumps"])} against {_pct(before["bumps"])}, and where every move
toward G is blocked {_pct(now["bumps_when_blocked"])} against {_pct(before["bumps_when_blocked"])}.
The ring figures of the next section are the walls phase's; the demo's agent-centred read-out
(docs/results.md) measures these weights.

"""


def walls_phase_section(walls_training: dict, walls: dict, *, shipped: bool = True) -> str:
    """The card's section on the walls phase (the weights shipped now unless a later phase
    followed: ``shipped``): ``walls_training``, the ``info`` of ``training_log_walls.json``;
    ``walls``, ``walls.json`` (its figures from ``scripts/measure_map_walls.py``)."""
    phase = walls_training["phases"][0]["training_config"]
    ring = walls["rings"]["2"]
    copy, b = walls["copy_line"], walls["behaviour"]
    heading = "Walls phase: the weights shipped now" if shipped else "Walls phase"
    were = "are" if shipped else "were"
    return (
        f"""## {heading}

The weights in this directory {were} the three phases below **plus a fourth, walls phase**
(`--map-recipe walls-offset`, docs/map_agent.md, fifth session; {walls_training["steps_run"]}
steps of {phase["batch_size"]} examples at peak learning rate {phase["learning_rate"]},
{walls_training["training_seconds"] / 60:.1f} minutes on `{walls_training["device"]}`; log
`training_log_walls.json`, every 10th step): the map read-out's cells weighted by how uncertain
their wall is given size and density, a read-out of the 12 cells within two steps of A from the
anchors after block 2, attention supervision of block 2's free anchor heads to the 8 cells two
steps away, and a reasoning line that copies those 12 cells (`The walls by A: ...`) from the
anchors (the completion's barrier to the grid text stays).

Measured on held-out grids (`{walls["command"]}`): held-out bits per prior-uncertain cell of
the conditional wall probe in the agent frame over the same probe fitted on another
same-size-and-density grid's anchors, block 2 (rings of steps from A):

| ring | bits over the null | accuracy, probe | accuracy, null |
|---|---|---|---|
"""
        + "\n".join(
            f"| {k} | {_bits(ring_k['bits'])} | {_pct(ring_k['accuracy_probe'])} | "
            f"{_pct(ring_k['accuracy_null'])} |"
            for k, ring_k in sorted(walls["rings"]["2"].items())
        )
        + f"""

The copy line writes the prior-uncertain cells of ring 1 right {_pct(copy["1"]["copy"])} of the
time ({copy["1"]["n_cells"]} cells; the prior's majority call {_pct(copy["1"]["prior"])}) and
of ring 2 {_pct(copy["2"]["copy"])} ({copy["2"]["n_cells"]} cells; prior
{_pct(copy["2"]["prior"])}). Per-action accuracy on sizes 7-11 at d <= 0.4 (the card's held-out
grids, {walls["behaviour_config"]["grids_per_cell"]} grids x
{walls["behaviour_config"]["episodes_per_grid"]} episodes per cell):
{100 * b["action_accuracy"]:.1f}% (before the phase {100 * walls["previous_action_accuracy"]:.1f}%;
random walk {100 * b["random_action_accuracy"]:.1f}%). Ring 2 at block 2: {_bits(ring["2"]["bits"])}
bits. The DAS figures are in `das.json` (measured on these weights). **The sections below**
(training, behaviour, anchors) describe the three-phase weights this phase started from
(digest `{walls_training["init"]["weights_digest"]}`); their card protocol and `anchor_map.json`
were not rerun for the new weights.

"""
    )


def map_model_card_text(
    training: dict,
    evaluation: dict,
    anchor_map: dict | None,
    walls: tuple[dict, dict] | None = None,
    blocked: tuple[dict, dict] | None = None,
) -> str:
    """``MODEL_CARD.md`` of the map agent (``bundled:map``, the positive control); ``walls``:
    ``(training_log_walls.json's info, walls.json)`` when the weights had the walls phase;
    ``blocked``: ``(training_log_blocked.json's info, blocked.json)`` when the blocked phase
    followed it."""
    phase = training["phases"][0]
    t = phase["training_config"]
    e = evaluation["config"]
    init = training["init"]
    layer_types = ", ".join(training.get("layer_types", []))
    walls_words = (
        "since the walls phase (next section) they hold the walls one and two steps from A\n"
        "too; the walls farther away they hold only as well as the grid's size and density "
        "predict."
        if walls
        else "the walls away from A they hold only as well as the grid's size and density predict."
    )
    walls_section = walls_phase_section(*walls, shipped=blocked is None) if walls else ""
    if blocked:
        walls_section = blocked_phase_section(*blocked) + walls_section
    return f"""# goalprobe map agent (`bundled:map`): the positive control

The same small GPT-OSS as the default bundled agent (`bundled`: same tokenizer, prompts,
harmony format, width and depth; its third block uses full attention instead of a 128-token
sliding window: {layer_types}), trained so that its reasoning and answer read nothing of the
grid text and use only what the pre-reasoning anchors (`<|end|> <|start|> assistant` closing
the prompt) hold, where a training-only read-out asks for the whole map (every cell, the agent,
the goal, A's neighbours, the optimal moves). Measured on held-out grids (below): the anchors
hold the agent's and the goal's cells and A's neighbourhood, and patching them moves the
action; {walls_words}
Its use: a model whose internals are known by construction, on which the toolkit's position
probes, patches and belief scores must find what is there, so that their null results on other
agents mean something. It is not a model of GPT-OSS-20B's internals.

{walls_section}## Training

Warm-started from the default agent's weights (`{Path(init["directory"]).name}`, weights digest
`{init["weights_digest"]}`); {len(training["phases"])} phase(s) of AdamW steps of
{t["batch_size"]} examples (warm-up {t["warmup_steps"]} steps, cosine decay to 10%, a fresh
optimizer and fresh read-outs per phase), data seed {t["seed"]}, detour fraction
{phase["data_config"]["detour_fraction"]}:

{_phase_table(training["phases"])}

The loss is the next-token loss on the completion plus training-only objectives that are
discarded from the saved model (`scripts/agent_training/map_supervision.py`):

* a log-odds barrier on every completion token's attention to the grid text, every block and
  head (weight {t["object_attention_weight"]}, floor {t["grid_attention_floor"]}, ramped in
  from 0 where the table says so);
* a linear read-out of the anchors after blocks {t["map_layers"]} naming every cell, A, G, A's
  neighbours and the optimal moves (weight {t["map_loss_weight"]});
* attention supervision routing A and G into the anchors (block 1), A's neighbours into the
  anchors (block 2), and the coordinate tokens and direction words to the anchors (block 3)
  (weight {t["attention_loss_weight"]}); the cells' coordinates read out after block 0;
* the plan's first move weighted {t["decision_loss_weight"]}.

Trained in {training["training_seconds"] / 60:.1f} min on `{training["device"]}`
({training["torch_threads"]} torch thread(s), machine `{training["machine"]}`) on top of the
default agent's own training. Reproduce: `python scripts/train_default_agent.py --map --out
agents/bundled_map` (docs/map_agent.md has the ablations).

## Quality on held-out grids

{e["grids_per_cell"]} plain grids per cell (seed {e["seed"]}), {e["episodes_per_grid"]} episodes
per grid, temperature {e["temperature"]}, top-p {e["top_p"]}, horizon ceil(1.5 L), no retries.
Random walk: {e["random_walk_episodes_per_grid"]} uniformly random episodes per grid. 95% CIs:
percentile bootstrap over grids.

{quality_table_markdown(evaluation)}

{quality_status_markdown(evaluation)}
{_anchor_section(anchor_map, MAP_ANCHOR_READING)}"""


def _phase_table(phases: list[dict]) -> str:
    """Markdown table of a training log's phases: steps, peak learning rate, barrier ramp and
    the plans' tie-break."""
    lines = [
        "| phase | steps | peak learning rate | barrier ramp (steps) | plan tie-break |",
        "|---|---|---|---|---|",
    ]
    for phase in phases:
        t, d = phase["training_config"], phase["data_config"]
        lines.append(
            f"| {phase['name']} | {t['steps']} | {t['learning_rate']} "
            f"| {t.get('barrier_ramp_steps', 0)} | {d.get('tie_break', 'random')} |"
        )
    return "\n".join(lines)


def _figure(entry: dict | None, percent: bool = True) -> str:
    """``value [low, high]`` of a ``{value, ci_low, ci_high}`` dict ("-" when absent)."""
    if not entry:
        return "-"
    scale, unit = (100.0, "%") if percent else (1.0, "")
    return (
        f"{entry['value'] * scale:.1f}{unit} "
        f"[{entry['ci_low'] * scale:.1f}, {entry['ci_high'] * scale:.1f}]"
    )


def anchor_map_markdown(anchor_map: dict) -> str:
    """The bundled agents' anchor measurements side by side (``scripts/measure_anchor_map.py``'s
    ``anchor_map.json``): decodability of the map at the pre-reasoning anchors and the effect of
    patching them, per agent, with the baselines and grid-bootstrap 95% CIs."""
    probe_grids, patch_grids = anchor_map["probe_grids"], anchor_map["patch_grids"]
    models = " ".join(f"--model {name}" for name in anchor_map["models"])
    lines = [
        f"Measured by `python scripts/measure_anchor_map.py {models}` on grids never used in "
        "training (split by grid; 95% grid-bootstrap CIs).",
        "",
        f"**Decodability** ({probe_grids['per_cell']} grids per size x density cell, sizes "
        f"{probe_grids['sizes']}, densities {probe_grids['densities']}, {probe_grids['per_grid']}"
        f" prompt-only states per grid, seed {probe_grids['seed']}): the study's per-cell MLP "
        "probe at the three pre-reasoning anchor tokens, cell accuracy on grid cells and the "
        "agent's and goal's top-1 cell (argmax of the probe's A / G probability), against the "
        "per-cell majority, the per-cell prior given the grid's size and density (a stronger "
        "baseline the probe must also beat to show more than density) and the same probe "
        "trained on shuffled labels.",
        "",
        "| agent | block | test grids | cell accuracy | per-cell majority | size x density prior "
        "| shuffled | agent top-1 | goal top-1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in anchor_map["models"].items():
        for layer, row in result["probe"].items():
            probe = row["probe"]
            lines.append(
                f"| `{name}` | {layer} | {row['n_test_grids']} "
                f"| {_figure(probe.get('accuracy_no_padding'))} "
                f"| {_figure(row['majority'].get('accuracy_no_padding'))} "
                f"| {_figure(row.get('prior_size_density', {}).get('accuracy_no_padding'))} "
                f"| {_figure(row['shuffled'].get('accuracy_no_padding'))} "
                f"| {_figure(probe.get('agent_top1'))} | {_figure(probe.get('goal_top1'))} |"
            )
    if any("positions" in result for result in anchor_map["models"].values()):
        lines += [
            "",
            "**Localisation** (same stores and test grids): a position probe (`goalprobe "
            "train-probe --target position`: a logistic regression per coordinate, the cell the "
            "pair of argmaxes) for the agent and for the goal, against the most frequent "
            "position of the grid's size and the same probe fitted on positions shuffled "
            "between grids.",
            "",
            "| agent | block | agent top-1 | size prior | shuffled | goal top-1 | size prior "
            "| shuffled |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, result in anchor_map["models"].items():
            for layer, row in result.get("positions", {}).items():
                cells = " | ".join(
                    _figure(row[target][model])
                    for target in ("agent", "goal")
                    for model in ("probe", "prior_size", "shuffled")
                )
                lines.append(f"| `{name}` | {layer} | {cells} |")
    lines += [
        "",
        f"**Causality** ({patch_grids['per_cell']} grids per cell, sizes {patch_grids['sizes']},"
        f" densities {patch_grids['densities']}, seed {patch_grids['seed']}; agent- and goal-"
        "moved counterfactuals, kept where the agent acts optimally on both sides before "
        "patching): the counterfactual's pre-reasoning anchors written over the base's at the "
        "listed blocks, the reasoning regenerated greedily. Disjoint pairs (optimal sets "
        "disjoint): the share whose action moves into the counterfactual's optimal set; control "
        "pairs (same optimal set): the share whose action changes.",
        "",
        "| agent | blocks patched | disjoint pairs | action -> counterfactual-optimal "
        "| control pairs | action changed |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in anchor_map["models"].items():
        for layers, row in result["patch"].items():
            lines.append(
                f"| `{name}` | {layers} | {row.get('n_disjoint', 0)} "
                f"| {_figure(row.get('disjoint_into_cf_optimal'))} "
                f"| {row.get('n_control', 0)} | {_figure(row.get('control_changed'))} |"
            )
    return "\n".join(lines) + "\n"
