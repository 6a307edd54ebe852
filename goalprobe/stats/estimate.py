"""The two records every room passes around: an :class:`Estimate` and a :class:`Verdict`.

Both are frozen dataclasses whose :meth:`~Estimate.to_dict` writes the result files' JSON keys
(``value``, ``ci_low``, ``ci_high``, ``n``, ``n_grids``, ``interval_method``, ...) and whose
:meth:`~Estimate.from_dict` reads them back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_KEYS = {
    "value": "value",
    "low": "ci_low",
    "high": "ci_high",
    "n": "n",
    "clusters": "n_grids",
    "baseline": "baseline",
    "method": "interval_method",
}
"""Attribute -> JSON key, in the order the files write them (:attr:`Estimate.extra` goes
before ``interval_method``)."""


def finite_or_none(x: Any) -> float | None:
    """``x`` as a float, None where it is None or not finite (a file holds no NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def json_ready(value: Any) -> Any:
    """``value`` for ``json.dumps(allow_nan=False)``: keys as strings, tuples and numpy arrays
    as lists, numpy scalars as Python ones, non-finite floats as None (a file holds no NaN)."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return json_ready(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True)
class Estimate:
    """A number with its interval and where it comes from.

    Attributes:
        value: the point estimate (None: undefined, e.g. no trials).
        low: the interval's lower bound (None: no interval, e.g. fewer than two grids).
        high: the interval's upper bound.
        n: the trials, rows or pairs behind it (None: not recorded).
        clusters: the independent units resampled (grids; None: not recorded).
        method: how the interval was made (``interval_method`` in the files; None: the grid
            bootstrap's percentile interval, the default everywhere).
        baseline: what it was compared with (a number, or a baseline's name).
        extra: any further keys the file records beside it (``n_eff``, ``design_effect``,
            ``above_baseline``, ...), written and read back as they are.
    """

    value: float | None
    low: float | None = None
    high: float | None = None
    n: int | None = None
    clusters: int | None = None
    method: str | None = None
    baseline: float | str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Estimate:
        """Read ``{value, ci_low, ci_high, ...}`` (any key may be absent; None: undefined)."""
        data = data or {}
        known = {attr: data.get(key) for attr, key in _KEYS.items()}
        extra = {k: v for k, v in data.items() if k not in _KEYS.values()}
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object the result files hold: ``value``, ``ci_low`` and ``ci_high``
        always, the other keys where they are set, then :attr:`extra` as it is."""
        out: dict[str, Any] = {}
        for attr, key in _KEYS.items():
            v = getattr(self, attr)
            if attr == "method":
                out.update(self.extra)
            if v is not None or attr in ("value", "low", "high"):
                out[key] = v
        return out

    @property
    def width(self) -> float | None:
        """``high - low`` (None without an interval)."""
        low, high = self.bounds()
        return None if math.isnan(low) or math.isnan(high) else high - low

    def bounds(self) -> tuple[float, float]:
        """``(low, high)`` as floats, NaN where there is no interval (for arrays and tables)."""
        low, high = finite_or_none(self.low), finite_or_none(self.high)
        return (math.nan if low is None else low, math.nan if high is None else high)

    def above(self, point: float) -> bool | None:
        """Whether the interval lies above ``point`` (None without an interval)."""
        return None if finite_or_none(self.low) is None else bool(self.low > point)  # type: ignore[operator]

    def below(self, point: float) -> bool | None:
        """Whether the interval lies below ``point`` (None without an interval)."""
        return None if finite_or_none(self.high) is None else bool(self.high < point)  # type: ignore[operator]


VERDICT_ANSWERS = ("yes", "no", "undecided", "unstable", "n/a")
"""What a verdict can say: ``undecided`` where the interval reaches both sides of the
question's threshold (with the effect its n could detect), ``unstable`` where training seeds
disagree by more than their intervals, ``n/a`` where the agent cannot be asked (it cannot read
the prompt)."""


@dataclass(frozen=True)
class Verdict:
    """The answer to one tested question.

    Attributes:
        answer: one of :data:`VERDICT_ANSWERS`.
        question: the question in words ("above random walk").
        detectable: the smallest effect its n could detect (a "no" or "undecided" states it).
        reason: why ``unstable`` or ``n/a``.
    """

    answer: str
    question: str = ""
    detectable: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.answer not in VERDICT_ANSWERS:
            raise ValueError(f"a verdict says one of {VERDICT_ANSWERS}, got {self.answer!r}")

    @classmethod
    def from_flag(cls, flag: bool | None, question: str = "", **kwargs: Any) -> Verdict:
        """``yes`` / ``no`` from a flag, ``undecided`` where it is None (no interval)."""
        answer = "undecided" if flag is None else ("yes" if flag else "no")
        return cls(answer, question, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """``{verdict, question, detectable, reason}`` (unset ones left out; ``verdict`` is the
        key the result files use for the answer)."""
        out: dict[str, Any] = {"verdict": self.answer}
        for key in ("question", "detectable", "reason"):
            v = getattr(self, key)
            if v not in (None, ""):
                out[key] = v
        return out
