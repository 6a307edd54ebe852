"""Plan attribution's gradient runs (:func:`~goalprobe.activations.plan.backward_bytes`, one
sequence at a time), refusing before any model loads MXFP4 weights (forward-only kernels) and a
longest sequence whose backward peak is over the extraction planner's budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from goalprobe.activations.plan import GB, ModelShape, activation_bytes, backward_bytes


@dataclass(frozen=True)
class AttributionPlan:
    """Memory of attribution's gradient runs on one device: the bf16 weights, the backward and
    forward-only peaks of the longest sequence, the budget left to activations, and whether the
    plan ``fits`` (else the ``reason``)."""

    longest: int
    sequences: int
    weights_gb: float
    backward_gb: float
    forward_gb: float
    budget_gb: float
    fits: bool
    reason: str
    attention: str = "eager"

    @property
    def peak_gb(self) -> float:
        """Weights plus the backward peak."""
        return self.weights_gb + self.backward_gb

    def to_dict(self) -> dict:
        """JSON-ready, with the peak."""
        return {**asdict(self), "peak_gb": self.peak_gb}


def plan_attribution(
    lengths: Sequence[int],
    shape: ModelShape,
    *,
    memory_bytes: float,
    mxfp4: bool = False,
    dtype_bytes: int = 2,
    fraction: float = 0.85,
    reserve_bytes: float = 1.5 * GB,
    attention: str = "eager",
) -> AttributionPlan:
    """The memory of gradient runs over sequences of ``lengths`` on a device of ``memory_bytes``
    (``mxfp4``: the weights would load as MXFP4, which refuses)."""
    longest = max(lengths, default=1)
    weights = shape.weight_bytes(mxfp4=False, dtype_bytes=dtype_bytes)
    budget = fraction * memory_bytes - weights - reserve_bytes
    backward = backward_bytes(shape, longest, dtype_bytes, attention)
    forward = activation_bytes(shape, 1, longest, dtype_bytes, attention)
    reasons = []
    if mxfp4:
        reasons.append(
            "the weights would load as MXFP4, whose kernels are forward-only (no backward "
            "pass): attribution needs bf16 weights (load with Mxfp4Config(dequantize=True) / "
            f"--dequantize), {weights / GB:.1f} GB"
        )
    if backward > budget:
        message = (
            f"the backward pass of the longest sequence ({longest:,} tokens) needs "
            f"{backward / GB:.1f} GB of activations with {attention} attention, and "
            f"{max(budget, 0.0) / GB:.1f} GB are left on the device after the bf16 weights "
            f"({weights / GB:.1f} GB) and the reserve"
        )
        if attention == "eager":
            flex = backward_bytes(shape, longest, dtype_bytes, "flex_attention")
            message += f"; flex attention would need {flex / GB:.1f} GB (CUDA only)"
        reasons.append(message)
    return AttributionPlan(
        longest=longest,
        sequences=len(lengths),
        weights_gb=weights / GB,
        backward_gb=backward / GB,
        forward_gb=forward / GB,
        budget_gb=budget / GB,
        fits=not reasons,
        reason="; ".join(reasons),
        attention=attention,
    )
