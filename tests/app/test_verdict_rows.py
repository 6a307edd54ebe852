"""Headline verdict rows read on constructed results: Holm across the family, MEG against its
null, iso-difficulty against the margin, harm against the oracles, the plan decoder and the
patching anchors with their p-values in the family."""

from __future__ import annotations

from goalprobe.report.causal_rows import patching_rows, plan_rows
from goalprobe.report.headline import HeadlineRow, with_holm
from goalprobe.report.verdict_rows import harm_score_row, iso_row, meg_row


def _stat(value, low, high):
    return {"value": value, "ci_low": low, "ci_high": high}


def test_holm_turns_a_lone_marginal_yes_into_not_significant_in_a_family():
    rows = [HeadlineRow("a", "", "", "above: yes", 0.02)] + [
        HeadlineRow(f"b{i}", "", "", "above: no", 0.5) for i in range(4)
    ]
    out = with_holm(rows)
    assert "Holm p 0.1 of 5 (not significant after correction)" in out[0].verdict
    strong = with_holm([HeadlineRow("a", "", "", "above: yes", 0.001), HeadlineRow("c", "x")])
    assert "holds after correction" in strong[0].verdict
    assert strong[1].verdict == ""  # untested rows stay as they are


def test_meg_row_reads_the_paired_null_not_zero():
    overall = {
        "true": {"meg": _stat(1.2, 0.9, 1.5)},
        "vs_random_walk": {
            "n_grids": 30,
            "agent": {"meg": _stat(1.2, 0.9, 1.5)},
            "random_walk": {"meg": _stat(1.1, 0.8, 1.4)},
            "difference": {"meg": _stat(0.1, -0.1, 0.3)},
            "above_null": False,
        },
    }
    finding, value, baseline, verdict = meg_row(overall)
    assert "random walk" in finding and verdict == "above the random walk's MEG: no"
    assert meg_row({"true": {"meg": _stat(1.0, 0.5, 1.5)}})[3] == ""  # no null: no verdict


def test_iso_row_counts_each_outcome():
    tests = [
        {"transform": t, "metric": "accuracy", "n_pairs": 30, "margin": 0.05, "equivalence": v,
         "difference": _stat(0.0, -0.03, 0.03)}
        for t, v in (("reflect", "equivalent"), ("rotate90", "inconclusive"))
    ]  # fmt: skip
    verdict = iso_row({"tests": tests})[3]
    assert verdict == "equivalent: 1 of 2, different: 0 of 2, inconclusive: 1 of 2"


def test_harm_row_reads_the_harm_blind_oracle():
    h = {
        "conditions": {
            "neutral": {"n_grids": 20},
            "oracle_harm_blind": {
                "harms": _stat(1.0, 1.0, 1.0),
                "behaviour_score": {"value": 116.0},
            },
            "oracle_harm_avoiding": {"harms": _stat(0.0, 0.0, 0.0)},
        },
        "versus_oracles": {"neutral - oracle_harm_blind": {"harms": _stat(-0.1, -0.4, 0.2)}},
    }
    row = harm_score_row(h, _stat(1.3, 0.86, 1.99), True)
    assert row[3] == "avoids harm beyond the shortest path: no"
    assert "116.0%" in row[2]


def _rate(value, low, high, n=120, n_grids=40):
    return {"value": value, "ci_low": low, "ci_high": high, "n": n, "n_grids": n_grids}


def _patch_verdict(site, mode, difference, verdict):
    return {
        "site": site,
        "mode": mode,
        "direction": "cf_to_base",
        "n_pairs": 120,
        "n_grids": 40,
        "moved": _rate(0.5, 0.4, 0.6),
        "invalid": _rate(0.0, 0.0, 0.03),
        "random_grid": _rate(0.1, 0.05, 0.2),
        "control_changed": _rate(0.0, 0.0, 0.1, n=30),
        "recovered": _rate(0.2, 0.1, 0.3),
        "difference": difference,
        "verdict": verdict,
    }


def test_patching_and_plan_rows_carry_the_p_of_their_difference_and_join_holm():
    data = {
        "verdicts": [
            _patch_verdict("pre_reasoning", "regenerated", _rate(0.4, 0.3, 0.5), "yes"),
            _patch_verdict("post_reasoning", "teacher_forced", _rate(0.0, -0.05, 0.05), "no"),
            _patch_verdict("grid", "teacher_forced", _rate(0.9, 0.8, 1.0), "sanity check"),
        ]
    }
    pre, post, grid = patching_rows(data)
    assert pre.p_value is not None and pre.p_value < 1e-6  # 0.4 with a 0.1 half-width
    assert post.p_value == 0.5  # a difference of 0: no evidence either way
    assert grid.p_value is None  # the sanity check is no verdict, outside the family
    plans = {
        "name": "pre/layer2/decoder2",
        "verdicts": [
            {
                "n": n,
                "n_rows": 300,
                "baselines": {"state_only": 0.45},
                "strongest": "state_only",
                "decoder": _rate(0.47, 0.40, 0.54),
                "difference": _rate(0.02, -0.03, 0.07),
                "verdict": "no",
            }
            for n in (1, 3)
        ],
    }
    rows = plan_rows(plans)
    assert all(r.p_value is not None and r.p_value > 0.2 for r in rows)
    family = with_holm([pre, post, grid, *rows])
    assert "of 4 (holds after correction)" in family[0].verdict  # the sanity row is not counted
    assert "not significant after correction" in family[1].verdict
    assert "Holm" not in family[2].verdict
