"""The headline table: one line per finding of the study, with its baseline.

``goalprobe demo`` prints it, the report shows it first, ``scripts/compare_headline.py`` checks
that a change of code leaves it identical on the same seed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from goalprobe.report.blocks import pct, stat_text
from goalprobe.report.run import MissingInput, RunReader, best_cell_run, metric


@dataclass(frozen=True)
class HeadlineRow:
    """One line of the headline table.

    Attributes:
        finding: what is measured, with the study's figure or table.
        value: the measured value (with its 95% CI where there is one).
        baseline: what it is compared with.
    """

    finding: str
    value: str
    baseline: str = ""


def headline_rows(run_dir: str | Path) -> list[HeadlineRow]:
    """The headline findings of a run (rows whose inputs are missing are left out)."""
    run = RunReader(run_dir)
    rows: list[HeadlineRow] = []

    def attempt(make: Callable[[], Iterable[HeadlineRow]]) -> None:
        try:
            rows.extend(make())
        except (MissingInput, KeyError, IndexError, TypeError, ValueError):
            return  # that stage did not produce the input; the report's section says why

    def behaviour():
        o = run.json(run.layout.behaviour_metrics)["overall"]
        return [
            HeadlineRow(
                "Per-action accuracy (Fig. 4)",
                stat_text(o["accuracy"]),
                f"random walk {pct(o['random_walk_accuracy']['value'])}, random action "
                f"{pct(o['random_action_accuracy']['value'])}",
            ),
            HeadlineRow(
                "Goal success rate (Fig. 12a)",
                stat_text(o["success_rate"]),
                f"random walk {pct(o['random_walk_success_rate']['value'])}",
            ),
        ]

    def iso():
        tests = [
            t
            for t in run.json(run.layout.iso_results)["tests"]
            if t["metric"] == "accuracy" and t.get("p_value") is not None
        ]
        significant = sum(t["p_value"] < 0.05 for t in tests)
        return [
            HeadlineRow(
                "Iso-difficulty transforms changing accuracy, p < 0.05 (Table 3)",
                f"{significant} of {len(tests)}",
                "study: 0 of 4",
            )
        ]

    def keys():
        v = run.json(run.layout.keys_results)["variants"]
        out = []
        if "key_door" in v:
            out.append(
                HeadlineRow(
                    "KeyDoor success / key pickup (Table 1)",
                    f"{pct(v['key_door']['success_rate'])} / "
                    f"{pct(v['key_door'].get('key_pickup_rate'))}",
                    "study: 100% / 100%",
                )
            )
        if "key_no_door" in v:
            out.append(
                HeadlineRow(
                    "KeyNoDoor: useless key picked up (Table 1)",
                    pct(v["key_no_door"].get("key_pickup_rate")),
                    "study: 17%",
                )
            )
        return out

    def probes():
        name, best = best_cell_run(run.cell_sweeps())
        m = best["metrics"]
        return [
            HeadlineRow(
                f"Cognitive map: best probe accuracy on grid cells ({name}; Fig. 6)",
                stat_text(metric(m, "probe", "accuracy_no_padding")),
                f"majority {stat_text(metric(m, 'majority', 'accuracy_no_padding'))}, shuffled "
                f"{stat_text(metric(m, 'shuffled', 'accuracy_no_padding'))}",
            ),
            HeadlineRow(
                "Agent / goal top-1 localisation (Fig. 7)",
                f"{stat_text(metric(m, 'probe', 'agent_top1'))} / "
                f"{stat_text(metric(m, 'probe', 'goal_top1'))}",
                f"shuffled {pct((metric(m, 'shuffled', 'agent_top1') or {}).get('value'))} / "
                f"{pct((metric(m, 'shuffled', 'goal_top1') or {}).get('value'))}",
            ),
        ]

    def distance():
        best = None
        for sweep in run.distance_sweeps().values():
            for r in sweep["runs"]:
                v = (metric(r["metrics"], "probe", "r2") or {}).get("value")
                if v is not None and (best is None or v > best[0]):
                    best = (v, r)
        if best is None:
            return []
        r = best[1]
        return [
            HeadlineRow(
                f"Goal distance R² ({r['name']}; Table 4)",
                stat_text(metric(r["metrics"], "probe", "r2"), percent=False),
                f"shuffled {stat_text(metric(r['metrics'], 'shuffled', 'r2'), percent=False)}",
            )
        ]

    def belief():
        b = run.json(run.layout.belief)
        entry = b["probes"][b.get("default_probe") or next(iter(b["probes"]))]["overall"]
        return [
            HeadlineRow(
                "Acc. GT / Acc. Dec. / Recovery (Table 2)",
                " / ".join(stat_text(entry.get(k)) for k in ("acc_gt", "acc_dec", "recovery")),
                f"chance {pct((entry.get('chance_acc_gt') or {}).get('value'))}",
            )
        ]

    def meg():
        o = run.json(run.layout.meg)["overall"]
        return [
            HeadlineRow(
                "MEG on the true grid, nats (MEG paper, Def. 3.2)",
                stat_text(o["true"]["meg"], percent=False),
                "uniform policy: 0",
            )
        ]

    def plans():
        runs = run.json(run.layout.plan_sweep)["runs"]
        best = max(
            (r for r in runs if r["kind"] == "decoder"),
            key=lambda r: r["metrics"]["prefix_accuracy"][0] or 0,
        )
        shuffled = [
            r["metrics"]["prefix_accuracy"][0]
            for r in runs
            if r["kind"] == "shuffled_control"
            and r["stage"] == best["stage"]
            and r["layer"] == best["layer"]
        ]
        acc = best["metrics"]["prefix_accuracy"]
        return [
            HeadlineRow(
                f"Plan decoder prefix accuracy N=1 / N=3 ({best['name']}; Fig. 10)",
                f"{pct(acc[0])} / {pct(acc[2])}",
                "0.25^N: 25.0% / 1.6%" + (f"; shuffled N=1 {pct(shuffled[0])}" if shuffled else ""),
            )
        ]

    def patching():
        summary = run.json(run.layout.patch_results).get("summary", [])
        out = []
        for r in summary:
            if r["kind"] == "disjoint" and r["mode"] == "teacher_forced" and r["layers"] == "all":
                out.append(
                    HeadlineRow(
                        f"Patching all layers at {r['site']} ({r['direction']}): action changed",
                        f"{pct(r['action_changed_rate'])} (n={r['n_runs']})",
                        "study: always changed",
                    )
                )
        return out[:2]

    for make in (behaviour, iso, keys, probes, distance, belief, meg, plans, patching):
        attempt(make)
    return rows
