"""The one decoder of the application: the headline read-out (:class:`Decoder`: the headline cell
probe for the cells, the probing set's position probes for the agent and the goal, combined by
:func:`goalprobe.probes.decoded_maps.decode_rows`), for the rollouts' steps (the maps ``goalprobe
score`` reads, :func:`write_headline_maps`) and for prompt-only states of grids of their own
(false-belief grids, intention interventions: :func:`decode_prompt_states`).

The cell probe is the headline one fit on the probing set (the run's largest training set),
else on the main store. Pre-reasoning anchors depend on the prompt alone, so states are
extracted as prompt-only states, at the headline stage and layer only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from goalprobe.activations.store import ActivationStore
from goalprobe.agents.agent_config import AgentConfig
from goalprobe.agents.prompt_states import PromptStatesConfig
from goalprobe.config import ActivationsConfig
from goalprobe.gridworld.core import Grid, State
from goalprobe.probes.decoded_maps import (
    AGENT_CENTRED_READOUT,
    CELL_READOUT,
    CONDITIONAL_READOUT,
    POSITION_READOUT,
    DecodedArrays,
    Readout,
    decode_rows,
    write_decoded_maps,
)
from goalprobe.probes.serialization import load_probe, read_probe_card
from goalprobe.run_layout import RunLayout
from goalprobe.stages import HEADLINE_PROBE, HEADLINE_STAGE, headline_run
from goalprobe.stages.activations import extract_into, write_agent_states
from goalprobe.stages.context import StageContext


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
    probes stage left neither. The card is looked up by name in the sweep's own ``models/``
    (the run directory may have moved)."""
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


@dataclass(frozen=True)
class Decoder:
    """The headline read-out, loaded: the cell probe and (when the probes stage fit them) the
    agent and goal position probes of the probing set, at the headline stage and layer."""

    probe: HeadlineProbe
    """Where the cell probe is and what it reads."""
    cell: object
    """The fitted cell probe."""
    agent: object | None
    """The agent position probe (None: the cell probe's ``P(AGENT)``)."""
    goal: object | None
    """The goal position probe (None: the cell probe's ``P(GOAL)``)."""
    readout: Readout
    """The card paths, relative to the run directory."""
    walls: dict = field(default_factory=dict)
    """The conditional wall probes by frame (``absolute``, ``agent``) at the cell probe's layer
    (empty: the cell probe's walls)."""

    def decode(
        self, acts: np.ndarray, sizes: np.ndarray, densities: np.ndarray | None = None
    ) -> DecodedArrays:
        """Maps of activations ``acts`` of grids of side ``sizes`` and obstacle ``densities``
        (the wall probes' prior; without them the cell probe gives the walls)."""
        use_walls = bool(self.walls) and densities is not None
        return decode_rows(
            self.cell,
            acts,
            sizes,
            agent_probe=self.agent,
            goal_probe=self.goal,
            readout=self.readout,
            wall_probe=self.walls.get("absolute") if use_walls else None,
            agent_wall_probe=self.walls.get("agent") if use_walls else None,
            densities=densities,
        )


def load_decoder(layout: RunLayout) -> Decoder | None:
    """The headline read-out of the run (None without a headline cell probe). The position
    probes join when both cards exist and read the cell probe's layer; so does each frame's
    conditional wall probe of the probing set (``absolute``, ``agent``)."""
    probe = headline_probe(layout)
    if probe is None:
        return None
    cards = {t: layout.position_probe(t).with_suffix(".json") for t in ("agent", "goal")}
    positions = all(_reads_layer(c, probe.layer) for c in cards.values())
    models = {t: load_probe(c) for t, c in cards.items()} if positions else {}
    wall_cards = {f: layout.wall_probe(f).with_suffix(".json") for f in ("absolute", "agent")}
    walls = {f: load_probe(c) for f, c in wall_cards.items() if _reads_layer(c, probe.layer)}
    readout = Readout(
        agent=POSITION_READOUT if positions else CELL_READOUT,
        goal=POSITION_READOUT if positions else CELL_READOUT,
        cell_probe=layout.relative(probe.card),
        agent_probe=layout.relative(cards["agent"]) if positions else None,
        goal_probe=layout.relative(cards["goal"]) if positions else None,
        walls=CONDITIONAL_READOUT
        if "absolute" in walls
        else AGENT_CENTRED_READOUT
        if "agent" in walls
        else CELL_READOUT,
        wall_probe=layout.relative(wall_cards["absolute"]) if "absolute" in walls else None,
        agent_wall_probe=layout.relative(wall_cards["agent"]) if "agent" in walls else None,
    )
    cell = load_probe(probe.card)
    return Decoder(probe, cell, models.get("agent"), models.get("goal"), readout, walls)


