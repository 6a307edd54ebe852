"""Stage ``intention_map``: the subjective reading of the intention test (``RUN/intention_map/``,
schema ``goalprobe.demo.intention_map/1``).

Does the agent's decoded map register the intervention? The start state of every intention grid
(original and intervened; the first matched state of :mod:`goalprobe.gridworld.intention`) is
written as a prompt-only state (:mod:`goalprobe.agents.prompt_states`), its pre-reasoning anchor
is extracted at the headline probe's layer, and the headline cell probe of the probing set
(:data:`goalprobe.stages.HEADLINE_PROBE`) decodes the map. For each intervention the decoded
probability that the changed cell (the key cell; the door cell) is open is compared between the
original and the intervened start, where it truly is open
(:func:`goalprobe.gridworld.intention.decoded_registration`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from goalprobe.activations.extract import ExtractConfig
from goalprobe.agents.prompt_states import PromptStatesConfig
from goalprobe.config import ActivationsConfig, DemoConfig
from goalprobe.gridworld.core import CellType
from goalprobe.gridworld.intention import INTERVENTIONS, MAP_CELL, decoded_registration
from goalprobe.gridworld.io import read_grid_set
from goalprobe.stages import HEADLINE_STAGE
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.decode import decode_prompt_states, load_decoder
from goalprobe.stages.registry import Settings, Stage, register

SCHEMA = "goalprobe.demo.intention_map/1"


KEY, DOOR = int(CellType.KEY), int(CellType.DOOR)


def _received(config: DemoConfig) -> dict:
    """The agent's prompt settings, the extraction batch size and the bootstrap."""
    states = PromptStatesConfig(
        states_per_grid=1,
        reasoning_effort=config.rollouts.reasoning_effort,
        template_dir=config.rollouts.template_dir,
        seed=config.intention.seed,
    )
    return {
        "states": states,
        "batch_size": config.activations.extract.batch_size,
        "test": config.intention.test,
    }


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Prompt, extract and decode the start states; compare the changed cells."""
    layout = context.layout
    decoder = load_decoder(layout)
    if decoder is None:
        raise ValueError(f"the probes stage left no {HEADLINE_STAGE} headline probe to decode with")
    probe = decoder.probe
    grids = read_grid_set(layout.intention_grids)
    maps = decode_prompt_states(
        context,
        config.agent,
        ActivationsConfig(extract=ExtractConfig(batch_size=config.batch_size)),
        config.states,
        grids,
        decoder,
        {g.grid_id: [g.initial_state] for g in grids},
        layout.intention_map_states,
        layout.intention_map_store,
    )
    open_class = int(CellType.OPEN)
    if open_class not in probe.classes:
        raise ValueError(f"probe {probe.name} has no open-cell class to decode")
    by_id = {g.grid_id: g for g in grids}

    def p_open(grid, cell) -> float:
        """The decoded probability that ``cell`` of ``grid``'s start is open."""
        return maps[(grid.grid_id, grid.initial_state)][0][cell][open_class]

    results = []
    for variant, names in INTERVENTIONS.items():
        originals = [g for g in grids if g.variant == variant and "intervention" not in g.extra]
        for name in names:
            what = MAP_CELL[name]
            pairs = [(g, by_id[f"{g.grid_id}~{name}"]) for g in originals]
            if not pairs:
                continue
            p_a = np.array([p_open(g, getattr(g, what)) for g, _ in pairs])
            p_b = np.array([p_open(o, getattr(g, what)) for g, o in pairs])
            result = decoded_registration(p_a, p_b, [g.grid_id for g, _ in pairs], config.test)
            results.append(
                {
                    "variant": variant,
                    "intervention": name,
                    "cell": what,
                    "probe_knows_original_type": (KEY if what == "key" else DOOR) in probe.classes,
                    **result,
                }
            )
    payload = {
        "schema": SCHEMA,
        "probe": probe.name,
        "model_path": layout.relative(probe.card),
        "probe_trained_on": probe.trained_on,
        "layer": probe.layer,
        "results": results,
    }
    out = write_json(layout.intention_map_results, payload)
    summary = {f"{r['variant']}/{r['intervention']}": r["registered"] for r in results}
    return {
        "states": layout.intention_map_states,
        "store": layout.intention_map_store,
        "results": out,
    }, {"probe": probe.name, **summary}


STAGE = register(
    Stage(
        name="intention_map",
        run=run,
        reads=("intention", "probes"),
        writes=("intention map states", "intention map store", "intention map results"),
        uses=("agent",),
        derived=_received,
        weights=True,
        seconds=2,
        torch_threads=1,
    )
)
