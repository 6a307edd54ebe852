"""Stage ``intention_map``: the subjective reading of the intention test (``RUN/intention_map/``,
schema ``goalprobe.demo.intention_map/1``).

Does the agent's decoded map register the intervention? The start state of every intention grid
(original and intervened; the first matched state of :mod:`activations.gridworld.intention`) is
written as a prompt-only state (:mod:`activations.agent.prompt_states`), its pre-reasoning anchor
is extracted at the headline probe's layer, and the headline cell probe of the probing set
(:data:`goalprobe.stages.HEADLINE_PROBE`) decodes the map. For each intervention the decoded
probability that the changed cell (the key cell; the door cell) is open is compared between the
original and the intervened start, where it truly is open
(:func:`activations.gridworld.intention.decoded_registration`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from activations.agent.harmony import encode_prompt
from activations.agent.prompt_states import PromptStatesConfig, write_prompt_states
from activations.gridworld.core import CellType
from activations.gridworld.intention import (
    INTERVENTIONS,
    MAP_CELL,
    IntentionTestConfig,
    decoded_registration,
)
from activations.gridworld.io import read_grid_set
from goalprobe.agents import AgentConfig
from goalprobe.config import ActivationsConfig, DemoConfig
from goalprobe.stages import HEADLINE_PROBE, HEADLINE_STAGE, headline_run
from goalprobe.stages.activations import extract_into
from goalprobe.stages.context import StageContext, write_json
from probes.probe_sweep import StoreProbeLoader
from probes.serialization import load_probe

SCHEMA = "goalprobe.demo.intention_map/1"
KEY, DOOR = int(CellType.KEY), int(CellType.DOOR)


@dataclass(frozen=True)
class IntentionMapInput:
    """What the stage receives."""

    agent: AgentConfig
    """The agent whose prompts are encoded and replayed."""
    states: PromptStatesConfig
    """The prompt settings (one state per grid: its start)."""
    batch_size: int
    """Sequences per forward pass of the extraction."""
    test: IntentionTestConfig
    """The bootstrap of the intervals."""


def inputs(config: DemoConfig) -> IntentionMapInput:
    """The agent, its prompt settings, the extraction batch size and the bootstrap."""
    states = PromptStatesConfig(
        states_per_grid=1,
        reasoning_effort=config.rollouts.reasoning_effort,
        template_dir=config.rollouts.template_dir,
        seed=config.intention.seed,
    )
    return IntentionMapInput(
        config.agent, states, config.activations.batch_size, config.intention.test
    )


def run(context: StageContext, config: IntentionMapInput, stage_dir: Path):
    """Prompt, extract and decode the start states; compare the changed cells."""
    layout = context.layout
    sweep = json.loads(layout.probing_probe_sweep(f"cell_{'_'.join(HEADLINE_PROBE)}").read_text())
    head = headline_run(sweep)
    if head is None:
        raise ValueError(f"the probing sweep has no {HEADLINE_STAGE} run to decode with")
    probe = load_probe(head["model_path"])
    grids = read_grid_set(layout.intention_grids)
    agent = context.agent(config.agent)
    tokenizer = agent.loaded().tokenizer
    layout.intention_map_states.unlink(missing_ok=True)
    write_prompt_states(
        grids,
        lambda messages, effort: encode_prompt(tokenizer, messages, effort),
        config.states,
        layout.intention_map_states,
        backend_description=agent.config.identity(),
    )
    extract_into(
        context,
        config.agent,
        ActivationsConfig(layers=(int(head["layer"]),), batch_size=config.batch_size),
        layout.intention_map_states,
        layout.intention_map_store,
        stages=(HEADLINE_STAGE,),
    )
    data = StoreProbeLoader(layout.intention_map_store)(HEADLINE_STAGE, int(head["layer"]))
    probs = probe.predict_proba(data.acts)  # (N, S, S, C)
    classes = [int(c) for c in probe.classes_]
    if int(CellType.OPEN) not in classes:
        raise ValueError(f"probe {head['name']} has no open-cell class to decode")
    col = classes.index(int(CellType.OPEN))
    row_of = {str(g): i for i, g in enumerate(data.grid_ids)}
    by_id = {g.grid_id: g for g in grids}
    results = []
    for variant, names in INTERVENTIONS.items():
        originals = [g for g in grids if g.variant == variant and "intervention" not in g.extra]
        for name in names:
            what = MAP_CELL[name]
            pairs = [(g, by_id[f"{g.grid_id}~{name}"]) for g in originals]
            if not pairs:
                continue
            p_a = np.array([probs[row_of[g.grid_id]][getattr(g, what)][col] for g, _ in pairs])
            p_b = np.array([probs[row_of[o.grid_id]][getattr(g, what)][col] for g, o in pairs])
            result = decoded_registration(p_a, p_b, [g.grid_id for g, _ in pairs], config.test)
            results.append(
                {
                    "variant": variant,
                    "intervention": name,
                    "cell": what,
                    "probe_knows_original_type": (KEY if what == "key" else DOOR) in classes,
                    **result,
                }
            )
    payload = {
        "schema": SCHEMA,
        "probe": head["name"],
        "model_path": head["model_path"],
        "layer": int(head["layer"]),
        "results": results,
    }
    out = write_json(layout.intention_map_results, payload)
    summary = {f"{r['variant']}/{r['intervention']}": r["registered"] for r in results}
    return {
        "states": layout.intention_map_states,
        "store": layout.intention_map_store,
        "results": out,
    }, {"probe": head["name"], **summary}
