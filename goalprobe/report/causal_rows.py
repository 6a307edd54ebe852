"""The headline row type, and the rows of the two causal-and-plan verdicts: the plan decoder
against its strongest baseline at every N, and patching at the anchors against a random other
grid (issue 33). :mod:`goalprobe.report.headline` assembles them with the other rows
(:mod:`goalprobe.report.verdict_rows` holds the rows that read nulls and margins)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from goalprobe.report.blocks import pct, stat_text
from goalprobe.stats import p_from_interval


@dataclass(frozen=True)
class HeadlineRow:
    """One line of the headline table.

    Attributes:
        finding: what is measured, with the study's figure or table.
        value: the measured value (with its 95% CI where there is one).
        baseline: what it is compared with.
        verdict: whether the interval excludes the baseline, in words ("above majority: yes");
            empty where there is nothing to test; with the Holm-adjusted p across the agent's
            family of tested verdicts (:data:`HOLM_FAMILY`).
    """

    finding: str
    value: str
    baseline: str = ""
    verdict: str = ""
    p_value: float | None = None
    """One-sided p-value of the verdict's test (from its interval,
    :func:`goalprobe.stats.p_from_interval`); rows with one form the Holm family."""


def difference_p(verdict: Mapping) -> float | None:
    """One-sided p of "the paired difference lies above 0" from its interval: the test behind
    the plan decoder's and the patching anchors' "yes" (their verdict is that interval's lower
    bound above 0), so these rows join the agent's Holm family. None without an interval, or
    where it has no width below the estimate (the verdict then rests on the interval)."""
    diff = verdict.get("difference") or {}
    return p_from_interval(diff.get("value"), diff.get("ci_low"), diff.get("ci_high"), 0.0)


def _baseline_name(name: str) -> str:
    """A baseline's name in a plan verdict, without its stage and layer."""
    return name.rsplit("/", 1)[-1].replace("_", " ")


def plan_rows(head: Mapping) -> list[HeadlineRow]:
    """The headline decoder at N = 1 and N = 3 against the strongest baseline at each N (the
    majority plan, the shuffled control, the state-only decoder, the optimal policy's plan,
    0.25^N), and at N = 1 on the rows where the agent departs from the optimal policy or
    breaks a tie (where only a plan read-out can win)."""
    verdicts = {v["n"]: v for v in head.get("verdicts") or []}
    if 1 not in verdicts or 3 not in verdicts:
        raise KeyError("the plan sweep has no verdicts (an older sweep schema)")
    n_grids = (verdicts[1]["decoder"] or {}).get("n_grids")
    out = []
    for n in (1, 3):
        v = verdicts[n]
        strongest = v["strongest"]
        out.append(
            HeadlineRow(
                f"Plan decoder prefix accuracy N={n} ({head['name']}, {v['n_rows']} test rows, "
                f"{n_grids} grids; Fig. 10)",
                stat_text(v["decoder"]),
                f"strongest: {_baseline_name(strongest)} {pct(v['baselines'][strongest])} "
                f"(0.25^N {pct(0.25**n)})",
                f"above the strongest baseline: {v['verdict']}",
                difference_p(v),
            )
        )
    departures = head.get("departures") or {}
    verdict = departures.get("verdict_n1")
    if verdict and verdict.get("n_rows"):
        strongest = verdict["strongest"]
        out.append(
            HeadlineRow(
                f"Plan decoder N=1 where the agent departs from the optimal policy or breaks a "
                f"tie ({verdict['n_rows']} test rows)",
                stat_text(verdict["decoder"]),
                f"strongest: {_baseline_name(strongest)} {pct(verdict['baselines'][strongest])}",
                f"above the strongest baseline: {verdict['verdict']}",
                difference_p(verdict),
            )
        )
    return out


def patching_rows(data: Mapping) -> list[HeadlineRow]:
    """The anchors' patching verdicts (every block at once, regenerated reasoning at the
    pre-reasoning anchors, teacher-forced at the post-reasoning ones; cf -> base): the share
    of disjoint pairs moved into the counterfactual's optimal set against a random other grid
    of the same size, with invalid answers, the no-change controls and the recovered logit
    difference beside it; and the all-block grid patch, labelled a sanity check."""
    verdicts = {(v["site"], v["mode"], v["direction"]): v for v in data.get("verdicts") or []}
    if not verdicts:
        raise KeyError("the patching results hold no verdicts (an older schema)")
    wanted = (
        ("pre_reasoning", "regenerated", "cf_to_base"),
        ("post_reasoning", "teacher_forced", "cf_to_base"),
        ("grid", "teacher_forced", "cf_to_base"),
    )
    out = []
    for key in wanted:
        v = verdicts.get(key)
        if v is None:
            continue
        site, mode, _ = key
        sanity = v["verdict"] == "sanity check"
        what = (
            "Sanity check, true for any agent that acts on its input: every block at the grid tokens "
            if sanity
            else f"Patching the {site.replace('_', '-')} anchors at every block "
        )
        out.append(
            HeadlineRow(
                f"{what}({mode.replace('_', ' ')}, cf->base): action into the counterfactual's "
                f"optimal set (n={v['n_pairs']} pairs, {v['n_grids']} grids)",
                f"{stat_text(v['moved'])}; invalid answers {pct(v['invalid']['value'])}; "
                f"logit diff. recovered {stat_text(v['recovered'], percent=False, digits=2)}",
                f"random other grid {stat_text(v['random_grid'])}; no-change controls changed "
                f"{stat_text(v['control_changed'])} (n={v['control_changed']['n']})",
                "sanity check (no verdict)"
                if sanity
                else f"moves it beyond a random grid: {v['verdict']}",
                None if sanity else difference_p(v),
            )
        )
    return out
