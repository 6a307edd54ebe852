"""The false_belief stage's outputs as the viewer shows them (``RUN/false_belief/``): its
episodes with their per-step decoded maps (:func:`read_false_belief_episodes`, read whole: the
set is small) and the run overview's start-state cards (:func:`false_belief_start_maps`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from goalprobe.gridworld.core import Grid
from goalprobe.gridworld.io import read_grid_set
from goalprobe.probes.decoded_maps import read_step_maps
from goalprobe.viewer.run_files import RunFiles, read_episodes
from goalprobe.viewer.sources import full_class_probs


def episode_key(grid_id: str, episode: int) -> str:
    """The allow-list key of an episode."""
    return f"{grid_id}:{int(episode)}"


def episode_label(summary, what: str = "") -> str:
    """Short human label of an episode: grid, episode, ``what`` (if any), outcome and length."""
    outcome = "success" if summary.success else "failure"
    middle = f" · {what}" if what else ""
    return f"{summary.grid_id} · ep {summary.episode}{middle} · {outcome} · {summary.length} steps"


@dataclass(frozen=True, eq=False)
class FalseBeliefEpisodes:
    """The false_belief stage's grids and episodes (by episode key, in file order: the
    allow-list), and by ``(grid_id, episode, step)`` each step's ``(S, S, len(CellType))``
    decoded map and position read-outs (empty without them; ``maps_why`` says why), with what
    decoded them (``maps_label``)."""

    grids: dict[str, Grid]
    episodes: dict[str, Any]
    maps: dict[tuple[str, int, int], np.ndarray]
    maps_why: str | None
    maps_label: str
    readouts: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict
    )

    def label(self, key: str) -> str:
        """Short human label: grid, episode, kind and role, outcome and length."""
        from goalprobe.gridworld.false_belief import pair_facts

        episode = self.episodes[key]
        s = episode.summary
        facts = pair_facts(self.grids[s.grid_id]) or {}
        what = f"{facts.get('kind', '?').replace('_', ' ')} {facts.get('role', '?')}"
        return episode_label(s, what.replace("false_belief", "false belief"))


def read_false_belief_episodes(files: RunFiles) -> FalseBeliefEpisodes | None:
    """The stage's episodes and maps (None when it has not run; raises as
    :func:`goalprobe.viewer.run_files.read_episodes`)."""
    layout = files.layout
    maps_path = files.resolve(files.relative(layout.false_belief_decoded))
    read = read_episodes(
        files, layout.false_belief_grids, layout.false_belief_trajectories, "false-belief"
    )
    if read is None:
        return None
    grids, episodes = read
    maps: dict[tuple[str, int, int], np.ndarray] = {}
    readouts: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = {}
    why, label = None, ""
    if maps_path.is_file():
        try:
            step_maps = read_step_maps(maps_path)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"false-belief decoded maps unreadable: {err}") from err
        probs = full_class_probs(step_maps.probs, step_maps.classes.tolist())
        maps = {key: probs[i] for key, i in step_maps.index().items()}
        if step_maps.agent is not None and step_maps.goal is not None:
            readouts = {
                key: (
                    np.asarray(step_maps.agent[i], dtype=np.float32),
                    np.asarray(step_maps.goal[i], dtype=np.float32),
                )
                for key, i in step_maps.index().items()
            }
        a = step_maps.attrs
        label = f"{_text(a.get('stage', '?'))} · layer {a.get('layer', '?')}"
    else:
        why = (
            "no decoded maps of the false-belief steps: run goalprobe demo with the probes "
            "stage (the headline probe decodes every visited state)"
        )
    return FalseBeliefEpisodes(grids, episodes, maps, why, label, readouts)


def false_belief_start_maps(files: RunFiles, per_kind: int = 1) -> list[dict]:
    """The first ``per_kind`` false-belief grids of each kind at their start state as
    ``[{"grid_id", "kind", "true", "shown", "decoded" (None: no probe reading), "differs",
    "decoded_at"}]`` (maps ``(n, n)`` ``CellType`` arrays; empty when the stage has not run)."""
    from goalprobe.gridworld.false_belief import FALSE_BELIEF, pair_facts
    from goalprobe.gridworld.text import cell_types
    from goalprobe.probes.scoring.false_belief import read_results

    grids_path, results_path = files.layout.false_belief_grids, files.layout.false_belief_results
    if not (grids_path.is_file() and results_path.is_file()):
        return []
    try:
        grids = read_grid_set(grids_path)
        results = read_results(results_path)
    except (OSError, ValueError) as err:
        raise ValueError(f"false-belief outputs unreadable: {err}") from err
    decoding = results.get("decoding") or {}
    maps = decoding.get("maps") or {}
    cells = decoding.get("cells") or []
    out: list[dict] = []
    taken: dict[str, int] = {}
    for grid in grids:
        facts = pair_facts(grid)
        if not facts or facts["role"] != FALSE_BELIEF or taken.get(facts["kind"], 0) >= per_kind:
            continue
        taken[facts["kind"]] = taken.get(facts["kind"], 0) + 1
        decoded = maps.get(grid.grid_id)
        out.append(
            {
                "grid_id": grid.grid_id,
                "kind": facts["kind"],
                "true": cell_types(grid),
                "shown": cell_types(grid.prompt_grid),
                "decoded": None if decoded is None else np.asarray(decoded, dtype=np.int64),
                "differs": [tuple(c) for c in facts["differs"]],
                "decoded_at": [c for c in cells if c["grid_id"] == grid.grid_id],
            }
        )
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
