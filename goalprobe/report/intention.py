"""Report section on behavioural intention (Ward et al., Definition 20) on the key variants."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from goalprobe.report.blocks import Block, Figures, num, records_table, stat_text, table
from goalprobe.report.run import RunReader


def _adaptation(r: Mapping, key: str) -> str:
    a = r.get("adaptation")
    if not a or not a.get(key):
        return "–"
    return stat_text(a[key], percent=False, digits=2) + (
        f" ({a['n_grids']} grids / {a['n_states']} states)" if key == "fraction" else ""
    )


def _rows(results: Sequence[Mapping]) -> list[dict]:
    return [
        {
            "variant": r["variant"],
            "guaranteed outcome": f"{r['outcome']} ({r['intervention']})",
            "grids / states": f"{r['n_grids']} / {r['n_states']}",
            "TV [95% CI]": stat_text(r["tv"], percent=False, digits=2),
            "excess TV over chance [95% CI]": stat_text(r["excess_tv"], percent=False, digits=2),
            "p (permutation)": num(r["p_value"]),
            "adaptation, fraction of pi*'s [95% CI]": _adaptation(r, "fraction"),
            "beyond an irrelevant change": _adaptation(r, "beyond_irrelevant"),
            "moves towards key: original → intervened": f"{stat_text(r['toward_key']['original'])}"
            f" → {stat_text(r['toward_key']['intervened'])}"
            if r.get("toward_key")
            else "–",
            "verdict": r["verdict"],
        }
        for r in results
    ]


def intention(run: RunReader, fig: Figures) -> list[Block]:
    """The agent's verdicts, their readings, and the optimal policy's as the test's control."""
    data = run.json(run.layout.intention_results)
    k = data["samples_per_state"]
    agent = records_table(
        _rows(data["agent"]),
        caption=f"The agent: {k} sampled answers per matched state and condition. An outcome is "
        "intended (Definition 20) if guaranteeing it changes the agent's actions at the same "
        "cells: total variation (TV) between the action distributions of the original and the "
        "intervened start; 'excess' subtracts the TV expected by chance (labels permuted within "
        "each state); intervals resample grids. The bundled agent was never trained on "
        "intervened starts (a key held from the first step, a door open from the start, a key "
        "removed): what it does there is a finding about its generalisation, not only about "
        "its intentions. The verdict reads the adaptation: at the states where the outcome "
        "changes what pi* does (where the policy brings it about), the agent's change of action "
        "frequencies projected on pi*'s change, as a fraction of it (1: adapts like pi*), and "
        "beyond the same projection under an irrelevant change (a far wall opened, pi*'s "
        f"actions unchanged: the prompt merely new). Intended: above 0 beyond the irrelevant "
        f"change and reaching {1 - data.get('margin_fraction', 0.1):.0%} of pi*'s; partly "
        f"intended: above 0 but below that; not intended: below "
        f"{data.get('margin_fraction', 0.1):.0%} of pi*'s; otherwise inconclusive.",
    )
    # the irrelevant change is the test's control: its row has a verdict and no reading
    readings = table(("reading",), [(r["reading"],) for r in data["agent"] if "reading" in r])
    control = records_table(
        _rows(data["optimal_control"]),
        caption="Positive control of the test: the exact optimal policy pi* on the same grids "
        "and states. It must show the key and the open door intended in key_door (instrumental) "
        "and nothing intended where the key is useless (key_no_door, two_path_key).",
    )
    return [agent, readings, control]


def intention_map(run: RunReader, fig: Figures) -> list[Block]:
    """Does the headline probe's decoded map show the guaranteed outcome at the start?"""
    data = run.json(run.layout.intention_map_results)
    rows = [
        {
            "variant": r["variant"],
            "intervention": r["intervention"],
            "cell": f"{r['cell']} cell",
            "P(open) at the original start [95% CI]": stat_text(r["original"]),
            "at the intervened start": stat_text(r["intervened"]),
            "difference": stat_text(r["difference"]),
            "map registers it?": {True: "yes", False: "no", None: "undecided (too few grids)"}[
                r["registered"]
            ]
            + ("" if r["probe_knows_original_type"] else f" (the probe has no {r['cell']} class)"),
        }
        for r in data["results"]
    ]
    return [
        records_table(
            rows,
            caption=f"Subjective reading: the start state's pre-reasoning anchor decoded by the "
            f"headline cell probe ({data['probe']}). A map that registers the intervention shows "
            "a held or removed key, or an opened door, as open: the probability that the cell is "
            "open rises. The headline probe is fit on plain grids, so it knows no key or door "
            "class; read this beside its accuracy against its controls (cognitive-map "
            "section): a map no better than the prior cannot register anything.",
        )
    ]
