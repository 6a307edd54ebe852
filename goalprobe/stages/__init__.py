"""The stages of ``goalprobe demo``: their names, run order and inputs.

One module per stage (``goalprobe/stages/<stage>.py``) holds the function that runs it; this
package's ``__init__`` holds only the constants every other module may import without pulling
in a stage's dependencies (the report, the CLI).
"""

from __future__ import annotations

STAGES: tuple[str, ...] = (
    "grids",
    "rollouts",
    "behaviour",
    "iso",
    "keys",
    "harm",
    "intention",
    "probing",
    "activations",
    "probes",
    "intention_map",
    "distance",
    "plans",
    "patching",
    "scoring",
    "false_belief",
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
    "intention": (),
    "intention_map": ("intention", "probes"),
    "probing": (),
    "activations": ("rollouts",),
    "probes": ("activations", "probing"),
    "distance": ("activations", "probing"),
    "plans": ("activations",),
    "patching": ("rollouts",),
    "scoring": ("grids", "rollouts", "activations", "probes"),
    "false_belief": ("probes",),
    "report": STAGES[:-1],
}
"""The stages whose outputs each stage reads (its cache key includes their fingerprints)."""

CONTROL_STAGES: tuple[str, ...] = (
    "grids",
    "rollouts",
    "behaviour",
    "probing",
    "activations",
    "probes",
    "distance",
    "plans",
    "patching",
    "scoring",
    "false_belief",
    "report",
)
"""The stages the positive-control agent runs beside the default agent (``goalprobe demo``
without ``--model``): its behaviour and every representational finding (probes, localisation,
distance, plans, patching, belief scoring and MEG), on the same grids and probing set, and the
false-belief grids (the loop closed: its anchors carry the drawn goal, so its decoded goal
should follow the drawn grid); the behavioural studies that say nothing about where a map is
(iso, keys, harm, intention) run for the default agent only."""


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


def headline_run(result: dict) -> dict | None:
    """The sweep run of the headline stage and layer (None if the sweep has no such run)."""
    runs = [r for r in result["runs"] if r["stage"] == HEADLINE_STAGE]
    if not runs:
        return None
    layer = headline_layer({r["layer"] for r in runs})
    return next(r for r in runs if r["layer"] == layer)