def _reads_layer(card: Path, layer: int) -> bool:
    """Whether the probe card ``card`` exists and reads ``layer``."""
    return card.is_file() and (read_probe_card(card).get("activations") or {}).get("layer") == layer


def write_headline_maps(layout: RunLayout, batch: int = 512) -> Path | None:
    """Decode every row of the main store at the headline stage and layer with the probing
    set's read-out (every rollout grid held out) into ``layout.headline_maps(layer)``; None
    when the probing set's probe is missing."""
    decoder = load_decoder(layout)
    if decoder is None or decoder.probe.trained_on != "probing":
        return None
    with ActivationStore(layout.store) as store:
        rows = store.select(HEADLINE_STAGE)
        if decoder.probe.layer not in {int(x) for x in store.layers} or not len(rows):
            return None
        labels = store.labels(["grid_size", "density"], rows)
        sizes, densities = labels["grid_size"], labels["density"]
        parts = [
            decoder.decode(
                store.read(HEADLINE_STAGE, decoder.probe.layer, rows[a : a + batch]),
                sizes[a : a + batch],
                densities[a : a + batch],
            )
            for a in range(0, len(rows), batch)
        ]
    probs = np.concatenate([p.probs for p in parts])
    joined = {
        name: None
        if getattr(parts[0], name) is None
        else np.concatenate([getattr(p, name) for p in parts])
        for name in ("agent", "goal", "wall_source")
    }
    card = read_probe_card(decoder.probe.card)
    keep = np.asarray(card["fitted"]["classes_"], dtype=np.int64)
    out = layout.headline_maps(decoder.probe.layer)
    tmp = out.with_name(f".{out.name}.tmp")
    write_decoded_maps(
        tmp,
        probs[..., keep],
        np.asarray(rows, dtype=np.int64),
        card,
        readout=parts[0].readout,
        role="headline",
        trained_on="probing",
        **joined,
    )
    tmp.replace(out)
    return out


def decode_prompt_states(
    context: StageContext,
    agent: AgentConfig,
    activations: ActivationsConfig,
    prompts: PromptStatesConfig,
    grids: list[Grid],
    decoder: Decoder,
    states: dict[str, list[State]],
    states_path: Path,
    store_path: Path,
) -> dict[tuple[str, State], tuple]:
    """Write ``states`` (per grid id) of ``grids`` as prompt-only states, extract their
    pre-reasoning anchors at the probe's layer and decode them: ``{(grid_id, state): (probs
    (S, S, len(CellType)), agent (S, S) or None, goal)}`` (classes the probe lacks get 0)."""
    write_agent_states(context, agent, grids, prompts, states_path, states=states)
    fields = ["grid_id", "episode", "grid_size", "density"]
    acts, labels = extract_headline(
        context, agent, activations, states_path, store_path, decoder.probe.layer, fields
    )
    decoded = decoder.decode(acts, labels["grid_size"], labels["density"])
    return {
        (str(g), states[str(g)][int(e)]): decoded.row(i)
        for i, (g, e) in enumerate(zip(labels["grid_id"], labels["episode"], strict=True))
    }


def extract_headline(
    context: StageContext,
    agent: AgentConfig,
    activations: ActivationsConfig,
    source: Path,
    store_path: Path,
    layer: int,
    fields: list[str],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Extract the pre-reasoning anchors of ``source`` (trajectories or prompt-only states) at
    ``layer`` into ``store_path``: ``(activations, labels)`` of every row, the labels ``fields``."""
    stages = (HEADLINE_STAGE,)
    extract_into(context, agent, activations, source, store_path, stages=stages, layers=(layer,))
    with ActivationStore(store_path) as store:
        rows = store.select(HEADLINE_STAGE)
        return store.read(HEADLINE_STAGE, layer, rows), store.labels(fields, rows)
