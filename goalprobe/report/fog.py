"""Report section on fogged grids (the study's Appendix A): the agent against the free-space
planner and a random walk, the study's failure modes, and a reading derived from the numbers."""

from __future__ import annotations

from collections.abc import Mapping

from goalprobe.agents.bundled import is_bundled
from goalprobe.gridworld.fog import AGENT, FREE_SPACE, POLICIES, RANDOM_WALK
from goalprobe.report.blocks import Block, Figures, Text, num, stat_text, table
from goalprobe.report.run import RunReader

ROWS: tuple[tuple[str, str, bool], ...] = (
    ("success", "success rate", True),
    ("acc_oracle_fog", "Acc. Oracle under fog (free-space optimal on what was seen)", True),
    ("acc_gt", "Acc. GT (optimal on the true grid)", True),
    ("moves_over_shortest", "moves / L (successful episodes)", False),
    ("revisits_per_episode", "revisits per episode (backtracking)", False),
    ("into_known_walls_per_episode", "moves into known walls per episode", False),
    ("into_known_dead_ends_per_episode", "moves into known dead ends per episode", False),
)
"""``(key, label, shown as percent)`` of the table's rows."""

NAMES = {AGENT: "agent", FREE_SPACE: "free-space planner", RANDOM_WALK: "random walk"}


def reading(data: Mapping) -> str:
    """What the numbers say, derived from them."""
    table_ = data["policies"]
    agent = table_.get(AGENT, {})
    parts = [
        f"On {data['grids']} fogged grids (radius {data['radius']}), the agent reaches the goal "
        f"in {stat_text(agent.get('success'))} of its episodes, against "
        f"{stat_text(table_[FREE_SPACE]['success'])} for the free-space planner and "
        f"{stat_text(table_[RANDOM_WALK]['success'])} for a random walk with the same horizon."
    ]
    diff = table_.get("agent_minus_random_walk_acc_oracle_fog")
    if diff:
        verdict = "above" if diff["verdict"] == "yes" else "not distinguishable from (or below)"
        parts.append(
            "Its moves agree with the free-space planner on what it had seen "
            f"({stat_text(agent.get('acc_oracle_fog'))}) {verdict} a random walk's agreement "
            f"(difference {stat_text(diff)}, paired by grid)."
        )
    parts.append(
        f"Failure modes per episode: {stat_text(agent.get('revisits_per_episode'), percent=False)}"
        " revisits, "
        f"{stat_text(agent.get('into_known_walls_per_episode'), percent=False)} moves into known "
        f"walls, {stat_text(agent.get('into_known_dead_ends_per_episode'), percent=False)} moves "
        "into known dead ends."
    )
    cut = truncation_text(data)
    if cut:
        parts.append(cut)
    if data.get("invalid_steps"):
        parts.append(f"{data['invalid_steps']} steps gave no valid action (they move nothing).")
    unknown = data.get("unknown_prompt_pieces")
    if unknown:
        parts.append(
            "The agent's tokenizer has no token for "
            + ", ".join(f"'{p}'" for p in unknown[:12])
            + (" and more" if len(unknown) > 12 else "")
            + ": it reads every hidden cell and these words of the fog instructions as one "
            "unknown token."
        )
    if is_bundled(str(data.get("agent", ""))):
        parts.append(
            "The bundled agents were never trained on fog: this is what a policy trained on fully "
            "observable grids does with a partially drawn one, not a test of how well an agent "
            "can explore."
        )
    return " ".join(parts)


def truncation_text(data: Mapping, *, short: bool = False) -> str | None:
    """What the token limit cut off (``fog/results.json`` ``truncation``, schema 2): episodes
    left out of every score and never counted as the agent's failures. None for a version-1
    file or when nothing was cut."""
    cut = data.get("truncation")
    if not cut or not cut.get("truncated_episodes"):
        return None
    n, total = cut["truncated_episodes"], cut["episodes"]
    budget = cut.get("max_new_tokens")
    at = f" at {budget} tokens" if budget else ""
    if short:
        return f"{n} of {total} episodes truncated{at} (left out, not failures)"
    return (
        f"{n} of the agent's {total} episodes were cut off by the token limit{at} before an "
        "answer: they are left out of every number here (not counted as failures, since the "
        "budget ended them, not the agent); raise rollouts.max_new_tokens to score them."
    )


