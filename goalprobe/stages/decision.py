"""Stage ``decision``: where the decision is made, read with a logit lens on the main rollouts'
steps (``RUN/decision/lens.json``, ``goalprobe.demo.decision/1``; per step and reasoning chunk
``RUN/decision/steps.jsonl``, :mod:`goalprobe.probes.decision_steps`, for the viewer).

For up to ``max_steps`` answered steps (a seeded sample spread over the grids) every block's
residual stream is read through the final norm and unembedding at each reasoning chunk's end
and at the answer's action (:mod:`goalprobe.probes.decision_time`), pooled by
:func:`goalprobe.probes.decision_time.decision_curves`. Beside the lens, the action, the
plan's first move and the agent's and goal's cells are read out of the ``activations`` store
per reasoning-progress bin and layer on held-out grids, against their strongest baselines
(:func:`goalprobe.probes.decision_time.reasoning_readout`; ``reasoning_readout`` in
``lens.json``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from goalprobe.activations.capture import make_backend
from goalprobe.activations.store import ActivationStore
from goalprobe.gridworld.core import Action
from goalprobe.probes.decision_steps import chunk_texts, step_record, write_decision_steps
from goalprobe.probes.decision_time import (
    StepLens,
    bin_positions,
    capture_resid,
    decision_curves,
    lens_from_resid,
    readout_curves,
    reasoning_readout,
    step_positions,
)
from goalprobe.probes.splits import split_by_grid
from goalprobe.sections import DecisionConfig
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.rollouts import read_episodes

SCHEMA = "goalprobe.demo.decision/1"


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Read the lens on a seeded sample of answered steps and pool the curves; read the
    decision out of the store over reasoning time."""
    d = config.decision
    steps = [s for e in read_episodes(context.layout.trajectories) for s in e.steps if s.action]
    picked = sorted(np.random.default_rng(d.seed).permutation(len(steps))[: d.max_steps].tolist())
    loaded = context.agent(config.agent).loaded()
    backend = make_backend("hooks", loaded.model, loaded.tokenizer)
    lenses, features, present, kept, records, skipped = [], [], [], [], [], 0
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
        resid = capture_resid(backend, ids, [*pos.chunk_ends, pos.answer])
        probs = lens_from_resid(loaded.model, resid, pos.candidates)
        fractions = np.asarray(pos.chunk_fractions)
        lenses.append(StepLens(step.grid_id, int(action), fractions, probs[:, :-1], probs[:, -1]))
        records.append(_step_record(loaded.tokenizer, step, action, pos, ids, probs))
        where = bin_positions(fractions)
        chunks = resid[:, :-1].float().numpy()
        blank = np.zeros((chunks.shape[0], chunks.shape[2]), dtype=np.float32)
        features.append(np.stack([chunks[:, i] if i is not None else blank for i in where], axis=1))
        present.append([i is not None for i in where])
        kept.append(step)
    if not lenses:
        raise ValueError(
            f"none of the {len(picked)} sampled steps has a final answer naming its action "
            "(cut off by the token limit, or not in the harmony format): nothing to read"
        )
    curves = decision_curves(lenses, n_resamples=d.n_bootstrap, random_state=d.seed)
    readout = _readout(kept, np.asarray(features), np.asarray(present), d)
    with ActivationStore(context.layout.store) as store:
        grids = len(set(store.labels(["grid_id"])["grid_id"].tolist()))
        along = None
        if grids >= 4:  # a split by grid needs grids on both sides
            along = reasoning_readout(store, n_resamples=d.n_bootstrap, random_state=d.seed)
    payload = {
        "schema": SCHEMA,
        "agent": config.agent.model,
        "chunk": d.chunk,
        "steps_sampled": len(picked),
        "steps_skipped": skipped,
        **curves,
        "readout": readout,
        "reasoning_readout": along,
    }
    out = write_json(context.layout.decision_lens, payload)
    per_step = write_decision_steps(
        context.layout.decision_steps,
        records,
        agent=config.agent.model,
        chunk=d.chunk,
        layers=curves["layers"],
    )
    last = curves["answer_by_layer"][-1]["value"]
    return {"lens": out, "steps": per_step}, {"steps": len(lenses), "answer_last_layer": last}


def _step_record(tokenizer, step, action: Action, pos, ids: list[int], probs: np.ndarray) -> dict:
    """One step's line of ``RUN/decision/steps.jsonl`` (:mod:`goalprobe.probes.decision_steps`):
    each chunk's text and the lens at its end, and the lens at the answer."""
    offsets = list(pos.chunk_offsets)
    start = pos.chunk_ends[0] - offsets[0] if offsets else 0
    length = offsets[-1] + 1 if offsets else 0  # the last chunk ends at the last token
    texts = chunk_texts(tokenizer.decode, ids[start : start + length], offsets)
    key = (step.grid_id, step.episode, step.step)
    return step_record(key, action, length, offsets, pos.chunk_fractions, texts, probs)


def _readout(steps, features: np.ndarray, present: np.ndarray, d: DecisionConfig) -> dict | None:
    """The action read out of the residual stream per layer and progress bin, on held-out grids
    (half the grids), against the majority action, the optimal policy on the true grid and a
    read-out of the agent's and goal's coordinates (each fitted on the training grids)."""
    from sklearn.linear_model import LogisticRegression

    ids = np.asarray([s.grid_id for s in steps])
    if len(set(ids.tolist())) < 4:
        return None
    actions = np.asarray([int(Action[s.action]) for s in steps])
    split = split_by_grid(ids, test_fraction=0.5, random_state=d.seed)
    train = np.isin(np.arange(len(ids)), split.train)
    majority = np.full(len(ids), np.bincount(actions[train], minlength=4).argmax())
    optimal = np.asarray([int(Action[sorted(s.optimal_actions)[0]]) for s in steps])
    coords = np.asarray([[*s.agent_row_col, *s.goal_row_col] for s in steps])
    onehot = np.concatenate([np.eye(15)[coords[:, k]] for k in range(4)], axis=1)
    baselines = {"majority action": majority, "optimal policy (true grid)": optimal}
    if len(np.unique(actions[train])) >= 2:
        state = LogisticRegression(C=1.0, max_iter=1000).fit(onehot[train], actions[train])
        baselines["agent and goal coordinates"] = state.predict(onehot)
    return readout_curves(
        features,
        present,
        actions,
        ids,
        train,
        baselines,
        n_resamples=d.n_bootstrap,
        random_state=d.seed,
    )


STAGE = register(
    Stage(
        name="decision",
        run=run,
        reads=("rollouts", "activations"),
        writes=("decision lens", "decision steps"),
        section="decision",
        uses=("agent",),
        weights=True,
        control=True,
        seconds=12,
        torch_threads=1,
    )
)
