"""Stage ``harm``: rollouts on harm grids under a neutral and a morally conditioned prompt, and
MACHIAVELLI's reward-harm metrics with MEG under two utilities (``RUN/harm/``, schema
``goalprobe.demo.harm/1``)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from goalprobe.agents.prompts import merge_coverage, not_readable
from goalprobe.agents.trajectories import read_run_header
from goalprobe.gridworld.harm import generate_harm_grids, harm_profile
from goalprobe.gridworld.io import write_grid_set
from goalprobe.probes.scoring.harm import (
    MORAL,
    ORACLES,
    harm_episode,
    harm_meg,
    harm_table,
    meg_table,
    oracle_episodes,
    random_baseline,
    reward_harm_points,
)
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.rollouts import behaviour_episodes, rollouts_into, section_rollout

SCHEMA = "goalprobe.demo.harm/1"


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Generate the harm grids, run the agent under each prompt, and score reward and harm."""
    layout = context.layout
    h = config.harm
    grids = generate_harm_grids(h.grids)
    write_grid_set(layout.harm_grids, grids)
    by_id = {g.grid_id: g for g in grids}
    budgets = {g.grid_id: config.rollout.horizon(harm_profile(g).shortest_length) for g in grids}
    agent = context.agent(config.agent)
    rows, megs, summary, actions = [], {}, {}, {}
    for condition in h.conditions:
        rollout = dataclasses.replace(config.rollout, moral_conditioning=condition == MORAL)
        out = layout.harm_trajectories(condition)
        summary[condition] = rollouts_into(grids, agent, rollout, out, context)
        by_grid: dict[str, list] = {}
        for episode in behaviour_episodes(out):
            traj = episode.to_trajectory_data()
            actions[condition, traj.grid_id, episode.summary.episode] = traj.actions
            rows.append(harm_episode(by_id[traj.grid_id], traj, condition))
            by_grid.setdefault(traj.grid_id, []).append(traj)
        per_grid = [
            harm_meg(by_id[g], trajs, budget=budgets[g], harm_weight=h.harm_weight)
            for g, trajs in by_grid.items()
        ]
        megs[condition] = meg_table(per_grid, n_resamples=h.n_bootstrap, random_state=h.seed)
    # what the agent can read of each condition's prompts (the trajectory headers' record)
    coverage = {
        c: read_run_header(layout.harm_trajectories(c)).prompt_coverage for c in h.conditions
    }
    pieces = {
        c: None if cov is None else sorted({*cov["grid"]["pieces"], *cov["instructions"]["pieces"]})
        for c, cov in coverage.items()
    }
    unknown = None if all(v is None for v in pieces.values()) else pieces
    if h.oracle_episodes:  # the references the verdict is read against
        for oracle, g in itertools.product(ORACLES, grids):
            rows.extend(oracle_episodes(g, budgets[g.grid_id], oracle, h.oracle_episodes, h.seed))
    baseline = random_baseline(grids, budgets, h.random_trajectories, h.seed)
    table = harm_table(rows, baseline, n_resamples=h.n_bootstrap, random_state=h.seed)
    pairs = [k for k in actions if k[0] == MORAL and ("neutral", *k[1:]) in actions]
    same = sum(actions[k] == actions[("neutral", *k[1:])] for k in pairs)
    payload = {
        "schema": SCHEMA,
        "agent": config.agent.model,
        "grids": {g.grid_id: harm_profile(g).to_dict() for g in grids},
        "budgets": budgets,
        "random_trajectories": h.random_trajectories,
        "harm_weight": h.harm_weight,
        "unknown_prompt_pieces": unknown,
        "prompt_coverage": coverage,
        # "n/a: the agent cannot read ..." where it cannot: its harm rows then measure nothing
        "not_applicable": not_readable(merge_coverage(coverage.values())),
        "identical_trajectories": {"same_actions": same, "pairs": len(pairs)},
        **table,
        "meg": megs,
        "oracle_episodes": h.oracle_episodes,
        "points": reward_harm_points([r for r in rows if r.condition in h.conditions]),
        "episodes": [r.to_dict() for r in rows if r.condition in h.conditions],
    }
    outputs = {
        "grids": layout.harm_grids,
        "results": write_json(layout.harm_results, payload),
        **{f"trajectories_{c}": layout.harm_trajectories(c) for c in h.conditions},
    }
    return outputs, {
        "grids": len(grids),
        **{
            f"behaviour_score_{c}": table["conditions"][c]["behaviour_score"]["value"]
            for c in h.conditions
        },
        "rollouts": summary,
    }


STAGE = register(
    Stage(
        name="harm",
        run=run,
        writes=(
            "harm grids",
            "harm trajectories (neutral)",
            "harm trajectories (moral)",
            "harm results",
        ),
        section="harm",
        uses=("agent",),
        derived=lambda c: section_rollout(c, "harm"),
        generates=True,
        seconds=15,
    )
)
