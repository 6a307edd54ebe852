"""The stages of ``goalprobe demo``: their names, run order and inputs.

One module per stage (``goalprobe/stages/<stage>.py``) holds the function that runs it; this
package's ``__init__`` holds only the constants every other module may import without pulling
in a stage's dependencies (the report, the CLI).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STAGES: tuple[str, ...] = (
    "grids",
    "rollouts",
    "behaviour",
    "iso",
    "keys",
    "harm",
    "fog",
    "intention",
    "false_belief_rollouts",
    "probing",
    "activations",
    "probes",
    "intention_map",
    "distance",
    "plans",
    "decision",
    "patching",
    "scoring",
    "false_belief",
    "fog_map",
    "report",
)
"""Every stage of the demo, in run order."""

DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "grids": (),
    "rollouts": ("grids",),
    "behaviour": ("grids", "rollouts"),
    "iso": ("grids", "rollouts"),
    "keys": (),
    "harm": (),
    "fog": (),
    "intention": (),
    "intention_map": ("intention", "probes"),
    "probing": (),
    "activations": ("rollouts",),
    "probes": ("activations", "probing"),
    "distance": ("activations", "probing"),
    "plans": ("activations",),
    "patching": ("rollouts", "decision"),
    "scoring": ("grids", "rollouts", "activations", "probes"),
    "false_belief_rollouts": (),
    "false_belief": ("probes", "false_belief_rollouts"),
    "fog_map": ("fog", "probes"),
    "decision": ("rollouts", "activations"),
    "report": STAGES[:-1],
}
"""The stages whose outputs each stage reads (its cache key includes their fingerprints)."""

SERVER_STAGES: tuple[str, ...] = (
    "rollouts",
    "iso",
    "keys",
    "harm",
    "fog",
    "intention",
    "false_belief_rollouts",
)
"""The stages that generate with the agent's rollout engine (the server, with ``--backend
server``) and need no model weights in the demo's process."""

WEIGHT_STAGES: tuple[str, ...] = (
    "probing",
    "activations",
    "patching",
    "intention_map",
    "false_belief",
    "fog_map",
    "decision",
)
"""The stages that load the model's weights in the demo's process (extraction, patching,
decoding). With ``--backend server`` none of them starts before every stage of
:data:`SERVER_STAGES` has finished, so the server's generation is done before the weights
load (on the server's GPU, stop the server between the two: ``goalprobe demo`` resumes)."""


def server_first(stages: tuple[str, ...]) -> tuple[str, ...]:
    """``stages`` with every stage that needs no weights, neither itself nor through a stage it
    reads, moved before those that do (study order kept within each group; still an order in
    which every stage comes after the ones it reads)."""
    needs: dict[str, bool] = {}
    for name in STAGES:  # STAGES is in dependency order
        needs[name] = name in WEIGHT_STAGES or any(needs[d] for d in DEPENDS_ON[name])
    return tuple(sorted(stages, key=lambda name: needs[name]))


CONTROL_STAGES: tuple[str, ...] = (
    "grids",
    "rollouts",
    "behaviour",
    "fog",
    "false_belief_rollouts",
    "probing",
    "activations",
    "probes",
    "distance",
    "plans",
    "decision",
    "patching",
    "scoring",
    "false_belief",
    "fog_map",
    "report",
)
"""The stages the positive-control agent runs beside the default agent (``goalprobe demo``
without ``--model``): its behaviour and every representational finding (probes, localisation,
distance, plans, patching, belief scoring and MEG), the fogged grids and the false-belief grids
(the loop closed: its anchors carry the drawn goal, so its decoded goal should follow the drawn
grid), on the same grids and probing set; the behavioural studies that say nothing about where
a map is (iso, keys, harm, intention) run for the default agent only."""


SECONDS_HINT: Mapping[str, float] = {
    "grids": 0,
    "rollouts": 110,
    "behaviour": 2,
    "iso": 65,
    "keys": 55,
    "harm": 15,
    "fog": 41,
    "intention": 94,
    "false_belief_rollouts": 14,
    "probing": 33,
    "activations": 40,
    "probes": 220,
    "intention_map": 2,
    "distance": 6,
    "plans": 65,
    "decision": 12,
    "patching": 128,
    "scoring": 40,
    "false_belief": 2,
    "fog_map": 8,
    "report": 1,
}
"""Rough seconds of each stage at the default scale on 2 cores (docs/benchmarks.md). Used only
to order the stages that are ready to start (:func:`work_after`); never part of a key or a
result, so a stale figure costs wall time, not correctness."""


def work_after(stages: tuple[str, ...]) -> dict[str, float]:
    """Each of ``stages``' own :data:`SECONDS_HINT` plus the longest chain of hints of the
    stages among ``stages`` that read it, directly or not (the parallel scheduler starts the
    ready stage with the most work after it first: the critical path)."""
    readers: dict[str, list[str]] = {name: [] for name in stages}
    for name in stages:
        for dependency in DEPENDS_ON[name]:
            if dependency in readers and name != "report":
                readers[dependency].append(name)
    work: dict[str, float] = {}
    for name in reversed([n for n in STAGES if n in readers]):  # readers come later
        work[name] = SECONDS_HINT[name] + max((work[r] for r in readers[name]), default=0.0)
    return work


HEADLINE_STAGE = "pre_reasoning"
"""The anchor stage of the headline representational findings (fixed in advance)."""

HEADLINE_PROBE = ("coordinate", "mlp")
"""The probe kind and family of the headline (the study's MLP probe), fixed in advance."""


def headline_layer(layers) -> int:
    """The layer of the headline findings, fixed in advance rather than picked on test data:
    the middle one of the stored layers (the middle block of three by default)."""
    ordered = sorted(int(x) for x in layers)
    if not ordered:
        raise ValueError("no layers stored")
    return ordered[len(ordered) // 2]


def headline_run(result: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The sweep run of the headline stage and layer (None if the sweep has no such run)."""
    runs = [r for r in result["runs"] if r["stage"] == HEADLINE_STAGE]
    if not runs:
        return None
    layer = headline_layer({r["layer"] for r in runs})
    return next(r for r in runs if r["layer"] == layer)