def map_reading(data: Mapping) -> str:
    """What the anchors hold under fog, derived from ``fog/map.json``."""
    probe = data["revealed_probe"]
    walls = data["hidden_walls"]
    best = probe["best_baseline"]
    points = probe.get("detectable")
    detects = "" if points is None else f" (this n could detect {num(100 * points, 1)} points)"
    hidden, shown = walls["hidden"], walls["revealed"]
    auc = walls.get("beyond_prior_detectable")
    where = "" if auc is None else f" (this n could detect {num(auc, 2)} AUC)"
    return (
        f"At the pre-reasoning anchors (layer {data['layer']}, {data['rows']} steps of "
        f"{data['grids']} fogged grids, {probe['test_grids']} held out), a per-cell read-out of "
        f"which cells are revealed scores {stat_text(probe['probe'])} against "
        f"{stat_text(probe[best])} for the stronger baseline ({best.replace('_', ' ')}): "
        + _verdict_text(_KNOWLEDGE, probe["verdict"], detects)
        + " The headline probe's walls find the true walls at hidden cells with ROC AUC "
        f"{num(hidden['decoded_auc'], 2)} (size-and-density prior {num(hidden['prior_auc'], 2)}; "
        f"difference {stat_text(hidden['difference'], percent=False)}) and at revealed cells "
        f"with {num(shown['decoded_auc'], 2)} (prior {num(shown['prior_auc'], 2)}): "
        + _verdict_text(_HIDDEN, walls["beyond_prior_at_hidden"], where)
    )


_KNOWLEDGE = {
    "yes": "the anchors hold the agent's knowledge beyond it.",
    "no": "no evidence that the anchors hold more of its knowledge than that baseline{n}.",
    "undecided": "undecided whether the anchors hold more of it{n}.",
}
"""The revealed-cells read-out's reading by verdict (``{n}``: what its n could detect)."""

_HIDDEN = {
    "yes": "at hidden cells the decoded map follows the true grid beyond the prior.",
    "no": "at hidden cells it carries nothing about the true grid beyond the prior that this n "
    "could see{n}, as a map of the agent's knowledge would.",
    "undecided": "undecided whether at hidden cells it carries anything about the true grid "
    "beyond the prior{n}; a map of the agent's knowledge would carry nothing there.",
}
"""The hidden-cell wall test's reading by verdict (``{n}``: what its n could detect)."""


def _verdict_text(readings: Mapping, verdict: str, detects: str) -> str:
    """``readings``' text for ``verdict`` (undecided for any other) with ``detects`` in it."""
    return readings.get(verdict, readings["undecided"]).format(n=detects)


def fog(run: RunReader, fig: Figures) -> list[Block]:
    """The policies side by side, the reading, and what the anchors hold under fog."""
    data = run.json(run.layout.fog_results)
    policies = [p for p in POLICIES if p in data["policies"]]
    rows = [
        (label, *(stat_text(data["policies"][p].get(key), percent=pct) for p in policies))
        for key, label, pct in ROWS
    ]
    rows.append(("episodes", *(str(data["policies"][p]["episodes"]) for p in policies)))
    cut = data.get("truncation")
    if cut is not None:
        rows.append(
            (
                "episodes cut off by the token limit (left out)",
                *(str(cut["truncated_episodes"]) if p == AGENT else "-" for p in policies),
            )
        )
    extra: list[Block] = []
    if run.layout.fog_map_results.is_file():
        extra.append(Text(map_reading(run.json(run.layout.fog_map_results))))
    return [
        Text(reading(data)),
        *extra,
        table(
            ("metric", *(NAMES[p] for p in policies)),
            rows,
            caption="Fogged grids: hidden cells drawn as '*', cells within the radius revealed "
            "along unblocked Bresenham lines and kept; the prompt carries the past moves. "
            "Acc. Oracle under fog scores each move against the free-space planner (shortest "
            "path on the revealed map, hidden cells open, replanned each step) on the knowledge "
            "of that step, known exactly. 95% grid-bootstrap intervals.",
        ),
    ]
