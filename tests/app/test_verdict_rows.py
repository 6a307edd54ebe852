"""Headline verdict rows read on constructed results: Holm across the family, MEG against its
null, iso-difficulty against the margin, harm against the oracles."""

from __future__ import annotations

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
