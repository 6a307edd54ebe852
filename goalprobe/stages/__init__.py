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
    "activations",
    "probes",
    "distance",
    "plans",
    "patching",
    "scoring",
    "report",
)
"""Every stage of the demo, in run order."""

DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "grids": (),
    "rollouts": ("grids",),
    "behaviour": ("grids", "rollouts"),
    "iso": ("grids", "rollouts"),
    "keys": (),
    "activations": ("rollouts",),
    "probes": ("activations",),
    "distance": ("activations",),
    "plans": ("activations",),
    "patching": ("rollouts",),
    "scoring": ("grids", "rollouts", "activations", "probes"),
    "report": STAGES[:-1],
}
"""The stages whose outputs each stage reads (its cache key includes their fingerprints)."""
