"""The headline table: one line per row spec (:data:`~goalprobe.report.row_specs.SPECS`), with
its baseline, its verdict (a one-sided p by the most exact route its file allows,
:data:`P_METHODS`) and Holm's correction over the agent's family declared before the run (a
missing row or p counting as p = 1). The report shows it first and ``goalprobe demo`` ends with
its verdicts."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from goalprobe.report.blocks import num, pct
from goalprobe.report.row_specs import DESCRIPTIVE, SPECS, TEST, Reading, RowSpec, family
from goalprobe.report.run import MissingInput, RunReader
from goalprobe.stats import (
    RATE_INTERVAL_METHOD,
    Estimate,
    Verdict,
    detectable_effect,
    holm,
    p_exact_rate,
    p_from_interval,
)

P_METHODS = {
    "exact": "exact binomial test of a rate on its effective trials",
    "sign-flip": "exact sign-flip test where every grid agrees (2^-G)",
    "draws": "share of the grid-bootstrap draws at or below the baseline",
    "interval": "normal approximation to the interval's side facing the baseline",
    "bound": "the interval's level (the interval excludes the baseline on a side of no width)",
}
"""How a row's p-value was made (the report names them beside the family)."""


@dataclass(frozen=True)
class HeadlineRow:
    """One line of the headline table.

    Attributes:
        id: the row spec's id (both agents' rows pair up by it).
        label: the spec's short human label.
        kind: ``test``, ``descriptive`` or ``pipeline check``.
        finding: what is measured, with the study's figure or table.
        value: the measured value (with its 95% CI where there is one).
        baseline: what it is compared with.
        verdict: the question and its answer ("above random walk: yes"), the effect a "no"
            could detect, and the Holm-adjusted p across the agent's family; "" for a
            descriptive row.
        answer: ``yes``, ``no``, ``undecided``, ``unstable`` or ``n/a`` ("" without a
            verdict).
        p_value: one-sided p of the verdict's test (None: untested).
        p_method: how it was made (a key of :data:`P_METHODS`).
        detectable: the effect its n could detect, formatted ("" where not stated).
        holm_p: the Holm-adjusted p across the family.
        check: a pipeline check's recorded outcome (``passed`` / ``flagged``; "" where none).
    """

    id: str
    label: str
    kind: str
    finding: str
    value: str
    baseline: str = ""
    verdict: str = ""
    answer: str = ""
    p_value: float | None = None
    p_method: str = ""
    detectable: str = ""
    holm_p: float | None = None
    check: str = ""


class RoleMismatch(RuntimeError):
    """A result file says a row is something its spec does not (a verdict where the spec
    declares a descriptive row, or the reverse): the Holm family is fixed by the specs, so the
    row is never re-labelled from the data; the spec or the writer is wrong."""


def role_of(run: RunReader) -> str:
    """``control`` for the positive control's run (``RUN/control/`` beside a run), else
    ``default``."""
    root = run.root.resolve()
    return "control" if root.name == "control" and (root.parent / "stages").is_dir() else "default"


def one_sided_p(t: Estimate | None, point: float, side: str) -> tuple[float | None, str]:
    """``(p, method)`` of "``t`` lies above ``point``" (``side="less"``: below), by the most
    exact route ``t`` allows (see the module docstring)."""
    if t is None or t.value is None:
        return None, ""
    if t.method == RATE_INTERVAL_METHOD and 0 < point < 1:
        trials = t.extra.get("n_eff") or t.n
        if trials:
            return p_exact_rate(t.value * trials, trials, point, side=side), "exact"
    if t.width is None:
        return None, ""
    if t.width == 0 and t.clusters:  # every grid agrees: the exact sign-flip test
        beyond = t.value > point if side == "greater" else t.value < point
        return (2.0 ** -int(t.clusters) if beyond else 1.0), "sign-flip"
    draws = t.extra.get("p_draws")
    if draws is not None and side == "greater" and point == 0.0:
        return float(draws), "draws"
    p = p_from_interval(t.value, t.low, t.high, point, side=side)
    if p is not None:
        return p, "interval"
    excluded = t.above(point) if side == "greater" else t.below(point)
    return (0.025 if excluded else 1.0), "bound"


