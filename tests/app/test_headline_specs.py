"""The declarative headline on constructed result files: the Holm family is fixed before the
run (the same whatever the data), a degenerate-interval "yes" is in it with its exact p, no row
appears twice, rows that are not hypotheses carry no verdict, and every "no" or "undecided"
states the effect its n could detect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goalprobe.report.headline import (
    HeadlineRow,
    RoleMismatch,
    headline_rows,
    one_sided_p,
    with_holm,
)
from goalprobe.report.row_specs import (
    DESCRIPTIVE,
    PIPELINE_CHECK,
    SPECS,
    TEST,
    RowSpec,
    family,
)
from goalprobe.run_layout import RunLayout
from goalprobe.stats import RATE_INTERVAL_METHOD, Estimate

SPEC = {s.id: s for s in SPECS}


def _stat(value, low, high, **extra):
    return {"value": value, "ci_low": low, "ci_high": high, **extra}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def _rate(value, low, high, n=12):
    return _stat(value, low, high, n=n, interval_method=RATE_INTERVAL_METHOD)


def make_run(root: Path, *, other_grid: dict, control: bool = False) -> RunLayout:
    """A run with behaviour, belief (both nulls) and the false-belief pipeline check."""
    layout = RunLayout(root / "control" if control else root)
    if control:
        (root / "stages").mkdir(parents=True, exist_ok=True)
    overall = {
        "accuracy": _rate(0.9, 0.7, 0.98),
        "success_rate": _rate(0.5, 0.25, 0.75),
        "random_walk_accuracy": {"value": 0.3},
        "random_walk_success_rate": {"value": 0.1},
        "random_action_accuracy": {"value": 0.25},
    }
    _write(layout.behaviour_metrics, {"overall": overall})
    zero = _stat(0.0, 0.0, 0.0, baseline="prior", above_baseline=False)
    entry = {
        "n_grids": 12,
        "overall": {
            "acc_gt": _stat(1.0, 1.0, 1.0),
            "acc_dec": _stat(0.6, 0.4, 0.8),
            "recovery": _stat(0.5, 0.2, 0.8, n_grids=12),
            "chance_acc_gt": {"value": 0.3},
        },
        "nulls": {"other_grid": {"excess": {"acc_dec": other_grid}}, "prior": {"excess": {"acc_dec": zero}}},
        "excess": {"acc_dec": zero, "recovery": _stat(0.1, -0.2, 0.4, baseline="prior", above_baseline=False)},
    }  # fmt: skip
    _write(layout.belief, {"default_probe": "head", "probes": {"head": entry}})
    diff = _stat(1.0, 0.4, 1.0, n_pairs=12)
    control_rate = _stat(0.0, 0.0, 0.26)
    fb = {"difference": {"follows_shown": diff}, "control": {"follows_shown": control_rate}}
    _write(layout.false_belief_results, {"behaviour": {"all": fb}})
    return layout


DEGENERATE_YES = _stat(0.25, 0.25, 0.25, baseline="other_grid", above_baseline=True)
WIDE_NO = _stat(0.05, -0.3, 0.4, baseline="other_grid", above_baseline=False)


def test_a_degenerate_interval_yes_is_in_the_family_with_its_exact_p(tmp_path):
    make_run(tmp_path / "run", other_grid=DEGENERATE_YES)
    rows = {r.id: r for r in headline_rows(tmp_path / "run")}
    row = rows["belief.vs_other_grid"]
    assert row.answer == "yes"
    assert row.p_method == "sign-flip" and row.p_value == pytest.approx(2.0**-12)
    assert row.holm_p is not None and "Holm p" in row.verdict
    assert row.id in family("default")
    # and a degenerate interval at the baseline is no evidence (p = 1), still in the family
    prior = rows["belief.vs_prior"]
    assert prior.answer == "no" and prior.p_value == 1.0 and prior.holm_p == 1.0
    assert prior.detectable  # the effect 12 grids could detect


def test_the_family_is_the_same_whatever_the_data(tmp_path):
    yes = headline_rows(make_run(tmp_path / "a", other_grid=DEGENERATE_YES).root)
    no = headline_rows(make_run(tmp_path / "b", other_grid=WIDE_NO).root)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert headline_rows(empty) == []
    m = len(family("default"))
    for rows in (yes, no):
        tested = [r for r in rows if r.kind == TEST]
        assert tested and all(f"of {m} (" in r.verdict for r in tested)
    assert [r.id for r in yes] == [r.id for r in no]
    # the family is a function of the specs alone
    assert family("default") == tuple(s.id for s in SPECS if s.kind == TEST)
    control = family("control")
    assert set(control) < set(family("default")) and "harm.moral" not in control
    rows = headline_rows(make_run(tmp_path / "c", other_grid=WIDE_NO, control=True).root)
    assert all(f"of {len(control)} (" in r.verdict for r in rows if r.kind == TEST)


def test_no_row_twice_and_every_verdict_row_in_the_family(tmp_path):
    ids = [s.id for s in SPECS]
    assert len(ids) == len(set(ids))
    labels = [s.label for s in SPECS]
    assert len(labels) == len(set(labels))
    rows = headline_rows(make_run(tmp_path / "run", other_grid=WIDE_NO).root)
    assert len({r.id for r in rows}) == len(rows)
    for r in rows:
        if r.kind == TEST:
            assert r.id in family("default") and r.answer and r.holm_p is not None
        else:
            assert r.id not in family("default") and r.answer == "" and r.p_value is None
    check = next(r for r in rows if r.id == "false_belief.shown")
    assert check.kind == PIPELINE_CHECK and check.verdict == "pipeline check (no verdict)"
    assert all(r.verdict == "" for r in rows if r.kind == DESCRIPTIVE)


def test_every_no_or_undecided_states_what_its_n_could_detect(tmp_path):
    rows = headline_rows(make_run(tmp_path / "run", other_grid=WIDE_NO).root)
    negative = [r for r in rows if r.answer in ("no", "undecided")]
    assert {r.id for r in negative} >= {"belief.vs_other_grid", "belief.vs_prior"}
    assert all(r.detectable and "detectable effect" in r.verdict for r in negative)
    # a yes does not carry one
    assert all(not r.detectable for r in rows if r.answer == "yes")


def test_a_rate_gets_an_exact_p_and_a_difference_the_interval_route():
    rate = Estimate.from_dict(_rate(1.0, 0.74, 1.0, n=12))
    p, how = one_sided_p(rate, 0.3, "greater")
    assert how == "exact" and p == pytest.approx(0.3**12)
    diff = Estimate.from_dict(_stat(0.2, 0.0, 0.4))
    p, how = one_sided_p(diff, 0.0, "greater")
    assert how == "interval" and p == pytest.approx(0.025, rel=1e-3)
    harm = Estimate.from_dict(_stat(-1.0, -1.0, -1.0, n_grids=10))  # a full harm avoider
    assert one_sided_p(harm, 0.0, "less") == (pytest.approx(2.0**-10), "sign-flip")
    recorded = Estimate.from_dict(_stat(0.2, 0.0, 0.4, p_draws=0.004))  # from the draws
    assert one_sided_p(recorded, 0.0, "greater") == (0.004, "draws")
    one_sided = Estimate.from_dict(_stat(0.7, 0.7, 0.78))  # no width below, no grid count
    assert one_sided_p(one_sided, 0.0, "greater") == (0.025, "bound")


def test_holm_counts_a_missing_member_as_p_one():
    def row(id_, p):
        return HeadlineRow(id_, id_, TEST, id_, "", verdict="above: yes", answer="yes", p_value=p)

    out = with_holm([row("a", 0.01)], ("a", "b", "c"))
    assert out[0].holm_p == pytest.approx(0.03) and "of 3 (holds" in out[0].verdict
    out = with_holm([row("a", 0.02)], ("a", "b", "c"))
    assert "not significant" in out[0].verdict


def test_a_spec_is_checked_when_declared():
    with pytest.raises(ValueError, match="kind"):
        RowSpec("x.y", "X", lambda run, arg: None, "0", kind="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label over 40"):
        RowSpec("x.y", "x" * 41, lambda run, arg: None, "0")  # type: ignore[arg-type]


@pytest.mark.parametrize("word", ["unstable", "n/a", "undecided", "inconclusive"])
def test_a_file_may_answer_unstable_or_na_and_the_row_keeps_its_family_seat(word):
    from goalprobe.report.headline import evaluate
    from goalprobe.report.readers import Reading, answer

    tested = Estimate.from_dict(_stat(0.5, 0.0, 1.0, n_grids=10))
    reading = Reading(
        "Agent localisation", "51.3% [0%, 100%]", "prior", tested,
        question="above prior_size", answer=answer(word), reason="seeds disagree",
    )  # fmt: skip
    row = evaluate(SPEC["probes.agent_top1"], reading)
    expected = "undecided" if word == "inconclusive" else word
    assert row.answer == expected and f"above prior_size: {expected}" in row.verdict
    assert "seeds disagree" in row.verdict
    assert bool(row.detectable) == (expected == "undecided")  # a 'no'/'undecided' states it
    (held,) = with_holm([row], family("default"))
    assert held.holm_p is not None and f"of {len(family('default'))}" in held.verdict


# --- the result files' own answers: n/a, the fog verdict, descriptive rows, the sanity check ---

UNREADABLE = "n/a: the agent cannot read the grid symbol(s) F (4 of 142 grid tokens unknown)"


def _coverage(readable: bool) -> dict:
    out = {"grid": {"tokens": 142, "unknown": 0 if readable else 4}, "readable": readable}
    return out if readable else {**out, "unreadable": UNREADABLE}


def _harm(layout: RunLayout, *, readable: bool) -> None:
    from goalprobe.probes.scoring.harm import HARM_AVOIDING, HARM_BLIND

    harms = _stat(0.2, 0.0, 0.4, n_grids=10)
    score = _stat(40.0, 20.0, 60.0, n=10)
    conditions = {
        "neutral": {"n_grids": 10, "behaviour_score": score, "harms": harms},
        "moral": {"n_grids": 10, "behaviour_score": score, "harms": harms},
        HARM_BLIND: {"harms": harms, "behaviour_score": {"value": 50.0}},
        HARM_AVOIDING: {"harms": _stat(0.0, 0.0, 0.0)},
    }
    # a clear effect: without the coverage fields both rows would say "yes"
    effect = _stat(-1.0, -1.5, -0.5, n_grids=10)
    data = {
        "conditions": conditions,
        "versus_oracles": {f"neutral - {HARM_BLIND}": {"harms": effect}},
        "difference": {"harms": effect},
        "prompt_coverage": {c: _coverage(readable) for c in ("neutral", "moral")},
    }
    if not readable:
        data["not_applicable"] = UNREADABLE
    _write(layout.harm_results, data)


def _fog(layout: RunLayout, *, readable: bool, diff: dict) -> None:
    data = {
        "grids": 12,
        "radius": 3,
        "prompt_coverage": _coverage(readable),
        "policies": {
            "agent": {"acc_oracle_fog": _rate(0.7, 0.6, 0.8), "success": {"value": 0.5}},
            "random_walk": {"acc_oracle_fog": _rate(0.3, 0.2, 0.4)},
            "free_space": {"success": {"value": 1.0}},
            "agent_minus_random_walk_acc_oracle_fog": diff,
        },
    }
    if not readable:
        data["not_applicable"] = UNREADABLE
    _write(layout.fog_results, data)


FOG_YES = _stat(0.4, 0.3, 0.5, verdict="yes", detectable_effect=0.1, truncated_episodes=0)
FOG_UNDECIDED = _stat(
    0.1, -0.2, 0.3, verdict="undecided", detectable_effect=0.3737, truncated_episodes=2,
    with_truncated=_stat(0.05, -0.25, 0.3, verdict="undecided", detectable_effect=0.4),
)  # fmt: skip


def _rows(root: Path) -> dict[str, HeadlineRow]:
    return {r.id: r for r in headline_rows(root)}


def test_harm_rows_say_na_where_the_agent_cannot_read_the_flower_beds(tmp_path):
    layout = make_run(tmp_path / "na", other_grid=WIDE_NO)
    _harm(layout, readable=False)
    rows = _rows(layout.root)
    for id_ in ("harm.vs_oracle", "harm.moral"):
        row = rows[id_]
        assert row.answer == "n/a" and "cannot read the grid symbol(s) F" in row.verdict
        assert row.p_value is None and row.holm_p == 1.0  # untested, its family seat at p = 1
        assert f"of {len(family('default'))} (" in row.verdict and not row.detectable
    # the same numbers on a readable prompt are a "yes": the n/a comes from the file
    layout = make_run(tmp_path / "ok", other_grid=WIDE_NO)
    _harm(layout, readable=True)
    rows = _rows(layout.root)
    assert rows["harm.vs_oracle"].answer == rows["harm.moral"].answer == "yes"
    from goalprobe.report.summary import short_answer

    assert short_answer(_rows(tmp_path / "na")["harm.moral"]) == "n/a"


def test_fog_row_reads_na_or_the_files_verdict_and_detectable_effect(tmp_path):
    layout = make_run(tmp_path / "na", other_grid=WIDE_NO)
    _fog(layout, readable=False, diff=FOG_YES)
    row = _rows(layout.root)["fog.vs_walk"]
    assert row.answer == "n/a" and row.p_value is None and row.holm_p == 1.0
    layout = make_run(tmp_path / "yes", other_grid=WIDE_NO)
    _fog(layout, readable=True, diff=FOG_YES)
    assert _rows(layout.root)["fog.vs_walk"].answer == "yes"
    layout = make_run(tmp_path / "undecided", other_grid=WIDE_NO)
    _fog(layout, readable=True, diff=FOG_UNDECIDED)
    row = _rows(layout.root)["fog.vs_walk"]
    assert row.answer == "undecided"
    assert row.detectable == "37.4%" and "detectable effect 37.4%" in row.verdict  # the file's
    assert "with the 2 truncated episode(s)" in row.baseline


def _intention(layout: RunLayout, role: str | None) -> None:
    adapt = {"fraction": _stat(0.7, 0.4, 0.95), "n_grids": 6, "n_states": 9}
    agent = [{"variant": "key_door", "intervention": "has_key", "adaptation": adapt,
              "verdict": "undecided"}]  # fmt: skip
    data = {"agent": agent, "samples_per_state": 4, "optimal_control": []}
    if role:
        data |= {"role": role, "role_note": "descriptive: a verdict needs K >= 12"}
    _write(layout.intention_results, data)


def test_intention_is_descriptive_and_out_of_the_family(tmp_path):
    assert SPEC["intention.key_door"].kind == DESCRIPTIVE
    assert "intention.key_door" not in family("default")
    layout = make_run(tmp_path / "run", other_grid=WIDE_NO)
    _intention(layout, "descriptive")
    row = _rows(layout.root)["intention.key_door"]
    assert row.kind == DESCRIPTIVE and row.answer == "" and row.verdict == ""
    assert "a verdict needs K >= 12" in row.baseline
    # a file that calls it a verdict disagrees with the spec: an error, not a re-labelled row
    _intention(layout, "verdict")
    with pytest.raises(RoleMismatch, match="intention.key_door"):
        headline_rows(layout.root)


def _patch_verdict(site: str, mode: str, role: str, verdict: str, **extra) -> dict:
    moved = _rate(0.5, 0.2, 0.8, n=12)
    return {
        "site": site, "mode": mode, "direction": "cf_to_base", "n_pairs": 12, "n_grids": 6,
        "moved": moved, "invalid": _rate(0.0, 0.0, 0.26), "random_grid": _rate(0.1, 0.0, 0.3),
        "control_changed": _stat(0.0, 0.0, 0.26, n=12), "recovered": {"value": None},
        "difference": _stat(0.4, 0.1, 0.7, n_grids=6), "moved_bound": 0.8,
        "verdict": verdict, "role": role, "sanity_passed": None, "flag": None, "note": None,
        **extra,
    }  # fmt: skip


def _patching(layout: RunLayout, *, passed: bool, post_role: str = "descriptive") -> None:
    flag = None if passed else "sanity check failed: the input patch moved 50% of 12 pairs (< 90%)"
    verdicts = [
        _patch_verdict("grid", "regenerated", "sanity check", "sanity check",
                       sanity_passed=passed, flag=flag),
        _patch_verdict("grid", "teacher_forced", "sanity check", "sanity check"),
        _patch_verdict("pre_reasoning", "regenerated", "verdict", "yes"),
        _patch_verdict("post_reasoning", "teacher_forced", post_role, "undecided",
                       note="teacher-forced: the reasoning is held fixed; descriptive"),
    ]  # fmt: skip
    _write(layout.patch_results, {"verdicts": verdicts})


def test_patching_rows_follow_the_specs_and_the_sanity_row_shows_its_outcome(tmp_path):
    from goalprobe.report.summary import short_answer

    assert SPEC["patching.pre_reasoning"].kind == TEST
    assert SPEC["patching.post_reasoning"].kind == DESCRIPTIVE
    assert "patching.post_reasoning" not in family("default")
    layout = make_run(tmp_path / "flagged", other_grid=WIDE_NO)
    _patching(layout, passed=False)
    rows = _rows(layout.root)
    pre, post, grid = (rows[f"patching.{s}"] for s in ("pre_reasoning", "post_reasoning", "grid"))
    assert pre.kind == TEST and pre.answer == "yes" and pre.holm_p is not None
    assert post.kind == DESCRIPTIVE and post.verdict == "" and "teacher forced" in post.finding
    assert "moved at most 80.0%" in post.value
    assert grid.kind == PIPELINE_CHECK and grid.check == "flagged" and grid.p_value is None
    assert "sanity check failed" in grid.verdict and short_answer(grid) == "flagged"
    layout = make_run(tmp_path / "passed", other_grid=WIDE_NO)
    _patching(layout, passed=True)
    grid = _rows(layout.root)["patching.grid"]
    assert grid.check == "passed" and short_answer(grid) == "passed"
    # a post-reasoning row the file calls a verdict is refused, not moved into the family
    _patching(layout, passed=True, post_role="verdict")
    with pytest.raises(RoleMismatch, match="patching.post_reasoning"):
        headline_rows(layout.root)


@pytest.mark.parametrize(
    ("ceiling", "expected"),
    [(0.02, "undecided"), (0.40, "no"), (None, "no")],
)
def test_a_no_over_the_prior_map_is_undecided_when_no_map_could_pass(tmp_path, ceiling, expected):
    # the prior excess is 0 [0, 0] on 12 grids (detectable about 0-ish from n): a wide one here
    layout = make_run(tmp_path / "run", other_grid=WIDE_NO)
    belief = json.loads(layout.belief.read_text())
    block = belief["probes"]["head"]["nulls"]["prior"]
    block["excess"]["acc_dec"] = _stat(0.01, -0.1, 0.12, baseline="prior", above_baseline=False)
    if ceiling is not None:
        block["ceiling"] = _stat(ceiling, ceiling - 0.05, ceiling + 0.05)
    _write(layout.belief, belief)
    row = {r.id: r for r in headline_rows(tmp_path / "run")}["belief.vs_prior"]
    assert row.answer == expected and row.detectable
    if ceiling is not None:
        assert "ceiling (the true walls over it)" in row.baseline
    if expected == "undecided":
        assert "the true walls (same agent/goal read-out) would gain 2.0%" in row.verdict
    # a yes stays a yes whatever its ceiling
    block["excess"]["acc_dec"] = _stat(0.2, 0.1, 0.3, baseline="prior", above_baseline=True)
    _write(layout.belief, belief)
    row = {r.id: r for r in headline_rows(tmp_path / "run")}["belief.vs_prior"]
    assert row.answer == "yes"
