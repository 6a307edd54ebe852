"""The headline table: one line per finding of the study, with its baseline.

The report shows it first, ``goalprobe demo`` ends with its verdicts (one line each,
:mod:`goalprobe.report.summary`), ``docs/results.md`` carries it (``scripts/readme_assets.py``),
and ``scripts/compare_headline.py`` checks that a change of code leaves it identical on the same
seed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from goalprobe.report.blocks import pct, stat_text
from goalprobe.report.causal_rows import HeadlineRow, patching_rows, plan_rows
from goalprobe.report.fog import truncation_text as fog_truncation_text
from goalprobe.report.run import MissingInput, RunReader, metric
from goalprobe.report.verdict_rows import (
    above,
    harm_score_row,
    intention_row,
    iso_row,
    meg_row,
    p_above,
    p_below,
    seed_probe_row,
    yes_no,
)
from goalprobe.stages import HEADLINE_PROBE, HEADLINE_STAGE, headline_layer, headline_run
from goalprobe.stats import holm


def selectivity_verdict(
    metrics: Mapping, name: str, what: str = "probe"
) -> tuple[str, str, float | None]:
    """``(baseline text, verdict, p)`` of a probe metric against its strongest control (the
    sweep's paired-bootstrap selectivity)."""
    sel = metrics.get("selectivity", {}).get(name)
    if not sel:
        return "", "", None
    strongest = sel["baseline"]
    base = stat_text(metric(metrics, strongest, name), percent=name != "r2")
    return (
        f"strongest control {strongest} {base}",
        f"{what} above {strongest}: {yes_no(sel['above_baseline'])}",
        p_above(sel, 0.0),
    )


def headline_rows(run_dir: str | Path) -> list[HeadlineRow]:
    """The headline findings of a run (rows whose inputs are missing are left out).

    Representational rows use the probing set (hundreds of grids, prompt-only states) at the
    headline stage, layer and probe fixed in advance (:mod:`goalprobe.stages`); every row with
    an interval says whether it excludes its baseline (the strongest control for probes).
    """
    run = RunReader(run_dir)
    rows: list[HeadlineRow] = []

    def attempt(make: Callable[[], Iterable[HeadlineRow]]) -> None:
        try:
            rows.extend(make())
        except (MissingInput, KeyError, IndexError, TypeError, ValueError, StopIteration):
            return  # that stage did not produce the input; the report's section says why

    def behaviour():
        o = run.json(run.layout.behaviour_metrics)["overall"]
        walk = o["random_walk_accuracy"]["value"]
        walk_success = o["random_walk_success_rate"]["value"]
        return [
            HeadlineRow(
                "Per-action accuracy (Fig. 4)",
                stat_text(o["accuracy"]),
                f"random walk {pct(walk)}, random action "
                f"{pct(o['random_action_accuracy']['value'])}",
                f"above random walk: {yes_no(above(o['accuracy'], walk))}",
                p_above(o["accuracy"], walk),
            ),
            HeadlineRow(
                "Goal success rate (Fig. 12a)",
                stat_text(o["success_rate"]),
                f"random walk {pct(walk_success)}",
                f"above random walk: {yes_no(above(o['success_rate'], walk_success))}",
                p_above(o["success_rate"], walk_success),
            ),
        ]

    def iso():
        return [HeadlineRow(*iso_row(run.json(run.layout.iso_results)))]

    def keys():
        v = run.json(run.layout.keys_results)["variants"]
        out = []
        if "key_door" in v:
            kd = v["key_door"]
            out.append(
                HeadlineRow(
                    f"KeyDoor success / key pickup (Table 1; n={kd['n_trajectories']}, T=30)",
                    f"{stat_text(kd['success_ci']) if 'success_ci' in kd else pct(kd['success_rate'])}"
                    f" / {stat_text(kd['key_pickup_ci']) if 'key_pickup_ci' in kd else pct(kd.get('key_pickup_rate'))}",
                    "study: 100% / 100%",
                )
            )
        if "key_no_door" in v:
            knd = v["key_no_door"]
            out.append(
                HeadlineRow(
                    f"KeyNoDoor: useless key picked up (Table 1; n={knd['n_trajectories']})",
                    stat_text(knd["key_pickup_ci"])
                    if "key_pickup_ci" in knd
                    else pct(knd.get("key_pickup_rate")),
                    "study: 17%",
                )
            )
        return out

    def probes():
        name, sweep = headline_sweep(run.layout.probing_probe_sweeps())
        head = headline_run(sweep)
        m, where = head["metrics"], f"{head['name']}, {head['n_test_grids']} test grids"
        seeds = run.optional_json(run.layout.probing_headline_seeds)
        rows_out = []
        for label, key in (
            ("Cognitive map: probe accuracy on grid cells", "accuracy_no_padding"),
            ("Cognitive map: wall AUC (rank-based, class-balance free)", "auc/wall"),
            ("Agent localisation, top-1", "agent_top1"),
            ("Goal localisation, top-1", "goal_top1"),
        ):
            if seeds and key in seeds.get("pooled", {}):
                row, p = seed_probe_row(label, key, seeds, f"probing set, {where}")
                rows_out.append(HeadlineRow(*row, p))
                continue
            baseline, verdict, p = selectivity_verdict(m, key)
            rows_out.append(
                HeadlineRow(
                    f"{label} (probing set, {where}; Figs. 6-7)",
                    stat_text(metric(m, "probe", key)),
                    baseline,
                    verdict,
                    p,
                )
            )
        return rows_out

    def positions():
        pos = run.json(run.layout.probing_positions)
        out = []
        for target in ("agent", "goal"):
            result = pos[target]
            sel = result["selectivity"]["top1"]
            base = result["models"][sel["baseline"]]["top1"]
            unconverged = [m for m, ok in result.get("converged", {}).items() if not ok]
            note = f" (solver did not converge: {', '.join(unconverged)})" if unconverged else ""
            out.append(
                HeadlineRow(
                    f"{target.capitalize()} position probe, top-1 (probing set, "
                    f"{pos['stage']} L{pos['layer']}, {result['n_grids']} test grids; Fig. 7)",
                    stat_text(result["models"]["probe"]["top1"]),
                    f"strongest control {sel['baseline']} {stat_text(base)}",
                    f"probe above {sel['baseline']}: {yes_no(sel['above_baseline'])}{note}",
                    p_above(sel, 0.0),
                )
            )
        return out

    def distance():
        sweeps = [run.json(p) for p in sorted(run.layout.probing_distance.glob("distance_*.json"))]
        out = []
        for sweep in sweeps:
            head = headline_run(sweep)
            baseline, verdict, p = selectivity_verdict(head["metrics"], "r2", "regressor")
            out.append(
                HeadlineRow(
                    f"Goal distance R² ({head['name']}, probing set; Table 4)",
                    stat_text(metric(head["metrics"], "probe", "r2"), percent=False),
                    baseline,
                    verdict,
                    p,
                )
            )
        return out

    def belief():
        b = run.json(run.layout.belief)
        key = b.get("default_probe") or next(iter(b["probes"]))
        entry = b["probes"][key]
        o = entry["overall"]
        excess = entry.get("excess", {})
        out = [
            HeadlineRow(
                f"Acc. GT / Acc. Dec. / Recovery (Table 2; maps of {key})",
                " / ".join(stat_text(o.get(k)) for k in ("acc_gt", "acc_dec", "recovery")),
                f"chance {pct((o.get('chance_acc_gt') or {}).get('value'))}",
            )
        ]
        nulls = entry.get("nulls") or {}
        for null, label in (
            ("other_grid", "another grid's map (the whole belief)"),
            ("prior", "the prior map (the walls; same agent/goal read-out)"),
        ):
            e = ((nulls.get(null) or {}).get("excess") or {}).get("acc_dec")
            if e:
                out.append(
                    HeadlineRow(
                        f"Acc. Dec. minus {label}",
                        stat_text(e, percent=True),
                        f"null: {null} maps",
                        f"above the null: {yes_no(e['above_baseline'])}",
                    )
                )
        for k, label in (("acc_dec", "Acc. Dec."), ("recovery", "Recovery")):
            if k in excess:
                e = excess[k]
                out.append(
                    HeadlineRow(
                        f"{label} minus its null (uninformative maps)",
                        stat_text(e, percent=True),
                        f"null: {e['baseline']} maps",
                        f"above the null: {yes_no(e['above_baseline'])}",
                        p_above(e, 0.0),
                    )
                )
        return out

    def meg():
        overall = run.json(run.layout.meg)["overall"]
        null = overall.get("vs_random_walk")
        p = p_above(null["difference"]["meg"], 0.0) if null else None
        return [HeadlineRow(*meg_row(overall), p)]

    def plans():
        runs = run.json(run.layout.plan_sweep)["runs"]
        decoders = [r for r in runs if r["kind"] == "decoder" and r["stage"] == HEADLINE_STAGE]
        layer = headline_layer({r["layer"] for r in decoders})
        head = min((r for r in decoders if r["layer"] == layer), key=lambda r: r["decoder_layers"])
        return plan_rows(head)

    def patching():
        return patching_rows(run.json(run.layout.patch_results))

    def false_belief():
        fb = run.json(run.layout.false_belief_results)["behaviour"]["all"]
        diff = fb["difference"]["follows_shown"]
        control = fb["control"]["follows_shown"]
        return [
            HeadlineRow(
                f"False-belief grids: first action optimal only on the drawn grid, minus "
                f"control (n={diff['n_pairs']} pairs)",
                stat_text(diff),
                f"0 (control pairs {stat_text(control)})",
                f"acts on what it is shown: {yes_no(above(diff, 0.0))}",
                p_above(diff, 0.0),
            )
        ]

    def harm():
        h = run.json(run.layout.harm_results)
        neutral = h["conditions"]["neutral"]
        score = neutral["behaviour_score"]
        scaled = {k: None if score[k] is None else score[k] / 100 for k in score if k != "n"}
        below_random = None if score["ci_high"] is None else bool(score["ci_high"] < 100.0)
        effect = h["difference"]["harms"]
        fewer = None if effect["ci_high"] is None else bool(effect["ci_high"] < 0.0)
        n = f"{neutral['n_grids']} grids"
        versus = (h.get("versus_oracles") or {}).get("neutral - oracle_harm_blind")
        p = p_below(versus["harms"], 0.0) if versus else p_below(score, 100.0)
        score_row = HeadlineRow(*harm_score_row(h, scaled, below_random), p)
        return [
            score_row,
            HeadlineRow(
                f"Moral conditioning: harms per episode, moral minus neutral ({n})",
                stat_text(effect, percent=False),
                "0",
                f"conditioning reduces harm: {yes_no(fewer)}",
                p_below(effect, 0.0),
            ),
        ]

    def intention():
        results = run.json(run.layout.intention_results)
        control = {(r["variant"], r["intervention"]): r for r in results["optimal_control"]}
        out = []
        for r in results["agent"]:
            if (r["variant"], r["intervention"]) != ("key_door", "has_key"):
                continue
            c = control.get((r["variant"], r["intervention"]))
            if r.get("adaptation"):
                p = p_above(r["adaptation"]["fraction"], 0.0)
                out.append(HeadlineRow(*intention_row(results, r), p))
                continue
            out.append(
                HeadlineRow(
                    f"Holding the key intended in KeyDoor (Definition 20): excess TV "
                    f"({r['n_grids']} grids, p={r['p_value']:.3g})",
                    stat_text(r["excess_tv"], percent=False),
                    "0; optimal policy "
                    + ("–" if c is None else stat_text(c["excess_tv"], percent=False)),
                    f"intended: {r['verdict']}",
                )
            )
        return out

    def fog():
        data = run.json(run.layout.fog_results)
        pol = data["policies"]
        agent, walk = pol["agent"], pol["random_walk"]
        diff = pol.get("agent_minus_random_walk_acc_oracle_fog")
        low = None if not diff else diff.get("ci_low")
        cut = fog_truncation_text(data, short=True)
        return [
            HeadlineRow(
                f"Fogged grids: moves free-space optimal on what was seen ({data['grids']} "
                f"grids, radius {data['radius']}; App. A)",
                stat_text(agent["acc_oracle_fog"]),
                f"random walk {stat_text(walk['acc_oracle_fog'])}; success "
                f"{pct(agent['success']['value'])} (free-space planner "
                f"{pct(pol['free_space']['success']['value'])})" + (f"; {cut}" if cut else ""),
                f"above random walk: {yes_no(None if low is None else low > 0)}",
            )
        ]

    for make in (
        behaviour, iso, keys, probes, positions, distance, belief, meg, plans, patching,
        false_belief, harm, intention, fog,
    ):  # fmt: skip
        attempt(make)
    return with_holm(rows)


HOLM_FAMILY = (
    "the agent's headline verdicts that carry a test (each row with a p-value: behaviour, "
    "probes against their strongest control, belief, MEG, the plan decoder against its "
    "strongest baseline, patching at the anchors against a random grid, false belief, harm, "
    "intention)"
)
"""The family Holm's correction runs over, per agent (named in the report)."""


def with_holm(rows: list[HeadlineRow], alpha: float = 0.05) -> list[HeadlineRow]:
    """``rows`` with the Holm-adjusted p-value appended to every tested verdict: whether the
    verdict still holds when the family of :data:`HOLM_FAMILY` is corrected together."""
    adjusted = holm([r.p_value for r in rows])
    m = sum(a is not None for a in adjusted)
    return [
        r
        if a is None
        else replace(
            r,
            verdict=f"{r.verdict}; Holm p {a:.2g} of {m} "
            f"({'holds' if a < alpha else 'not significant'} after correction)",
        )
        for r, a in zip(rows, adjusted, strict=True)
    ]


def headline_sweep(paths) -> tuple[str, dict]:
    """The sweep of the headline probe kind and family among ``paths`` (by file stem
    ``cell_<kind>_<family>``): ``(stem, sweep)``."""
    kind, family = HEADLINE_PROBE
    wanted = f"cell_{kind}_{family}"
    for path in paths:
        if Path(path).stem == wanted:
            return wanted, json.loads(Path(path).read_text())
    raise MissingInput(f"no {wanted}.json among the probing-set sweeps")
