"""The declarative headline on constructed result files: the Holm family is fixed before the
run (the same whatever the data), a degenerate-interval "yes" is in it with its exact p, no row
appears twice, rows that are not hypotheses carry no verdict, and every "no" or "undecided"
states the effect its n could detect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goalprobe.report.headline import HeadlineRow, headline_rows, one_sided_p, with_holm
from goalprobe.report.row_specs import DESCRIPTIVE, PIPELINE_CHECK, SPECS, TEST, RowSpec, family
from goalprobe.run_layout import RunLayout
from goalprobe.stats import RATE_INTERVAL_METHOD, Estimate


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
    from goalprobe.report.row_specs import spec

    tested = Estimate.from_dict(_stat(0.5, 0.0, 1.0, n_grids=10))
    reading = Reading(
        "Agent localisation", "51.3% [0%, 100%]", "prior", tested,
        question="above prior_size", answer=answer(word), reason="seeds disagree",
    )  # fmt: skip
    row = evaluate(spec("probes.agent_top1"), reading)
    expected = "undecided" if word == "inconclusive" else word
    assert row.answer == expected and f"above prior_size: {expected}" in row.verdict
    assert "seeds disagree" in row.verdict
    assert bool(row.detectable) == (expected == "undecided")  # a 'no'/'undecided' states it
    (held,) = with_holm([row], family("default"))
    assert held.holm_p is not None and f"of {len(family('default'))}" in held.verdict
