"""Where the behavioural and scoring headline rows get their numbers: one reader per row spec
(:mod:`goalprobe.report.row_specs`), each a plain function of the run and the spec's ``arg``
returning a :class:`~goalprobe.report.row_specs.Reading`; a missing input raises
:class:`~goalprobe.report.run.MissingInput` or ``KeyError`` and the row is left out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from goalprobe.probes.scoring.harm import HARM_AVOIDING, HARM_BLIND
from goalprobe.report.blocks import pct, stat_text
from goalprobe.report.fog import truncation_text as fog_truncation_text
from goalprobe.report.run import RunReader
from goalprobe.stats import EQUIVALENCE_VERDICTS, VERDICT_ANSWERS, Estimate, undetectable_ceiling
from goalprobe.viewer.figures.scoring import probe_entry

_WORDS = {
    "inconclusive": "undecided",
    "intended": "yes",
    "not intended": "no",
    "different": "yes",
}
"""Answers the result files write in their own words, in the headline's."""


def answer(flag: Any) -> str | None:
    """A file's answer in the headline's words: a bool as yes/no, a word of
    :data:`~goalprobe.stats.VERDICT_ANSWERS` as itself; None where it gives none (the
    headline then reads the interval)."""
    if isinstance(flag, bool):
        return "yes" if flag else "no"
    if isinstance(flag, str):
        word = _WORDS.get(flag, flag)
        return word if word in VERDICT_ANSWERS else None
    return None


@dataclass(frozen=True)
class Reading:
    """What a reader found in the run for one row.

    Attributes:
        finding: the finding in full (counts, figure or table of the study).
        value: the measured value, formatted (with its 95% CI).
        baseline: what it is compared with, formatted.
        tested: the estimate the verdict reads (a difference, or the value itself).
        point: the baseline point ``tested`` is compared with (0 for a difference).
        side: ``greater`` (the question is "above") or ``less`` ("below").
        question: the question in words ("above random walk").
        answer: the answer the result file records (``yes``/``no``/``undecided``/
            ``unstable``/``n/a``), or None to read it from ``tested``'s interval.
        percent: whether ``tested`` is a share (printed in %).
        reason: why an ``unstable`` / ``n/a`` answer.
        role: what the result file says the row is (a spec kind: ``test``, ``descriptive``,
            ``pipeline check``; "" where it says nothing): the headline checks it against the
            row's spec and refuses a disagreement rather than re-label the row.
        detectable: the effect its n could detect as the result file computed it (None: the
            headline derives it from ``tested``'s interval).
        check: a pipeline check's outcome (``passed`` / ``flagged``; "" where it records none).
    """

    finding: str
    value: str
    baseline: str = ""
    tested: Estimate | None = None
    point: float = 0.0
    side: str = "greater"
    question: str = ""
    answer: str | None = None
    percent: bool = True
    reason: str = ""
    role: str = ""
    detectable: float | None = None
    check: str = ""


FILE_ROLES = {"verdict": "test", "descriptive": "descriptive", "sanity check": "pipeline check"}
"""The roles the result files write (``role``), as spec kinds."""


def file_role(role: Any) -> str:
    """A result file's ``role`` as a spec kind ("" where it records none); an unknown word is an
    error (the writer and the headline disagree)."""
    if role is None or role == "":
        return ""
    if role not in FILE_ROLES:
        raise RuntimeError(f"unknown row role {role!r} in a result file")
    return FILE_ROLES[role]


def check_outcome(passed: Any) -> str:
    """A pipeline check's recorded outcome: ``passed`` / ``flagged``, "" where none."""
    return "" if passed is None else ("passed" if passed else "flagged")


def unreadable(data: Mapping, conditions: tuple[str, ...] = ()) -> str:
    """Why the agent cannot be asked (``"n/a: ..."``), from a result file's
    ``prompt_coverage`` (per condition where ``conditions`` names them) or its
    ``not_applicable``; "" where it can read its prompts (or the file predates the fields)."""
    coverage = data.get("prompt_coverage") or {}
    entries = [coverage.get(c) or {} for c in conditions] if conditions else [coverage]
    for entry in entries:
        if entry.get("readable") is False:
            return str(entry.get("unreadable") or data.get("not_applicable") or "n/a")
    if conditions and coverage:
        return ""
    return str(data.get("not_applicable") or "")


def _na_text(reason: str) -> str:
    return reason.removeprefix("n/a: ").removeprefix("n/a")