def _detectable(r: Reading) -> str:
    """The effect the row's n could detect: the result file's, else from its interval."""
    mde, t = r.detectable, r.tested
    if mde is None and t is not None:
        mde = detectable_effect(t.low, t.high, n=t.clusters or t.n)
    return "" if mde is None else (pct(mde) if r.percent else num(mde))


def evaluate(spec: RowSpec, r: Reading) -> HeadlineRow:
    """The headline row of ``spec`` from what its reader found (before Holm). A reading whose
    file role disagrees with the spec's kind raises :class:`RoleMismatch`; an ``n/a`` answer is
    untested (no p: it keeps its family seat at p = 1)."""
    if r.role and r.role != spec.kind:
        raise RoleMismatch(
            f"{spec.id}: the result file says {r.role!r}, the spec declares {spec.kind!r}"
        )
    row = HeadlineRow(spec.id, spec.label, spec.kind, r.finding, r.value, r.baseline)
    if spec.kind == DESCRIPTIVE:
        return row
    if spec.kind != TEST:
        if not r.check:
            return replace(row, verdict="pipeline check (no verdict)")
        text = f"pipeline check {r.check}" + (f" ({r.reason})" if r.reason else "")
        return replace(row, verdict=text, check=r.check)
    t = r.tested
    if r.answer is not None:
        verdict = Verdict(r.answer, r.question, reason=r.reason)
    elif t is None:
        verdict = Verdict("undecided", r.question)
    else:
        verdict = Verdict.from_flag(t.above(r.point) if r.side == "greater" else t.below(r.point))
    p, method = (None, "") if verdict.answer == "n/a" else one_sided_p(t, r.point, r.side)
    mde = _detectable(r) if verdict.answer in ("no", "undecided") else ""
    text = f"{r.question}: {verdict.answer}"
    text += f" ({r.reason})" if r.reason else ""
    text += f"; detectable effect {mde}" if mde else ""
    return replace(
        row, verdict=text, answer=verdict.answer, p_value=p, p_method=method, detectable=mde
    )


def with_holm(
    rows: list[HeadlineRow], members: tuple[str, ...], alpha: float = 0.05
) -> list[HeadlineRow]:
    """``rows`` with the Holm-adjusted p appended to every member of the family ``members``
    (row ids, fixed in advance): a member the run lacks, or one without a p, counts as p = 1,
    so the family's size never depends on the data."""
    by_id = {r.id: r for r in rows}
    ps = [
        1.0 if by_id.get(i) is None or by_id[i].p_value is None else by_id[i].p_value
        for i in members
    ]
    adjusted = dict(zip(members, holm(ps), strict=True))
    m = len(members)
    out = []
    for r in rows:
        a = adjusted.get(r.id)
        if a is None or r.kind != TEST:
            out.append(r)
            continue
        held = "holds" if a < alpha else "not significant"
        out.append(
            replace(
                r, holm_p=a, verdict=f"{r.verdict}; Holm p {a:.2g} of {m} ({held} after correction)"
            )
        )
    return out


def headline_rows(run_dir: str | Path) -> list[HeadlineRow]:
    """The headline rows of a run, one per spec whose inputs are present (in spec order), with
    Holm's correction over the run's agent's fixed family."""
    run = RunReader(run_dir)
    rows: list[HeadlineRow] = []
    for spec in SPECS:
        try:
            reading = spec.read(run, spec.arg)
        except (MissingInput, KeyError, IndexError, TypeError, ValueError, StopIteration):
            continue  # that stage did not produce the input; the report's section says why
        rows.append(evaluate(spec, reading))
    return with_holm(rows, family(role_of(run)))
