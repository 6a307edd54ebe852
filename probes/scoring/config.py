"""What ``goalprobe score`` computes (:class:`ScoreConfig`) and the error its inputs raise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from goalprobe.probes.scoring.belief import TOP_K_DEFAULT

GridUtility = Literal["goal", "goal_with_key", "key", "goal_minus_harm"]
"""Which state utility grid MEG is measured against (:mod:`goalprobe.probes.scoring.meg_table`)."""

NULLS: tuple[str, ...] = ("other_grid", "prior")
"""The null decoded maps, in report order (:mod:`goalprobe.probes.scoring.nulls`)."""


class ScoringError(ValueError):
    """Scoring inputs that do not join up or cannot be read; the message names the file."""


@dataclass(frozen=True)
class ScoreConfig:
    """What ``goalprobe score`` computes (no I/O here)."""

    decoded_maps: tuple[str, ...] = ()
    """Decoded-map files (names or stems in ``RUN/probes/decoded``) to score; empty: all."""

    top_k: tuple[int, ...] = TOP_K_DEFAULT
    """Numbers of candidate agent and goal cells of the top-k analysis (Figure 9)."""

    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every confidence interval."""

    confidence_level: float = 0.95
    """Confidence level of the intervals."""

    random_state: int = 0
    """Seed of the bootstrap draws."""

    meg_probe: str | None = None
    """Decoded-map file whose maps give the subjective MEG grids; None: the best card accuracy."""

    utility: GridUtility = "goal"
    """MEG utility of grids without a key."""

    key_utility: GridUtility = "goal_with_key"
    """MEG utility of grids with a key."""

    horizon: Literal["episodes", "grid"] = "episodes"
    """MEG decisions ``H``: the episodes' step budget (one per grid) or ``ceil(1.5 L)``."""

    subjective_map: Literal["mean", "first"] = "mean"
    """A grid's believed map: the mean over its decoded steps, or its earliest step's."""

    unknown_utility: bool = False
    """Also compute unknown-utility MEG (over all utility functions of the state; slow)."""

    meg_null_replicates: int = 4
    """Random-walk MEG estimates per grid averaged into MEG's null
    (:mod:`goalprobe.probes.scoring.meg_table`); 0: none."""

    meg_batch_size: int = 256
    """Grids per batched known-utility MEG solve (bounds memory)."""

    n_jobs: int = 1
    """Worker processes scoring decoded-map steps (each step runs a few dozen BFS)."""

    nulls: tuple[str, ...] = NULLS
    """Null decoded maps every source is also scored under
    (:mod:`goalprobe.probes.scoring.nulls`); empty: none."""

    weighting: Literal["grid", "step"] = "grid"
    """Step pooling: ``"grid"`` as the study's Figure 4 (trajectory rates averaged per grid, then
    over grids) or ``"step"`` (a ratio of sums)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoded_maps", tuple(str(x) for x in self.decoded_maps))
        top_k = tuple(sorted({int(k) for k in self.top_k}))
        if not top_k or top_k[0] < 1:
            raise ValueError(f"top_k must list positive integers, got {self.top_k!r}")
        object.__setattr__(self, "top_k", top_k)
        if self.meg_null_replicates < 0:
            raise ValueError(f"meg_null_replicates must be >= 0, got {self.meg_null_replicates}")
        if self.n_bootstrap < 1:
            raise ValueError(f"n_bootstrap must be >= 1, got {self.n_bootstrap}")
        if not 0.0 < self.confidence_level < 1.0:
            raise ValueError(f"confidence_level must lie in (0, 1), got {self.confidence_level}")
        for name, allowed in (
            ("utility", ("goal", "goal_with_key", "key")),
            ("key_utility", ("goal", "goal_with_key", "key")),
            ("horizon", ("episodes", "grid")),
            ("subjective_map", ("mean", "first")),
            ("weighting", ("grid", "step")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        nulls = tuple(str(x) for x in self.nulls)
        unknown = sorted(set(nulls) - set(NULLS))
        if unknown or len(set(nulls)) != len(nulls):
            raise ValueError(f"nulls must be distinct names among {NULLS}, got {self.nulls!r}")
        object.__setattr__(self, "nulls", nulls)
        if self.meg_batch_size < 1 or self.n_jobs < 1:
            raise ValueError("meg_batch_size and n_jobs must be >= 1")
