"""The steering section (issue 39 item 6): do the agent-centred wall probe's directions matter?
Both agents' success rates by edit, the paired differences and the calibration, from
``RUN/steering/results.json`` (and the positive control's beside it)."""

from __future__ import annotations

from goalprobe.report.blocks import Block, Figures, Text, pct, stat_text, table
from goalprobe.report.run import RunReader

_EDITS = {
    "probe": "probe direction (the wall toggled)",
    "random": "random direction, same norm",
    "irrelevant": "probe direction of an irrelevant cell",
    "none": "unedited (reference)",
}


def _agent_rows(run: RunReader, agent: str) -> tuple[list[tuple], list[tuple]]:
    data = run.json(run.layout.steering_results)
    rates = data.get("rates") or {}
    where = f"{agent} (n={data['n_states']} states, {data['n_grids']} grids)"
    rows = [
        (where, _EDITS[c], stat_text(rates.get(c)), stat_text((data.get("invalid") or {}).get(c)))
        for c in ("probe", "random", "irrelevant", "none")
    ]
    flips = data.get("read_flip") or {}
    diffs = [
        (
            agent,
            f"probe minus {c}",
            stat_text(d),
            data["verdict"] if c == (data.get("tested") or {}).get("control") else "",
        )
        for c, d in (data.get("differences") or {}).items()
    ]
    diffs.append(
        (
            agent,
            "calibration",
            f"read-out flipped on training rows {pct(data.get('target_train_flip'))}, on test "
            f"targets {pct(flips.get('probe'))} (n={flips.get('n', 0)}); dropped "
            + "; ".join(f"{n} {why}" for why, n in (data.get("dropped") or {}).items()),
            data.get("reason", ""),
        )
    )
    return rows, diffs


def steering(run: RunReader, fig: Figures) -> list[Block]:
    """Both agents' steering: rates by edit and the paired differences with the verdict."""
    rows, diffs = _agent_rows(run, "Default agent")  # MissingInput when the stage did not run
    control = RunReader(run.layout.control.root)
    if control.layout.steering_results.is_file():
        more_rows, more_diffs = _agent_rows(control, "Positive control")
        rows, diffs = rows + more_rows, diffs + more_diffs
    return [
        Text(
            "The agent-centred wall probe (per offset from the agent, prior-logit offset) is "
            "fitted on the probing set's training grids; on test-grid states one neighbour of "
            "the agent whose wall toggle makes a non-optimal action optimal is edited along the "
            "probe's direction at the pre-reasoning anchors (strength chosen on training rows so "
            "that the probe's read-out flips), and the reasoning is regenerated. Success: the "
            "new action is optimal on the edited map and not on the true one, for every edit "
            "alike. Controls on the same states: a random direction of the same norm, and the "
            "probe's edit of a cell whose toggle changes no optimal action."
        ),
        table(("agent", "edit", "success (95% CI)", "invalid answers"), rows),
        table(("agent", "paired difference", "value (95% CI)", "verdict"), diffs),
    ]
