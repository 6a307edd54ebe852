"""Report sections on behaviour: by grid size, density and goal distance (Fig. 4, Fig. 12), the
iso-difficulty transforms (Table 3, Fig. 14) and the key variants (Table 1)."""

from __future__ import annotations

from collections.abc import Callable

from goalprobe.report.blocks import Block, Figures, num, pct, records_table, stat_text, table
from goalprobe.report.run import RunReader
from goalprobe.viewer.figures.behaviour import (
    behaviour_by_distance_figure,
    behaviour_grid_figure,
    iso_accuracy_figure,
)


def behaviour(run: RunReader, fig: Figures) -> list[Block]:
    """Overall accuracy and success against the random walk; heatmaps; by distance; by size."""
    data = run.json(run.layout.behaviour_metrics)
    overall = data["overall"]
    summary = table(
        ("grids", "metric", "agent", "random walk", "random action at agent's states"),
        [
            (
                overall["n_grids"],
                label,
                stat_text(overall[key]),
                stat_text(overall[f"random_walk_{key}"]),
                stat_text(overall["random_action_accuracy"]) if key == "accuracy" else "",
            )
            for key, label in (
                ("accuracy", "per-action accuracy"),
                ("success_rate", "goal success rate"),
            )
        ],
        caption="All grids; 95% percentile-bootstrap intervals over grids.",
    )
    by_size = table(
        ("size", "grids", "accuracy", "success", "JSD", "ECE", "random-walk success"),
        [
            (
                f"{r['size']}×{r['size']}",
                r["n_grids"],
                stat_text(r["accuracy"]),
                stat_text(r["success_rate"]),
                stat_text(r["jsd"], percent=False),
                stat_text(r["ece"], percent=False),
                stat_text(r["random_walk_success_rate"]),
            )
            for r in data["by_size"]
        ],
        caption="By grid size (averaged over densities).",
    )
    return [
        summary,
        fig(behaviour_grid_figure(data["by_size_density"])),
        fig(behaviour_by_distance_figure(data["by_distance"])),
        by_size,
    ]


def iso(run: RunReader, fig: Figures) -> list[Block]:
    """Paired Wilcoxon tests per transform, and base against transformed accuracy."""
    tests = run.json(run.layout.iso_results)["tests"]
    rows = [
        {
            "transform": t["transform"],
            "metric": t["metric"],
            "pairs": t["n_pairs"],
            "base": num(t.get("base_mean")),
            "transformed": num(t.get("transformed_mean")),
            "difference [95% CI]": stat_text(t.get("difference"), percent=False),
            "W": num(t.get("statistic"), 1),
            "p": num(t.get("p_value")),
            "rank-biserial r": num(t.get("rank_biserial")),
            "smallest reachable p": num(t.get("min_p_value")),
            "verdict (±margin)": t.get("equivalence") or "–",
        }
        for t in tests
    ]
    tests_table = records_table(
        rows,
        caption="Paired differences per grid (transformed − base) with their 95% grid-bootstrap "
        "interval, and two-sided Wilcoxon signed-rank tests (zero differences dropped, so with "
        "few non-zero pairs no p-value below the 'smallest reachable p' can come out). The "
        "verdict reads the rates' paired interval against the equivalence margin: equivalent "
        "(inside ±margin), different (excludes 0), inconclusive (holds 0 and reaches a "
        "margin).",
    )
    return [tests_table, fig(iso_accuracy_figure(tests))]


def keys(run: RunReader, fig: Figures) -> list[Block]:
    """Table 1: success, accuracy, stage accuracy, pickup and attraction per key variant."""
    data = run.json(run.layout.keys_results)
    variants = data["variants"]
    names = list(variants)

    def cell(variant: str, getter: Callable[[dict], str]) -> str:
        try:
            return getter(variants[variant])
        except (KeyError, TypeError):
            return "N/A"

    metrics: list[tuple[str, Callable[[dict], str]]] = [
        ("trajectories", lambda v: str(v["n_trajectories"])),
        ("success rate", lambda v: pct(v["success_rate"])),
        ("accuracy [95% CI]", lambda v: stat_text(v["accuracy"])),
        ("stage accuracy: collecting key", lambda v: pct(v["stage_accuracy"]["to_key"])),
        ("stage accuracy: opening door", lambda v: pct(v["stage_accuracy"]["to_door"])),
        ("stage accuracy: reaching goal", lambda v: pct(v["stage_accuracy"]["to_goal"])),
        ("key pickup rate", lambda v: pct(v["key_pickup_rate"])),
        ("key attraction bias*", lambda v: pct(v["key_attraction_bias"])),
    ]
    rows = [(label, *(cell(n, get) for n in names)) for label, get in metrics]
    variants_table = table(
        ("metric", *names),
        rows,
        caption=f"Horizon T = {data['horizon']}. *Share of non-optimal actions (before the key "
        "is held) that move towards the key (Manhattan distance). Controls: key_door_control "
        "and two_path_no_key have the same layouts without the key.",
    )
    jaccard = table(
        ("two-path: Jaccard similarity of visited cells, with vs without key", "value"),
        [("mean [95% CI]", stat_text(data["two_path_jaccard"]))],
    )
    return [variants_table, jaccard]
