"""Decoding prompt-only states with the headline cell probe: the one implementation for the
stages that ask what the agent's anchors hold about grids of their own (the false-belief grids,
the intention interventions).

The probe is the headline cell probe (:data:`goalprobe.stages.HEADLINE_PROBE` at
:data:`goalprobe.stages.HEADLINE_STAGE` and :func:`goalprobe.stages.headline_layer`) fit on the
probing set, the largest training set of the run; the main store's is the fallback when the
probing stage did not run. States are written as prompt-only states
(:mod:`goalprobe.agents.prompt_states`: pre-reasoning anchors depend on the prompt alone, so
they are the anchors of any step in that state), only the headline stage and layer are
extracted, and the probe returns a full ``(S, S, len(CellType))`` distribution per state.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goalprobe.activations.store import ActivationStore
from goalprobe.agent_config import AgentConfig
from goalprobe.agents.harmony import encode_prompt
from goalprobe.agents.prompt_states import PromptStatesConfig, write_prompt_states
from goalprobe.config import ActivationsConfig
from goalprobe.gridworld.core import Grid, State
from goalprobe.probes.scoring.false_belief import full_class_probs
from goalprobe.probes.serialization import load_probe
from goalprobe.run_layout import RunLayout
from goalprobe.stages import HEADLINE_PROBE, HEADLINE_STAGE, headline_run
from goalprobe.stages.activations import extract_into
from goalprobe.stages.context import StageContext

TORCH_THREADS = 1
"""Torch threads this stage computes with, whatever ``--jobs`` and the cores (its numbers
must not depend on them; :func:`goalprobe.scheduler.fixed_torch_threads`)."""


@dataclass(frozen=True)
class HeadlineProbe:
    """Where the headline cell probe is and what it reads."""

    card: Path
    """Its model card (safetensors + JSON)."""
    layer: int
    """The layer it reads."""
    name: str
    """Its sweep run's name."""
    trained_on: str
    """``probing`` (the probing set) or ``main`` (the main rollouts' store)."""
    classes: tuple[int, ...]
    """The :class:`~goalprobe.gridworld.core.CellType` values it predicts."""


def headline_probe(layout: RunLayout) -> HeadlineProbe | None:
    """The headline cell probe of the probing set, else of the main store; None when the
    probes stage left neither. The card is looked up in the sweep's own ``models/`` folder by
    name (the table's recorded path may predate a move of the run directory)."""
    name = "cell_" + "_".join(HEADLINE_PROBE)
    candidates = (
        ("probing", layout.probing_probe_sweep(name), layout.probing_probes / "models"),
        ("main", layout.probe_sweep(name), layout.probe_models),
    )
    for trained_on, table, models in candidates:
        if not table.is_file():
            continue
        run = headline_run(json.loads(table.read_text()))
        if run is None or not run.get("model_path"):
            continue
        card = models / Path(run["model_path"]).name
        if card.is_file():
            classes = tuple(int(c) for c in load_probe(card).classes_)
            return HeadlineProbe(card, int(run["layer"]), str(run["name"]), trained_on, classes)
    return None


def decode_prompt_states(
    context: StageContext,
    agent: AgentConfig,
    activations: ActivationsConfig,
    prompts: PromptStatesConfig,
    grids: list[Grid],
    probe: HeadlineProbe,
    states: dict[str, list[State]],
    states_path: Path,
    store_path: Path,
) -> dict[tuple[str, State], np.ndarray]:
    """Write ``states`` (per grid id, the states to decode) of ``grids`` as prompt-only states
    (``prompts``: reasoning effort and templates), extract their pre-reasoning anchors at the
    probe's layer and decode them.

    Returns:
        ``{(grid_id, state): (S, S, len(CellType)) probabilities}`` (classes the probe lacks
        get 0).
    """
    loaded = context.agent(agent).loaded()
    tokenizer = loaded.tokenizer
    states_path.unlink(missing_ok=True)
    write_prompt_states(
        grids,
        lambda messages, effort: encode_prompt(tokenizer, messages, effort),
        prompts,
        states_path,
        backend_description=context.agent(agent).config.identity(),
        states=states,
    )
    model = load_probe(probe.card)
    extract_into(
        context,
        agent,
        dataclasses.replace(activations, layers=(probe.layer,)),
        states_path,
        store_path,
        stages=(HEADLINE_STAGE,),
    )
    with ActivationStore(store_path) as store:
        rows = store.select(HEADLINE_STAGE)
        labels = store.labels(["grid_id", "episode"], rows)
        acts = store.read(HEADLINE_STAGE, probe.layer, rows)
    probs = full_class_probs(model.predict_proba(acts), [int(c) for c in model.classes_])
    return {
        (str(g), states[str(g)][int(e)]): p
        for g, e, p in zip(labels["grid_id"], labels["episode"], probs, strict=True)
    }
