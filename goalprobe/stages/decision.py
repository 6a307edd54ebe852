"""Stage ``decision``: where the decision is made, read with a logit lens on the main rollouts'
steps (``RUN/decision/lens.json``, schema ``goalprobe.demo.decision/1``).

For up to ``max_steps`` answered steps (the same sample for every run of a seed, spread over the
grids), the residual stream after every block is read through the final norm and unembedding
at the end of each reasoning chunk and at the position that predicts the answer's action
(:mod:`goalprobe.probes.logit_lens`); :func:`goalprobe.probes.decision_time.decision_curves`
pools the agreement with the answered action per layer and reasoning progress.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goalprobe.activations.capture import make_backend
from goalprobe.agent_config import AgentConfig
from goalprobe.config import DemoConfig
from goalprobe.gridworld.core import Action
from goalprobe.probes.decision_time import StepLens, decision_curves
from goalprobe.probes.logit_lens import lens_probs, step_positions
from goalprobe.sections import DecisionConfig
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.rollouts import read_episodes

SCHEMA = "goalprobe.demo.decision/1"


@dataclass(frozen=True)
class DecisionInput:
    """What the stage receives."""

    agent: AgentConfig
    """The agent (its weights are read locally)."""
    decision: DecisionConfig
    """The step sample, chunk length and bootstrap."""


def inputs(config: DemoConfig) -> DecisionInput:
    """The agent and the decision section."""
    return DecisionInput(config.agent, config.decision)


def run(context: StageContext, config: DecisionInput, stage_dir: Path):
    """Read the lens on a seeded sample of answered steps and pool the curves."""
    d = config.decision
    steps = [s for e in read_episodes(context.layout.trajectories) for s in e.steps if s.action]
    rng = np.random.default_rng(d.seed)
    picked = sorted(rng.permutation(len(steps))[: d.max_steps].tolist())
    loaded = context.agent(config.agent).loaded()
    backend = make_backend("hooks", loaded.model, loaded.tokenizer)
    lenses, skipped = [], 0
    for index in picked:
        step = steps[index]
        action = Action[step.action]
        pos = step_positions(
            loaded.tokenizer, step.prompt_token_ids, step.generated_token_ids, action, d.chunk
        )
        if pos is None:
            skipped += 1
            continue
        ids = [*step.prompt_token_ids, *step.generated_token_ids]
        probs = lens_probs(backend, ids, [*pos.chunk_ends, pos.answer], pos.candidates)
        lenses.append(
            StepLens(
                grid_id=step.grid_id,
                action=int(action),
                fractions=np.asarray(pos.chunk_fractions),
                chunks=probs[:, :-1],
                answer=probs[:, -1],
            )
        )
    curves = decision_curves(lenses, n_resamples=d.n_bootstrap, random_state=d.seed)
    payload = {
        "schema": SCHEMA,
        "agent": config.agent.model,
        "chunk": d.chunk,
        "steps_sampled": len(picked),
        "steps_skipped": skipped,
        **curves,
    }
    out = write_json(context.layout.decision_lens, payload)
    last = curves["answer_by_layer"][-1]["value"]
    return {"lens": out}, {"steps": len(lenses), "answer_last_layer": last}
