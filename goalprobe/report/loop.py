"""The belief loop in the report: each agent's headline decoded maps (cells from the cell probe,
agent and goal from the position probes) scored against the agent's actions, beside the two
nulls that share the read-out (another grid's map; the size-and-density prior's walls with this
step's agent and goal), for this run and the positive control (``RUN/control/``)."""

from __future__ import annotations

from goalprobe.report.agents import agent_name
from goalprobe.report.blocks import Block, Text, stat_text, table
from goalprobe.report.run import RunReader
from goalprobe.viewer.figures.scoring import probe_entry

LOOP_METRICS = (
    ("acc_gt", "Acc. GT"),
    ("acc_dec", "Acc. Dec."),
    ("agreement", "Agreement (study: optimal policies on GT and decoded grid agree)"),
    ("optimal_on_both", "optimal on both (the agent's action; ≤ min(Acc. GT, Acc. Dec.))"),
    ("recovery", "Recovery"),
    ("inverse_recovery", "inverse Recovery (E.4)"),
    ("acc_top3", "Acc. top-3 (Fig. 9)"),
    ("acc_top5", "Acc. top-5 (Fig. 9)"),
    ("agent_found", "decoded agent = true agent"),
    ("goal_found", "decoded goal = true goal"),
    ("wall_acc_near", "walls right, 8 cells around the agent"),
    ("wall_acc_far", "walls right, the rest of the grid"),
)
"""The rows of the loop table, in order."""


def _null(entry: dict, null: str, part: str, metric: str) -> dict:
    """The ``part`` (``overall`` or ``excess``) of ``metric`` under ``null`` ({} when absent)."""
    block = ((entry.get("nulls") or {}).get(null) or {}).get(part) or {}
    return block.get(metric) or {}


def reading(name: str, entry: dict) -> str:
    """What the loop shows on one agent, from its numbers."""
    o = entry["overall"]

    def above(null: str, metric: str) -> str:
        e = _null(entry, null, "excess", metric)
        if e.get("value") is None:
            return "not available"
        verdict = "above" if e.get("above_baseline") else "not above"
        return f"{stat_text(e)} ({verdict})"

    ceiling = stat_text(((entry.get("nulls") or {}).get("prior") or {}).get("ceiling"))
    return (
        f"`{name}`: Acc. Dec. {stat_text(o.get('acc_dec'))} against Acc. GT "
        f"{stat_text(o.get('acc_gt'))}. Excess over another grid's map (the whole belief): "
        f"{above('other_grid', 'acc_dec')}; over the prior map (the walls alone, the agent "
        f"and goal being the same read-out): {above('prior', 'acc_dec')}, where the true walls "
        f"(same read-out) would gain {ceiling}. The decoded agent is "
        f"the true one in {stat_text(o.get('agent_found'))} of steps, the goal in "
        f"{stat_text(o.get('goal_found'))}. Walls beyond the prior: around the agent "
        f"{above('prior', 'wall_acc_near')}, elsewhere {above('prior', 'wall_acc_far')}. What "
        "the policy scores can see: the walls on the agent's shortest paths and where it puts "
        "the agent and the goal; what they cannot: walls away from those paths, which change "
        "no optimal action (read them in the wall rows)."
    )


def loop_table(name: str, key: str, entry: dict) -> list[Block]:
    """The loop rows of one agent's headline maps."""
    rows = [
        (
            label,
            stat_text(entry["overall"].get(metric)),
            *(
                stat_text(_null(entry, null, part, metric))
                for part in ("overall", "excess")
                for null in ("other_grid", "prior")
            ),
        )
        for metric, label in LOOP_METRICS
        if metric in entry["overall"]
    ]
    readout = entry.get("readout") or {}
    source = (
        f"cells: {readout.get('cells', 'cell probe')}, agent: "
        f"{readout.get('agent', 'cell probe')}, goal: {readout.get('goal', 'cell probe')}"
    )
    trained = entry.get("trained_on")
    where = (
        "every rollout step, decoded by the probing set's probes (no rollout grid was seen in "
        "training: all are held out)"
        if trained == "probing"
        else "the main store's test grids"
    )
    return [
        Text(reading(name, entry)),
        table(
            (
                "metric",
                "probe's maps",
                "another grid's map",
                "prior map",
                "excess over another grid",
                "excess over prior",
            ),
            rows,
            caption=f"`{name}`, maps {key} ({source}); {where}; {entry.get('n_steps')} steps "
            f"of {entry.get('n_grids')} grids, each grid weighted as the study's Fig. 4 "
            "(trajectory means averaged per grid). Nulls share the agent/goal read-out: the "
            "prior map keeps this step's agent and goal, so its excess isolates the walls. "
            "95% grid-bootstrap intervals.",
        ),
    ]


def loop(run: RunReader) -> list[Block]:
    """The loop tables of this run's agent and of the positive control (when it ran)."""
    blocks: list[Block] = []
    for reader in (run, RunReader(run.layout.control.root)):
        summary = reader.optional_json(reader.layout.belief)
        if summary is None:
            continue
        blocks += loop_table(agent_name(reader), *probe_entry(summary))
    return blocks
