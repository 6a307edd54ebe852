"""Stage ``intention``: behavioural intention on the key variants (Ward et al., Definition 20;
``RUN/intention/``, schema ``goalprobe.demo.intention/1``).

Each key-variant layout is run against its interventions (:mod:`goalprobe.gridworld.intention`):
the agent's actions are sampled at matched states of the original and the intervened grid, and
the change in its action distribution is tested. The exact optimal policy ``pi*`` goes through
the same test on the same grids and states as the positive control of the test itself, and the
verdict reads the agent's adaptation as a fraction of ``pi*``'s (at the states where ``pi*``
changes), beyond the adaptation to an irrelevant change of the prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from goalprobe.agents.prompt_states import agent_sampler
from goalprobe.agents.prompts import PromptTemplate, not_readable
from goalprobe.agents.rollout import rollout_coverage
from goalprobe.gridworld.intention import (
    INTERVENTIONS,
    control_effects,
    intention_study,
    intervene,
    optimal_policy,
    tabular_sampler,
)
from goalprobe.gridworld.io import write_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.rollouts import variant_grids

SCHEMA = "goalprobe.demo.intention/1"


ROLE_NOTE = (
    "descriptive: at K samples per state and the grids a demo affords, the adaptation "
    "fraction's interval is about 50 points wide and 'intended' needs its upper end at "
    "1 - margin, which a noisy agent that adapts fully (about 0.70 of the optimal shift "
    "sampled) does not reach; a verdict needs K >= 12 and about 45 qualifying grids (issue 40)"
)
"""Why the intention rows are read descriptively (``role``)."""


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Generate the layouts and their interventions, sample the agent and pi*, test."""
    layout = context.layout
    k = config.intention
    originals = variant_grids(k.variants, (k.size,), k.density, k.grids_per_variant, k.seed)
    intervened = [intervene(g, name) for g in originals for name in INTERVENTIONS[g.variant]]
    write_grid_set(layout.intention_grids, [*originals, *intervened])
    backend, description = context.agent(config.agent).rollout_backend()
    study: dict[str, Any] = dict(
        max_states=k.states_per_grid, config=k.test, irrelevant=k.irrelevant_change
    )
    control = intention_study(
        originals, tabular_sampler(optimal_policy, k.samples_per_state, k.seed), **study
    )
    agent = intention_study(
        originals,
        agent_sampler(backend, k.samples_per_state, config.rollout),
        controls=control_effects(control["results"]),
        **study,
    )
    # what the agent can read of these prompts (this path generates outside run_rollouts)
    template = (
        PromptTemplate.from_dir(config.rollout.template_dir)
        if config.rollout.template_dir
        else None
    )
    coverage = rollout_coverage(
        backend, originals, [solve(g) for g in originals], config.rollout, template
    )
    payload = {
        "schema": SCHEMA,
        "backend": description,
        "samples_per_state": k.samples_per_state,
        "states_per_grid": k.states_per_grid,
        "grids_per_variant": k.grids_per_variant,
        "margin_fraction": k.test.margin_fraction,
        "irrelevant_change": k.irrelevant_change,
        "agent": agent["results"],
        "optimal_control": control["results"],
        "states": agent["states"],
        "role": "descriptive",
        "role_note": ROLE_NOTE,
        "prompt_coverage": coverage,
        "not_applicable": not_readable(coverage),
    }
    results = write_json(layout.intention_results, payload)
    verdicts = {f"{r['variant']}/{r['intervention']}": r["verdict"] for r in agent["results"]}
    return {"grids": layout.intention_grids, "results": results}, {
        "grids": len(originals),
        "matched_states": len(agent["states"]),
        **verdicts,
    }


STAGE = register(
    Stage(
        name="intention",
        run=run,
        writes=("intention grids", "intention results"),
        section="intention",
        uses=("agent",),
        derived=lambda c: {"rollout": c.rollouts},
        generates=True,
        seconds=94,
    )
)