def _behaviour(run: RunReader, key: str, walk_key: str, finding: str) -> Reading:
    o = run.json(run.layout.behaviour_metrics)["overall"]
    walk = o[walk_key]["value"]
    extra = f", random action {pct(o['random_action_accuracy']['value'])}"
    return Reading(
        finding,
        stat_text(o[key]),
        f"random walk {pct(walk)}" + (extra if key == "accuracy" else ""),
        Estimate.from_dict(o[key]),
        walk,
        question="above random walk",
    )


def accuracy(run: RunReader, arg: str) -> Reading:
    """Per-action accuracy against the random walk's (Fig. 4)."""
    return _behaviour(run, "accuracy", "random_walk_accuracy", "Per-action accuracy (Fig. 4)")


def success(run: RunReader, arg: str) -> Reading:
    """Goal success rate against the random walk's (Fig. 12a)."""
    return _behaviour(
        run, "success_rate", "random_walk_success_rate", "Goal success rate (Fig. 12a)"
    )


def iso(run: RunReader, arg: str) -> Reading:
    """Table 3: accuracy transformed - base per transform against the equivalence margin
    (each transform's own TOST reading; the row is descriptive)."""
    data = run.json(run.layout.iso_results)
    tests = [t for t in data["tests"] if t["metric"] == "accuracy" and t.get("n_pairs")]
    if not any(t.get("equivalence") for t in tests):
        raise KeyError("an iso results file before the equivalence margin")
    counts = {v: sum(t["equivalence"] == v for t in tests) for v in EQUIVALENCE_VERDICTS}
    detail = "; ".join(
        f"{t['transform']} {stat_text(t['difference'])} {t['equivalence']}" for t in tests
    )
    summary = ", ".join(f"{v}: {counts[v]} of {len(tests)}" for v in EQUIVALENCE_VERDICTS)
    return Reading(
        f"Iso-difficulty: accuracy transformed − base, paired by grid (>= "
        f"{min(t['n_pairs'] for t in tests)} pairs per transform; Table 3)",
        f"{detail} ({summary})",
        f"equivalence margin ±{pct(tests[0]['margin'])}; study: no transform changes accuracy",
    )


def _rate_text(entry: Mapping, ci: str, rate: str) -> str:
    return stat_text(entry[ci]) if ci in entry else pct(entry.get(rate))


def key_door(run: RunReader, arg: str) -> Reading:
    """Table 1: KeyDoor success and key pickup (descriptive)."""
    kd = run.json(run.layout.keys_results)["variants"]["key_door"]
    return Reading(
        f"KeyDoor success / key pickup (Table 1; n={kd['n_trajectories']}, T=30)",
        f"{_rate_text(kd, 'success_ci', 'success_rate')} / "
        f"{_rate_text(kd, 'key_pickup_ci', 'key_pickup_rate')}",
        "study: 100% / 100%",
    )


def key_no_door(run: RunReader, arg: str) -> Reading:
    """Table 1: the useless key picked up in KeyNoDoor (descriptive)."""
    knd = run.json(run.layout.keys_results)["variants"]["key_no_door"]
    return Reading(
        f"KeyNoDoor: useless key picked up (Table 1; n={knd['n_trajectories']})",
        _rate_text(knd, "key_pickup_ci", "key_pickup_rate"),
        "study: 17%",
    )


def belief_table(run: RunReader, arg: str) -> Reading:
    """Table 2: Acc. GT / Acc. Dec. / Recovery of the headline probe's maps (descriptive)."""
    key, entry = probe_entry(run.json(run.layout.belief))
    o = entry["overall"]
    return Reading(
        f"Acc. GT / Acc. Dec. / Recovery (Table 2; maps of {key})",
        " / ".join(stat_text(o.get(k)) for k in ("acc_gt", "acc_dec", "recovery")),
        f"chance {pct((o.get('chance_acc_gt') or {}).get('value'))}",
    )


_NULLS = {
    "other_grid": "another grid's map (the whole belief)",
    "prior": "the prior map (the walls; same agent/goal read-out)",
}


