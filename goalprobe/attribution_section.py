"""The ``attribution`` stage's config section (issue 41): the library's
:class:`~goalprobe.probes.attribution.AttributionConfig` and what the demo draws for it. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from goalprobe.probes.attribution import AttributionConfig


@dataclass(frozen=True)
class AttributionSection:
    """Attribution patching on the patching stage's pairs (``RUN/attribution/``)."""

    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    """What to attribute: the metrics (the answered action's logit difference, the coordinates'
    log-probability), the positions (the prompt's) and AtP*'s GradDrop."""
    kinds: tuple[str, ...] = ("disjoint",)
    """Which of the patching stage's pair kinds to attribute (``disjoint``, ``control``)."""
    max_pairs: int = 10
    """Most pairs, the first of the patching stage's kept pairs of :attr:`kinds` in its order
    (``RUN/patching/patch_pairs.jsonl``)."""
    check_pairs: int = 1
    """Pairs (the first attributed) whose attribution is checked against the real patch of
    every affected block x prompt position (:mod:`goalprobe.probes.attribution_check`); 0: none."""
    top_k: int = 5
    """The ``k`` of the check's top-k hit rate."""
    backend: str = "hooks"
    """Capture backend of the gradient runs (``hooks``: GradDrop; ``nnsight``: plain AtP)."""

    def __post_init__(self) -> None:
        if self.max_pairs < 1 or self.check_pairs < 0 or self.top_k < 1:
            raise ValueError("max_pairs and top_k must be >= 1, check_pairs >= 0")
        if not self.kinds or any(k not in ("disjoint", "control") for k in self.kinds):
            raise ValueError(f"kinds must be a subset of ('disjoint', 'control'), got {self.kinds}")
        if self.backend not in ("hooks", "nnsight"):
            raise ValueError(f"backend must be hooks or nnsight, got {self.backend!r}")
        if self.attribution.grad_drop and self.backend != "hooks":
            raise ValueError("GradDrop runs on the hooks backend")
