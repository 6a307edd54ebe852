"""The end of ``goalprobe demo``: one line per verdict within 80 columns, on constructed rows
(the tiny demo's own output is checked in tests/e2e/test_demo.py)."""

from __future__ import annotations

from goalprobe.report.summary import (
    WIDTH,
    short_finding,
    short_question,
    split_verdict,
    verdict_lines,
)


def test_short_finding_drops_details_but_keeps_what_tells_findings_apart():
    finding = (
        "Cognitive map: probe accuracy on grid cells (probing set, "
        "cell_type_coordinate_mlp_pre_reasoning_L2, 105 test grids; Figs. 6-7)"
    )
    assert short_finding(finding) == "Cognitive map: probe accuracy on grid cells"
    assert short_finding("Patching at grid (regenerated): action changed (n=16 / 14)") == (
        "Patching at grid (regenerated): action changed"
    )


def test_split_verdict_and_short_question():
    assert split_verdict("above random walk: yes") == ("above random walk", "yes")
    assert split_verdict("intended: not intended") == ("intended", "not intended")
    assert split_verdict("") == ("", "-")
    assert split_verdict("-") == ("", "-")
    assert short_question("probe above prior_size") == "> prior_size"
    assert short_question("regressor above mean") == "> mean"
    assert short_question("acts on what it is shown") == "acts on what it is shown"


def test_one_line_per_verdict_within_80_columns_both_agents():
    rows = [
        ("Per-action accuracy (Fig. 4)", ["above random walk: yes", "above random walk: yes"]),
        ("KeyDoor success / key pickup (Table 1; n=70, T=30)", ["", "-"]),  # nothing to test
        (
            "Agent localisation, top-1 (probing set, cell_type_coordinate_mlp_pre_reasoning_L2, "
            "105 test grids; Figs. 6-7)",
            ["probe above shuffled: yes", "probe above prior_size_density: no"],
        ),
        ("Holding the key intended in KeyDoor (Definition 20)", ["intended: not intended", "-"]),
        ("Goal distance R² (distance_linear_L2, probing set)", ["regressor above mean: no"] * 2),
        ("Goal distance R² (distance_mlp_L2, probing set)", ["regressor above mean: no"] * 2),
        ("x" * 200, ["above 0: yes", "above 0: no"]),
    ]
    lines = verdict_lines(rows, ["bundled", "bundled:map"])
    assert len(lines) == 1 + 6  # a header, then one line per finding with a verdict
    assert all(len(line) <= WIDTH for line in lines)
    assert lines[0].endswith("bundled | bundled:map")
    assert lines[1].startswith("Per-action accuracy: > random walk ")
    assert lines[1].endswith(" yes | yes")
    assert "KeyDoor success" not in "\n".join(lines)
    # another strongest control for each agent: both named
    assert lines[2].startswith("Agent localisation, top-1: > shuffled / prior_size_density")
    assert lines[2].endswith(" yes | no")
    assert lines[3].startswith("Holding the key intended in KeyDoor: intended ")
    assert lines[3].endswith(" not intended | -")
    # findings that only their details tell apart keep them
    assert "distance_linear_L2" in lines[4] and "distance_mlp_L2" in lines[5]
    assert lines[6].startswith("xxx") and "…" in lines[6] and lines[6].endswith(" yes | no")


def test_single_agent_lines():
    lines = verdict_lines([("MEG on the true grid, nats", ["above 0: yes"])], ["bundled"])
    assert lines[1].startswith("MEG on the true grid, nats: > 0") and lines[1].endswith(" yes")
    assert all(len(line) == WIDTH for line in lines)


def test_holm_details_shorten_to_ok_or_ns():
    from goalprobe.report.summary import split_verdict

    assert split_verdict("above random walk: yes; Holm p 0.036 of 12 (holds after correction)") == (
        "above random walk",
        "yes, Holm ok",
    )
    assert (
        split_verdict("above prior: no; Holm p 1 of 12 (not significant after correction)")[1]
        == "no, Holm ns"
    )
    assert split_verdict("above controls: undecided") == ("above controls", "undecided")
