"""The end of ``goalprobe demo``: one line per question within 80 columns, with the row specs'
short labels and no word cut (the tiny demo's own output is checked in tests/e2e/test_demo.py)."""

from __future__ import annotations

import json

from goalprobe.report.headline import HeadlineRow
from goalprobe.report.row_specs import SPECS, TEST
from goalprobe.report.summary import (
    WIDTH,
    short_answer,
    summary_rows,
    terminal_summary,
    verdict_lines,
)


def _row(id_, answer, holm_p=None, kind=TEST):
    return HeadlineRow(id_, id_, kind, id_, "", answer=answer, holm_p=holm_p)


def test_answers_say_whether_they_hold_after_holm():
    assert short_answer(_row("a", "yes", 0.01)) == "yes*"
    assert short_answer(_row("a", "yes", 0.2)) == "yes"
    assert short_answer(_row("a", "no", 1.0)) == "no"
    assert short_answer(_row("a", "", kind="pipeline check")) == "check"
    assert short_answer(None) == "-"


def test_every_label_of_every_spec_fits_beside_the_widest_answers_uncut():
    answers = ["undecided", "undecided"]
    rows = [(f"{s.label} (vs {s.baseline})", answers) for s in SPECS]
    lines = verdict_lines(rows, ["bundled", "bundled:map"])
    assert all(len(line) <= WIDTH for line in lines)
    words = {w for label, _ in rows for w in label.split()}
    printed = {w for line in lines for w in line.split()}
    assert words <= printed  # every word of every label whole somewhere
    assert "…" not in "\n".join(lines)
    # no internal names: labels are words, not file stems
    assert not any("_" in s.label for s in SPECS)


def test_a_long_label_wraps_at_a_space_and_the_answers_stay_right():
    long = "A finding whose label is much longer than the room beside two agents' answers"
    lines = verdict_lines([(long, ["yes*", "no"])], ["bundled", "bundled:map"])
    assert len(lines) == 3 and all(len(line) <= WIDTH for line in lines)
    assert " ".join(" ".join(lines[1:]).split()[:-3]) == long
    assert lines[-1].endswith("yes* |          no")


def test_the_summary_of_a_run_lists_tests_and_checks_by_label(tmp_path):
    from goalprobe.run_layout import RunLayout

    layout = RunLayout(tmp_path / "run")
    stat = {"value": 0.9, "ci_low": 0.7, "ci_high": 0.98, "n": 12}
    overall = {
        "accuracy": stat,
        "success_rate": stat,
        "random_walk_accuracy": {"value": 0.3},
        "random_walk_success_rate": {"value": 0.1},
        "random_action_accuracy": {"value": 0.25},
    }
    layout.behaviour_metrics.parent.mkdir(parents=True)
    layout.behaviour_metrics.write_text(json.dumps({"overall": overall}))
    lines = terminal_summary(layout.root, with_control=False)
    assert lines[1].startswith("Per-action accuracy (vs random walk) ")
    assert lines[1].endswith(" yes*") or lines[1].endswith(" yes")
    assert all(len(line) <= WIDTH for line in lines[:-1])
    assert lines[-1].startswith("view: goalprobe view ")
    assert summary_rows([[]]) == []
