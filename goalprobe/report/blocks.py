"""What a report section is made of (a list of :data:`Block`, which the templates draw; nothing
here writes HTML except plotly's own figure ``<div>``), and how numbers are written."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from markupsafe import Markup


def num(value: Any, digits: int = 3) -> str:
    """A number as text: ints with thousands separators, floats with ``digits`` decimals."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


def pct(value: Any) -> str:
    """A rate as a percentage with one decimal (``"45.2%"``; '–' when undefined)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{100 * value:.1f}%"


def stat_text(stat: Mapping | None, *, percent: bool = True, digits: int = 3) -> str:
    """``"45.2% [40.1%, 50.3%]"`` of a ``{value, ci_low, ci_high}`` dict ('–' when absent; an
    interval of equal ends is said in words, not printed as ``[x, x]``)."""
    if not stat or stat.get("value") is None:
        return "–"
    fmt: Callable[[Any], str] = pct if percent else (lambda v: num(v, digits))
    text = fmt(stat["value"])
    if stat.get("ci_low") is not None and stat.get("ci_high") is not None:
        low, high = fmt(stat["ci_low"]), fmt(stat["ci_high"])
        if low == high:
            # a resampling interval of equal ends: every grid gave the same value (a deterministic
            # reference, or no paired difference anywhere); it says nothing about what n excludes
            return f"{text} (equal on every grid: no interval)"
        text += f" [{low}, {high}]"
    return text


@dataclass(frozen=True)
class Table:
    """A table: column headings, rows of cells (shown as text) and a caption."""

    header: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    caption: str = ""
    kind: ClassVar[str] = "table"


def table(header: Iterable[str], rows: Iterable[Iterable[Any]], caption: str = "") -> Table:
    """A :class:`Table` of any iterables."""
    return Table(tuple(header), tuple(tuple(r) for r in rows), caption)


def records_table(records: Sequence[Mapping[str, Any]], caption: str = "") -> Table:
    """A :class:`Table` of rows given as ``{heading: cell}`` mappings, headed by the first row's
    keys (no rows: no headings either)."""
    return table(records[0] if records else (), (r.values() for r in records), caption)


@dataclass(frozen=True)
class Figure:
    """A plotly figure's ``<div>`` (drawn by the page's single inlined plotly.js)."""

    html: Markup
    kind: ClassVar[str] = "figure"


@dataclass(frozen=True)
class Box:
    """A notice instead of a section's content: ``failed`` or ``not_run``, and why."""

    status: str
    message: str
    kind: ClassVar[str] = "box"


@dataclass(frozen=True)
class Text:
    """A paragraph of prose: how to read a section's numbers."""

    text: str
    kind: ClassVar[str] = "text"


Block = Table | Figure | Box | Text
"""One part of a section."""


class Figures:
    """Turns plotly figures into :class:`Figure` blocks numbered across the page."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, fig) -> Figure:
        self.count += 1
        return Figure(
            Markup(
                fig.to_html(
                    full_html=False,
                    include_plotlyjs=False,
                    div_id=f"figure-{self.count}",
                    config={"displaylogo": False, "responsive": True},
                )
            )
        )