def belief_null(run: RunReader, arg: str) -> Reading:
    """Acc. Dec. minus the same read-out on a null map (``arg``: ``other_grid``, ``prior``),
    paired by grid, beside its ceiling (the true walls with the same read-out): a "no" whose
    ceiling is below what its n can detect is "undecided" (:func:`undetectable_ceiling`)."""
    _, entry = probe_entry(run.json(run.layout.belief))
    e, ceiling = entry["nulls"][arg]["excess"]["acc_dec"], entry["nulls"][arg].get("ceiling")
    said = answer(e.get("above_baseline"))
    top = (ceiling or {}).get("value")
    mde = undetectable_ceiling(said, e.get("ci_low"), e.get("ci_high"), top, n=entry.get("n_grids"))
    room = f"; ceiling (the true walls over it) {stat_text(ceiling)}" if ceiling else ""
    return Reading(
        f"Acc. Dec. minus {_NULLS[arg]}",
        stat_text(e, percent=True),
        f"null: {arg} maps{room}",
        Estimate.from_dict({"n_grids": entry.get("n_grids"), **e}),
        question="above the null",
        answer=said if mde is None else "undecided",
        reason=""
        if mde is None
        else f"the true walls (same agent/goal read-out) would gain "
        f"{pct(top)} over this null, below the {pct(mde)} this n can detect",
    )


def recovery_null(run: RunReader, arg: str) -> Reading:
    """Recovery minus its strongest null (uninformative maps)."""
    _, entry = probe_entry(run.json(run.layout.belief))
    e = entry["excess"]["recovery"]
    return Reading(
        "Recovery minus its null (uninformative maps)",
        stat_text(e, percent=True),
        f"null: {e['baseline']} maps",
        Estimate.from_dict({"n_grids": entry["overall"]["recovery"].get("n_grids"), **e}),
        question="above the null",
        answer=answer(e.get("above_baseline")),
    )


def meg(run: RunReader, arg: str) -> Reading:
    """MEG on the true grid minus the random walk's, estimated the same way, paired by grid."""
    null = run.json(run.layout.meg)["overall"]["vs_random_walk"]
    diff = null["difference"]["meg"]
    return Reading(
        f"MEG on the true grid minus the random walk's, nats, paired by grid "
        f"({null['n_grids']} grids; MEG paper, Def. 3.2)",
        stat_text(diff, percent=False),
        f"0 (agent {stat_text(null['agent']['meg'], percent=False)}, random walk estimated "
        f"the same way {stat_text(null['random_walk']['meg'], percent=False)})",
        Estimate.from_dict({**diff, "n_grids": diff.get("n_grids", null["n_grids"])}),
        question="above the random walk's MEG",
        answer=answer(null.get("above_null")),
        percent=False,
    )


def false_belief(run: RunReader, arg: str) -> Reading:
    """False-belief grids: the first action optimal only on the drawn grid, minus control
    pairs (a pipeline check: the prompt shows only the drawn grid)."""
    fb = run.json(run.layout.false_belief_results)["behaviour"]["all"]
    diff, control = fb["difference"]["follows_shown"], fb["control"]["follows_shown"]
    return Reading(
        f"False-belief grids: first action optimal only on the drawn grid, minus control "
        f"(n={diff['n_pairs']} pairs)",
        stat_text(diff),
        f"0 (control pairs {stat_text(control)})",
        Estimate.from_dict(diff),
        question="acts on what it is shown",
    )


def harm_vs_oracle(run: RunReader, arg: str) -> Reading:
    """Harms per episode under the neutral prompt minus the harm-blind shortest-path oracle's,
    paired by grid (below 0: avoids harm beyond the shortest path)."""
    h = run.json(run.layout.harm_results)
    neutral = h["conditions"]["neutral"]
    blind = h["conditions"][HARM_BLIND]
    versus = h["versus_oracles"][f"neutral - {HARM_BLIND}"]["harms"]
    score = neutral["behaviour_score"]
    scaled = {k: None if score[k] is None else score[k] / 100 for k in score if k != "n"}
    blind_score = blind["behaviour_score"]["value"]
    na = unreadable(h, ("neutral",))
    return Reading(
        f"Harms per episode, neutral prompt, minus the harm-blind shortest-path oracle's, "
        f"paired by grid ({neutral['n_grids']} grids; MACHIAVELLI)",
        stat_text(versus, percent=False),
        f"0; harm-blind oracle {stat_text(blind['harms'], percent=False)} (behaviour score "
        f"{pct(None if blind_score is None else blind_score / 100)}), harm-avoiding oracle "
        f"{stat_text(h['conditions'][HARM_AVOIDING]['harms'], percent=False)}; agent's "
        f"behaviour score {stat_text(scaled)} of random",
        Estimate.from_dict({**versus, "n_grids": neutral["n_grids"]}),
        side="less",
        question="avoids harm beyond the shortest path",
        answer="n/a" if na else None,
        percent=False,
        reason=_na_text(na),
    )


def harm_moral(run: RunReader, arg: str) -> Reading:
    """Harms per episode under the moral prompt minus the neutral prompt's, paired by grid."""
    h = run.json(run.layout.harm_results)
    effect = h["difference"]["harms"]
    n = h["conditions"]["neutral"]["n_grids"]
    na = unreadable(h, ("neutral", "moral"))
    return Reading(
        f"Moral conditioning: harms per episode, moral minus neutral ({n} grids)",
        stat_text(effect, percent=False),
        "0",
        Estimate.from_dict({**effect, "n_grids": n}),
        side="less",
        question="conditioning reduces harm",
        answer="n/a" if na else None,
        percent=False,
        reason=_na_text(na),
    )


def intention(run: RunReader, arg: str) -> Reading:
    """Holding the key in KeyDoor (Ward et al., Definition 20): the adaptation as a fraction of
    the optimal policy's, or the excess total variation in an older results file. The file's
    ``role`` (descriptive at a demo's K and grids, ``role_note`` says why) goes with it."""
    results = run.json(run.layout.intention_results)
    (r,) = [
        r for r in results["agent"] if (r["variant"], r["intervention"]) == ("key_door", "has_key")
    ]
    adapt = r.get("adaptation")
    if adapt:
        irr = adapt.get("beyond_irrelevant")
        return Reading(
            f"Holding the key intended in KeyDoor (Definition 20): adaptation as a fraction "
            f"of the optimal policy's ({adapt['n_grids']} grids, {adapt['n_states']} states "
            f"where pi* changes, {results['samples_per_state']} samples each)",
            stat_text(adapt["fraction"]),
            f"0 (not intended) to 100% (pi*); beyond an irrelevant change "
            f"{'–' if not irr else stat_text(irr)}"
            + (f"; {results['role_note']}" if results.get("role_note") else ""),
            Estimate.from_dict({**adapt["fraction"], "n_grids": adapt["n_grids"]}),
            question="intended",
            answer=answer(r["verdict"]),
            role=file_role(results.get("role")),
        )
    control = {(c["variant"], c["intervention"]): c for c in results["optimal_control"]}
    c = control.get(("key_door", "has_key"))
    return Reading(
        f"Holding the key intended in KeyDoor (Definition 20): excess TV "
        f"({r['n_grids']} grids, p={r['p_value']:.3g})",
        stat_text(r["excess_tv"], percent=False),
        "0; optimal policy " + ("–" if c is None else stat_text(c["excess_tv"], percent=False)),
        Estimate.from_dict({**r["excess_tv"], "n_grids": r["n_grids"]}),
        question="intended",
        answer=answer(r["verdict"]),
        percent=False,
        role=file_role(results.get("role")),
    )


def fog(run: RunReader, arg: str) -> Reading:
    """Fogged grids: moves free-space optimal on what was seen, against the random walk: the
    file's verdict and detectable effect on the completed episodes (the truncated ones beside
    it), ``n/a`` where the agent cannot read the fogged prompt."""
    data = run.json(run.layout.fog_results)
    pol = data["policies"]
    agent, walk = pol["agent"], pol["random_walk"]
    diff = pol.get("agent_minus_random_walk_acc_oracle_fog") or {}
    cut = fog_truncation_text(data, short=True) or ""
    na = unreadable(data)
    full = diff.get("with_truncated") or {}
    if full and diff.get("truncated_episodes"):
        cut += (
            f"{'; ' if cut else ''}with the {diff['truncated_episodes']} truncated episode(s): "
            f"{stat_text(full)} ({full.get('verdict', '–')})"
        )
    effect = diff.get("detectable_effect")
    return Reading(
        f"Fogged grids: moves free-space optimal on what was seen ({data['grids']} "
        f"grids, radius {data['radius']}; App. A)",
        stat_text(agent["acc_oracle_fog"]),
        f"random walk {stat_text(walk['acc_oracle_fog'])}; success "
        f"{pct(agent['success']['value'])} (free-space planner "
        f"{pct(pol['free_space']['success']['value'])})" + (f"; {cut}" if cut else ""),
        Estimate.from_dict({"n_grids": data["grids"], **diff}) if diff else None,
        question="above random walk",
        answer="n/a" if na else answer(diff.get("verdict")),
        reason=_na_text(na),
        detectable=None if effect is None else float(effect),
    )
