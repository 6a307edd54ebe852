"""``RUN/report.html``: the study's figures and tables from one run directory, in one file.

The page is self-contained: plotly.js is inlined once in the head and every figure is a
``<div>`` drawn by it, so the file opens offline in any browser. Sections follow the study
(../shared/papers/002, sections 4-5 and appendices C-F):

=====================  =====================================================================
section                answers
=====================  =====================================================================
behaviour              Fig. 4 (accuracy and JSD vs goal distance; by size x density), Fig. 12
iso-difficulty         Table 3 / Fig. 14 (paired Wilcoxon, rank-biserial effect sizes)
key variants           Table 1 (success, accuracy, stage accuracy, pickup, attraction, Jaccard)
cognitive map          Figs. 6, 8, 15 (probe accuracy by family, stage and layer; per class)
localisation           Fig. 7 (agent and goal top-1, Manhattan distance, by grid size)
goal distance          Table 4 (MAE, R2 by family, stage and layer)
policy vs belief       Table 2, Fig. 9 (Acc GT, Acc Dec, Agreement, Recovery, top-k), MEG
plan decoder           Fig. 10, Table 5 (prefix accuracy vs N, length analysis)
patching               section 5.2, appendix F (action changed per site x layers; controls)
=====================  =====================================================================

Every section states the configuration that produced it (the stage record's resolved config)
and its baselines (majority class, shuffled labels, ``0.25^N``, random walk, chance) with 95%
confidence intervals. A section whose inputs are missing, or whose stage failed, shows a
"not run" / "failed: reason" box instead; writing the report never fails on missing data.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECTION_TITLES: dict[str, str] = {
    "run": "Run and configuration",
    "headline": "Headline results",
    "behaviour": "Behaviour by grid size, density and goal distance (Fig. 4, Fig. 12)",
    "iso": "Iso-difficulty transforms (Table 3, Fig. 14)",
    "keys": "Instrumental and implicit goals: key variants (Table 1)",
    "probes": "Cognitive-map probes (Figs. 6, 8, 15)",
    "localisation": "Agent and goal localisation (Fig. 7)",
    "distance": "Goal-distance regressors (Table 4)",
    "belief": "Policy against decoded belief (Table 2, Fig. 9) and MEG",
    "plans": "One-shot plan decoder (Fig. 10, Table 5)",
    "patching": "Activation patching (section 5.2, appendix F)",
}
"""Section id -> heading, in page order (tests look for these headings)."""

STAGE_OF_SECTION: dict[str, str] = {
    "behaviour": "behaviour",
    "iso": "iso",
    "keys": "keys",
    "probes": "probes",
    "localisation": "probes",
    "distance": "distance",
    "belief": "scoring",
    "plans": "plans",
    "patching": "patching",
}
"""The pipeline stage behind each data section (for its config and failure record)."""


class MissingInput(Exception):
    """A section's input is absent; the message says which file and why."""


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


# ---------------------------------------------------------------------------------------------
# Reading the run
# ---------------------------------------------------------------------------------------------


class _Run:
    """Cached JSON reads of a run directory; missing files raise :class:`MissingInput`."""

    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir)
        self._cache: dict[str, Any] = {}

    def json(self, relative: str) -> Any:
        if relative not in self._cache:
            path = self.root / relative
            if not path.is_file():
                raise MissingInput(f"{relative} not found")
            try:
                self._cache[relative] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as err:
                raise MissingInput(f"{relative} is unreadable: {err}") from err
        return self._cache[relative]

    def glob(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern))

    def stage_record(self, stage: str) -> dict | None:
        try:
            return self.json(f"stages/{stage}.json")
        except MissingInput:
            return None

    def stage_failure(self, stage: str) -> str | None:
        try:
            return self.json(f"stages/{stage}.failed.json").get("error")
        except MissingInput:
            return None


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def _num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{100 * value:.1f}%"


def stat_text(stat: Mapping | None, *, percent: bool = True, digits: int = 3) -> str:
    """``"45.2% [40.1%, 50.3%]"`` of a ``{value, ci_low, ci_high}`` dict ('–' when absent)."""
    if not stat or stat.get("value") is None:
        return "–"
    fmt: Callable[[Any], str] = _pct if percent else (lambda v: _num(v, digits))
    text = fmt(stat["value"])
    if stat.get("ci_low") is not None and stat.get("ci_high") is not None:
        text += f" [{fmt(stat['ci_low'])}, {fmt(stat['ci_high'])}]"
    return text


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _Figures:
    """Turns plotly figures into ``<div>``s that share the page's single plotly.js."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, fig) -> str:
        self.count += 1
        return fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=f"figure-{self.count}",
            config={"displaylogo": False, "responsive": True},
        )


def _config_block(run: _Run, stage: str) -> str:
    record = run.stage_record(stage)
    if record is None:
        return ""
    params = record.get("config", {}).get("params", record.get("config", {}))
    rows = [(k, json.dumps(v)) for k, v in params.items()]
    when = record.get("finished_at", "?")
    return (
        f"<details class='config'><summary>Configuration of stage <code>{stage}</code> "
        f"(finished {html.escape(when)}, {record.get('seconds', 0):.1f} s)</summary>"
        + _table(("field", "value"), rows)
        + "</details>"
    )


def _box(kind: str, message: str) -> str:
    return f"<div class='box {kind}'><strong>{kind.replace('_', ' ')}</strong>: {html.escape(message)}</div>"


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


def _behaviour(run: _Run, fig: _Figures) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    data = run.json("behaviour/metrics.json")
    cells = data["by_size_density"]
    sizes = sorted({c["size"] for c in cells})
    densities = sorted({c["density"] for c in cells})
    panels = (
        ("accuracy", "per-action accuracy"),
        ("success_rate", "goal success rate"),
        ("jsd", "JSD from π*"),
        ("entropy", "policy entropy"),
    )
    heat = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for _, t in panels])
    for i, (metric, title) in enumerate(panels, start=1):
        z = [
            [
                next(
                    (c[metric]["value"] for c in cells if c["size"] == s and c["density"] == d),
                    None,
                )
                for d in densities
            ]
            for s in sizes
        ]
        heat.add_trace(
            go.Heatmap(
                z=z,
                x=[f"d={d:g}" for d in densities],
                y=[f"{s}×{s}" for s in sizes],
                colorscale="Viridis",
                showscale=False,
                texttemplate="%{z:.2f}",
                hovertemplate=f"{title}<br>%{{y}}, %{{x}}: %{{z:.3f}}<extra></extra>",
            ),
            row=1,
            col=i,
        )
    heat.update_layout(
        title="Behaviour by grid size (rows) and obstacle density (columns); mean over grids",
        template="plotly_white",
        height=360,
    )
    dist = data["by_distance"]
    line = make_subplots(rows=1, cols=2, subplot_titles=("per-action accuracy", "JSD from π*"))
    for col, metric in enumerate(("accuracy", "jsd"), start=1):
        xs = [r["distance"] for r in dist if r[metric]["value"] is not None]
        ys = [r[metric]["value"] for r in dist if r[metric]["value"] is not None]
        hi = [
            (r[metric]["ci_high"] - r[metric]["value"]) if r[metric]["ci_high"] is not None else 0
            for r in dist
            if r[metric]["value"] is not None
        ]
        lo = [
            (r[metric]["value"] - r[metric]["ci_low"]) if r[metric]["ci_low"] is not None else 0
            for r in dist
            if r[metric]["value"] is not None
        ]
        line.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                name=metric,
                error_y={"type": "data", "array": hi, "arrayminus": lo},
            ),
            row=1,
            col=col,
        )
        line.update_xaxes(title_text="distance to goal (steps)", row=1, col=col)
    line.update_layout(
        title="Fig. 4 (top): against the agent's distance to the goal (95% CI over grids)",
        template="plotly_white",
        height=360,
        showlegend=False,
    )
    overall = data["overall"]
    table = _table(
        ("grids", "metric", "agent", "random walk", "random action at agent's states"),
        [
            (
                overall["n_grids"],
                "per-action accuracy",
                stat_text(overall["accuracy"]),
                stat_text(overall["random_walk_accuracy"]),
                stat_text(overall["random_action_accuracy"]),
            ),
            (
                overall["n_grids"],
                "goal success rate",
                stat_text(overall["success_rate"]),
                stat_text(overall["random_walk_success_rate"]),
                "",
            ),
        ],
        caption="All grids; 95% percentile-bootstrap intervals over grids.",
    )
    by_size = _table(
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
    return table + fig(heat) + fig(line) + by_size


def _iso(run: _Run, fig: _Figures) -> str:
    import plotly.graph_objects as go

    data = run.json("iso/results.json")
    tests = data["tests"]
    rows = [
        (
            t["transform"],
            t["metric"],
            t["n_pairs"],
            _num(t.get("base_mean")),
            _num(t.get("transformed_mean")),
            stat_text(t.get("difference"), percent=False),
            _num(t.get("statistic"), 1),
            _num(t.get("p_value")),
            _num(t.get("rank_biserial")),
        )
        for t in tests
    ]
    table = _table(
        (
            "transform",
            "metric",
            "pairs",
            "base",
            "transformed",
            "difference [95% CI]",
            "W",
            "p",
            "rank-biserial r",
        ),
        rows,
        caption="Paired two-sided Wilcoxon signed-rank tests per grid (transformed − base); "
        "zero differences dropped (Wilcoxon's method).",
    )
    acc = [t for t in tests if t["metric"] == "accuracy" and t.get("base_mean") is not None]
    bars = go.Figure(
        [
            go.Bar(name="base", x=[t["transform"] for t in acc], y=[t["base_mean"] for t in acc]),
            go.Bar(
                name="transformed",
                x=[t["transform"] for t in acc],
                y=[t["transformed_mean"] for t in acc],
            ),
        ]
    )
    bars.update_layout(
        title="Fig. 14: mean per-action accuracy on base and transformed grids",
        barmode="group",
        template="plotly_white",
        height=340,
        yaxis={"title": "accuracy", "range": [0, 1.02]},
    )
    return table + fig(bars)


def _keys(run: _Run, fig: _Figures) -> str:
    data = run.json("keys/results.json")
    variants = data["variants"]
    names = list(variants)

    def cell(variant: str, getter: Callable[[dict], str]) -> str:
        try:
            return getter(variants[variant])
        except (KeyError, TypeError):
            return "N/A"

    metrics: list[tuple[str, Callable[[dict], str]]] = [
        ("trajectories", lambda v: str(v["n_trajectories"])),
        ("success rate", lambda v: _pct(v["success_rate"])),
        ("accuracy [95% CI]", lambda v: stat_text(v["accuracy"])),
        ("stage accuracy: collecting key", lambda v: _pct(v["stage_accuracy"]["to_key"])),
        ("stage accuracy: opening door", lambda v: _pct(v["stage_accuracy"]["to_door"])),
        ("stage accuracy: reaching goal", lambda v: _pct(v["stage_accuracy"]["to_goal"])),
        ("key pickup rate", lambda v: _pct(v["key_pickup_rate"])),
        ("key attraction bias*", lambda v: _pct(v["key_attraction_bias"])),
    ]
    rows = [(label, *(cell(n, get) for n in names)) for label, get in metrics]
    table = _table(
        ("metric", *names),
        rows,
        caption=f"Horizon T = {data['horizon']}. *Share of non-optimal actions (before the key "
        "is held) that move towards the key (Manhattan distance). Controls: key_door_control "
        "and two_path_no_key have the same layouts without the key.",
    )
    jac = _table(
        ("two-path: Jaccard similarity of visited cells, with vs without key", "value"),
        [("mean [95% CI]", stat_text(data["two_path_jaccard"]))],
    )
    return table + jac


def _cell_sweeps(run: _Run) -> dict[str, dict]:
    sweeps = {p.stem: json.loads(p.read_text()) for p in run.glob("probes/sweeps/cell_*.json")}
    if not sweeps:
        raise MissingInput("probes/sweeps/cell_*.json not found")
    return sweeps


def _m(run_metrics: dict, model: str, metric: str) -> dict | None:
    return run_metrics.get("models", {}).get(model, {}).get(metric)


def _probes(run: _Run, fig: _Figures) -> str:
    import plotly.graph_objects as go

    from viewer.figures import probe_comparison_figure

    sweeps = _cell_sweeps(run)
    metric = "accuracy_no_padding"
    bars, rows, majority = [], [], []
    for name, sweep in sweeps.items():
        label = name.removeprefix("cell_").replace("_", " ")
        for r in sweep["runs"]:
            x = f"{r['stage'].split('_')[0]} L{r['layer']}"
            stat = _m(r["metrics"], "probe", metric) or {}
            bars.append({"name": x, "group": label, **stat})
            maj = _m(r["metrics"], "majority", metric)
            if maj and maj.get("value") is not None:
                majority.append(maj["value"])
            diff = r["metrics"].get("differences", {}).get("probe - shuffled", {}).get(metric)
            rows.append(
                (
                    label,
                    r["stage"],
                    r["layer"],
                    r["n_test"],
                    stat_text(stat),
                    stat_text(_m(r["metrics"], "probe", "balanced_accuracy")),
                    stat_text(_m(r["metrics"], "majority", metric)),
                    stat_text(_m(r["metrics"], "shuffled", metric)),
                    stat_text(diff),
                )
            )
        for r in sweep["runs"][:1]:
            shuffled = _m(r["metrics"], "shuffled", metric)
            if shuffled and shuffled.get("value") is not None:
                bars.append(
                    {
                        "name": f"{r['stage'].split('_')[0]} L{r['layer']}",
                        "group": f"{label} (shuffled labels)",
                        **shuffled,
                    }
                )
    comparison = probe_comparison_figure(
        bars,
        y_title="accuracy on grid cells (test grids)",
        baseline=max(majority) if majority else None,
        baseline_label="majority class",
        title="Cell-type probe accuracy by family, stage and layer (95% grid-bootstrap CI)",
    )
    table = _table(
        (
            "probe",
            "stage",
            "layer",
            "test rows",
            "accuracy (grid cells)",
            "balanced accuracy",
            "majority class",
            "shuffled labels",
            "selectivity (probe − shuffled)",
        ),
        rows,
        caption="Test grids only (split by grid, never by row); padding cells excluded.",
    )
    best_name, best = _best_cell_run(sweeps)
    by_size = best["metrics"].get("by_grid_size", {})
    classes = [
        k.split("/", 1)[1]
        for k in (_first(by_size).get("models", {}).get("probe", {}) if by_size else {})
        if k.startswith("recall/") and k != "recall/padding"
    ]
    per_class = go.Figure()
    for kind in ("recall", "precision"):
        for cls in classes:
            per_class.add_trace(
                go.Bar(
                    name=f"{kind} {cls}",
                    x=[f"{s}×{s}" for s in by_size],
                    y=[
                        (by_size[s]["models"]["probe"].get(f"{kind}/{cls}") or {}).get("value")
                        for s in by_size
                    ],
                    visible=True if kind == "recall" else "legendonly",
                )
            )
    per_class.update_layout(
        title=f"Fig. 6 (centre): per-class recall and precision by grid size — {best_name}",
        barmode="group",
        template="plotly_white",
        height=360,
        yaxis={"range": [0, 1.02]},
    )
    stages = []
    for name, sweep in sweeps.items():
        for comp in sweep.get("stage_comparisons", []):
            for key, diff in comp["metrics"].get("differences", {}).items():
                stages.append(
                    (name.removeprefix("cell_"), comp["layer"], key, stat_text(diff.get(metric)))
                )
    stage_table = _table(
        ("probe", "layer", "difference", "accuracy difference [95% CI]"),
        stages,
        caption="Fig. 8: paired pre- vs post-reasoning accuracy on the same test steps.",
    )
    return fig(comparison) + table + fig(per_class) + stage_table


def _first(mapping: Mapping) -> dict:
    return next(iter(mapping.values()), {})


def _best_cell_run(sweeps: dict[str, dict]) -> tuple[str, dict]:
    best, best_name, value = None, "", -1.0
    for sweep in sweeps.values():
        for r in sweep["runs"]:
            v = (_m(r["metrics"], "probe", "accuracy_no_padding") or {}).get("value")
            if v is not None and v > value:
                best, best_name, value = r, r["name"], v
    if best is None:
        raise MissingInput("no cell-probe run has an accuracy")
    return best_name, best


def _localisation(run: _Run, fig: _Figures) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    best_name, best = _best_cell_run(_cell_sweeps(run))
    groups = {"all": best["metrics"], **best["metrics"].get("by_grid_size", {})}
    chart = make_subplots(
        rows=1, cols=2, subplot_titles=("top-1 localisation accuracy", "mean Manhattan distance")
    )
    rows = []
    for obj in ("agent", "goal"):
        for col, metric in ((1, f"{obj}_top1"), (2, f"{obj}_manhattan")):
            stats = [(_m(g, "probe", metric) or {}) for g in groups.values()]
            chart.add_trace(
                go.Bar(name=f"{obj}", x=list(groups), y=[s.get("value") for s in stats]),
                row=1,
                col=col,
            )
        for group, g in groups.items():
            rows.append(
                (
                    obj,
                    group,
                    stat_text(_m(g, "probe", f"{obj}_top1")),
                    stat_text(_m(g, "majority", f"{obj}_top1")),
                    stat_text(_m(g, "shuffled", f"{obj}_top1")),
                    stat_text(_m(g, "probe", f"{obj}_manhattan"), percent=False, digits=2),
                    stat_text(_m(g, "shuffled", f"{obj}_manhattan"), percent=False, digits=2),
                )
            )
    chart.update_layout(
        title=f"Fig. 7: locating the agent and the goal — {best_name}",
        barmode="group",
        template="plotly_white",
        height=340,
    )
    table = _table(
        (
            "object",
            "grid size",
            "top-1",
            "top-1 majority",
            "top-1 shuffled",
            "Manhattan",
            "Manhattan shuffled",
        ),
        rows,
        caption="Argmax cell of the probe's agent/goal probability against the true cell.",
    )
    return fig(chart) + table


def _distance(run: _Run, fig: _Figures) -> str:
    sweeps = {p.stem: json.loads(p.read_text()) for p in run.glob("distance/sweeps/*.json")}
    if not sweeps:
        raise MissingInput("distance/sweeps/*.json not found")
    rows = []
    for name, sweep in sweeps.items():
        for r in sweep["runs"]:
            m = r["metrics"]
            rows.append(
                (
                    name.removeprefix("distance_"),
                    r["stage"],
                    r["layer"],
                    r["n_test"],
                    stat_text(_m(m, "probe", "mae"), percent=False, digits=2),
                    stat_text(_m(m, "probe", "r2"), percent=False),
                    stat_text(_m(m, "mean", "mae"), percent=False, digits=2),
                    stat_text(_m(m, "shuffled", "r2"), percent=False),
                )
            )
    return _table(
        (
            "regressor",
            "stage",
            "layer",
            "test rows",
            "MAE",
            "R²",
            "MAE of the mean",
            "R² shuffled labels",
        ),
        rows,
        caption="Shortest-path distance to the goal from the anchor activations; test grids.",
    )


def _belief(run: _Run, fig: _Figures) -> str:
    from probes.scoring.figures import belief_figure, meg_figure, topk_figure

    belief = run.json("scoring/belief.json")
    key = belief.get("default_probe") or next(iter(belief["probes"]))
    entry = belief["probes"][key]
    metrics = ("acc_gt", "acc_dec", "agreement", "recovery", "chance_acc_gt", "chance_acc_dec")
    rows = []
    for group_name, groups in (("size", entry["by_size"]), ("density", entry["by_density"])):
        for value, stats in groups.items():
            rows.append((f"{group_name} {value}", *(stat_text(stats.get(m)) for m in metrics)))
    rows.append(("all", *(stat_text(entry["overall"].get(m)) for m in metrics)))
    table = _table(
        ("group", "Acc. GT", "Acc. Dec.", "Agreement", "Recovery", "chance GT", "chance Dec."),
        rows,
        caption=f"Probe {key} ({entry.get('family')}, {entry.get('stage')}, layer "
        f"{entry.get('layer')}); decoded maps exist for test grids only. Chance: a uniformly "
        "random action. 95% grid-bootstrap intervals.",
    )
    parts = [fig(belief_figure(belief)), table, fig(topk_figure(belief))]
    try:
        meg = run.json("scoring/meg.json")
    except MissingInput as err:
        parts.append(_box("not_run", f"MEG: {err}"))
    else:
        parts.append(fig(meg_figure(meg)))
        overall = meg.get("overall", {})
        paired = overall.get("paired") or {}
        parts.append(
            _table(
                ("MEG (nats)", "value [95% CI]"),
                [
                    ("true grid, all grids", stat_text(overall["true"]["meg"], percent=False)),
                    (
                        "subjective (decoded grid), paired grids",
                        stat_text((paired.get("subjective") or {}).get("meg"), percent=False),
                    ),
                    (
                        "subjective − true",
                        stat_text((paired.get("difference") or {}).get("meg"), percent=False),
                    ),
                ],
                caption="Known-utility MEG of the agent's empirical policy; 0 = no more "
                "goal-directed than the uniform policy.",
            )
        )
    return "".join(parts)


def _plans(run: _Run, fig: _Figures) -> str:
    from viewer.figures import prefix_accuracy_figure

    sweep = run.json("plans/sweep.json")
    runs = sweep["runs"]
    decoders = [r for r in runs if r["kind"] == "decoder"]
    if not decoders:
        raise MissingInput("plans/sweep.json holds no trained decoder")
    best = max(decoders, key=lambda r: r["metrics"]["prefix_accuracy"][0] or 0)
    layer = best["layer"]
    curves, ci = {}, {}
    for r in runs:
        if r["layer"] != layer:
            continue
        stage = r["stage"].split("_")[0]
        name = {
            "decoder": f"{stage}, {r['decoder_layers']}-layer decoder",
            "shuffled_control": f"{stage}, shuffled control ({r['decoder_layers']}-layer)",
            "majority_plan": f"{stage}, majority plan",
        }[r["kind"]]
        curves[name] = [
            v if v is not None else float("nan") for v in r["metrics"]["prefix_accuracy"]
        ]
        if r["kind"] == "decoder":
            ci[name] = [
                [v if v is not None else float("nan") for v in bound]
                for bound in r["metrics"]["prefix_accuracy_ci"]
            ]
    figure = prefix_accuracy_figure(
        curves, ci=ci, title=f"Fig. 10: prefix accuracy vs N at layer {layer} (test grids)"
    )
    rows = []
    for r in runs:
        m = r["metrics"]
        acc = m["prefix_accuracy"]
        rows.append(
            (
                r["stage"],
                r["layer"],
                r["kind"].replace("_", " ")
                + ("" if r["decoder_layers"] is None else f" {r['decoder_layers']}L"),
                _pct(acc[0]),
                _pct(acc[2]) if len(acc) > 2 else "–",
                _pct(acc[4]) if len(acc) > 4 else "–",
                _pct(m.get("exact_length_match")),
                _num(m.get("mean_predicted_length"), 2),
                _num(m.get("mean_true_length"), 2),
                _num(m.get("length_bias"), 2),
                _num(m.get("median_abs_length_error"), 1),
            )
        )
    table = _table(
        (
            "stage",
            "layer",
            "predictor",
            "N=1",
            "N=3",
            "N=5",
            "exact length",
            "mean predicted length",
            "mean true length",
            "bias",
            "median |error|",
        ),
        rows,
        caption="Random baseline 0.25^N: N=1 25.0%, N=3 1.6%, N=5 0.1%. Table 5: length "
        "analysis (plans censored at T = 10).",
    )
    return fig(figure) + table


def _patching(run: _Run, fig: _Figures) -> str:
    from viewer.figures import patching_heatmap_figure

    data = run.json("patching/patch_results.json")
    summary = data.get("summary", [])
    if not summary:
        prep = data.get("preparation", {})
        return _box(
            "not_run",
            f"no counterfactual pair survived preparation ({prep}); nothing was patched",
        )
    control = {
        (r["direction"], r["site"], r["layers"]): r
        for r in summary
        if r["kind"] == "control" and r["mode"] == "teacher_forced"
    }
    rows = []
    for r in summary:
        if r["kind"] != "disjoint" or r["mode"] != "teacher_forced":
            continue
        c = control.get((r["direction"], r["site"], r["layers"]))
        low, high = r["action_changed_ci"]
        rows.append(
            (
                r["direction"],
                r["site"],
                r["layers"],
                r["n_runs"],
                f"{_pct(r['action_changed_rate'])} [{_pct(low)}, {_pct(high)}]",
                _pct(r["into_source_optimal_rate"]),
                _num(r["recovered_mean"]),
                "–" if c is None else f"{_pct(c['stable_rate'])} (n={c['n_runs']})",
            )
        )
    table = _table(
        (
            "direction",
            "site",
            "layers",
            "runs",
            "action changed [95% CI]",
            "into source's optimal set",
            "logit diff. recovered",
            "control stable",
        ),
        rows,
        caption=f"{data.get('n_bases', '?')} base steps; reasoning held fixed (teacher-forced). "
        "The study found single-layer patches never changed GPT-OSS-20B's action (0/456), "
        "all-layer patches always did.",
    )
    records = data.get("records", [])
    out = table
    if records:
        out = (
            fig(
                patching_heatmap_figure(
                    records,
                    value="action_changed",
                    title="Action changed by site and layer set",
                )
            )
            + table
        )
    return out


# ---------------------------------------------------------------------------------------------
# Headline
# ---------------------------------------------------------------------------------------------


def headline_rows(run_dir: str | Path) -> list[HeadlineRow]:
    """The headline findings of a run (rows whose inputs are missing are left out)."""
    run = _Run(Path(run_dir))
    rows: list[HeadlineRow] = []

    def attempt(make: Callable[[], Iterable[HeadlineRow]]) -> None:
        try:
            rows.extend(make())
        except (MissingInput, KeyError, IndexError, TypeError, ValueError):
            return  # that stage did not produce the input; the report's section says why

    def behaviour():
        o = run.json("behaviour/metrics.json")["overall"]
        return [
            HeadlineRow(
                "Per-action accuracy (Fig. 4)",
                stat_text(o["accuracy"]),
                f"random walk {_pct(o['random_walk_accuracy']['value'])}, random action "
                f"{_pct(o['random_action_accuracy']['value'])}",
            ),
            HeadlineRow(
                "Goal success rate (Fig. 12a)",
                stat_text(o["success_rate"]),
                f"random walk {_pct(o['random_walk_success_rate']['value'])}",
            ),
        ]

    def iso():
        tests = [
            t
            for t in run.json("iso/results.json")["tests"]
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
        v = run.json("keys/results.json")["variants"]
        out = []
        if "key_door" in v:
            out.append(
                HeadlineRow(
                    "KeyDoor success / key pickup (Table 1)",
                    f"{_pct(v['key_door']['success_rate'])} / "
                    f"{_pct(v['key_door'].get('key_pickup_rate'))}",
                    "study: 100% / 100%",
                )
            )
        if "key_no_door" in v:
            out.append(
                HeadlineRow(
                    "KeyNoDoor: useless key picked up (Table 1)",
                    _pct(v["key_no_door"].get("key_pickup_rate")),
                    "study: 17%",
                )
            )
        return out

    def probes():
        name, best = _best_cell_run(_cell_sweeps(run))
        m = best["metrics"]
        return [
            HeadlineRow(
                f"Cognitive map: best probe accuracy on grid cells ({name}; Fig. 6)",
                stat_text(_m(m, "probe", "accuracy_no_padding")),
                f"majority {stat_text(_m(m, 'majority', 'accuracy_no_padding'))}, shuffled "
                f"{stat_text(_m(m, 'shuffled', 'accuracy_no_padding'))}",
            ),
            HeadlineRow(
                "Agent / goal top-1 localisation (Fig. 7)",
                f"{stat_text(_m(m, 'probe', 'agent_top1'))} / "
                f"{stat_text(_m(m, 'probe', 'goal_top1'))}",
                f"shuffled {_pct((_m(m, 'shuffled', 'agent_top1') or {}).get('value'))} / "
                f"{_pct((_m(m, 'shuffled', 'goal_top1') or {}).get('value'))}",
            ),
        ]

    def distance():
        best = None
        for p in run.glob("distance/sweeps/*.json"):
            for r in json.loads(p.read_text())["runs"]:
                v = (_m(r["metrics"], "probe", "r2") or {}).get("value")
                if v is not None and (best is None or v > best[0]):
                    best = (v, r)
        if best is None:
            return []
        r = best[1]
        return [
            HeadlineRow(
                f"Goal distance R² ({r['name']}; Table 4)",
                stat_text(_m(r["metrics"], "probe", "r2"), percent=False),
                f"shuffled {stat_text(_m(r['metrics'], 'shuffled', 'r2'), percent=False)}",
            )
        ]

    def belief():
        b = run.json("scoring/belief.json")
        entry = b["probes"][b.get("default_probe") or next(iter(b["probes"]))]["overall"]
        return [
            HeadlineRow(
                "Acc. GT / Acc. Dec. / Recovery (Table 2)",
                " / ".join(stat_text(entry.get(k)) for k in ("acc_gt", "acc_dec", "recovery")),
                f"chance {_pct((entry.get('chance_acc_gt') or {}).get('value'))}",
            )
        ]

    def meg():
        o = run.json("scoring/meg.json")["overall"]
        return [
            HeadlineRow(
                "MEG on the true grid, nats (MEG paper, Def. 3.2)",
                stat_text(o["true"]["meg"], percent=False),
                "uniform policy: 0",
            )
        ]

    def plans():
        runs = run.json("plans/sweep.json")["runs"]
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
                f"{_pct(acc[0])} / {_pct(acc[2])}",
                "0.25^N: 25.0% / 1.6%"
                + (f"; shuffled N=1 {_pct(shuffled[0])}" if shuffled else ""),
            )
        ]

    def patching():
        summary = run.json("patching/patch_results.json").get("summary", [])
        out = []
        for r in summary:
            if r["kind"] == "disjoint" and r["mode"] == "teacher_forced" and r["layers"] == "all":
                out.append(
                    HeadlineRow(
                        f"Patching all layers at {r['site']} ({r['direction']}): action changed",
                        f"{_pct(r['action_changed_rate'])} (n={r['n_runs']})",
                        "study: always changed",
                    )
                )
        return out[:2]

    for make in (behaviour, iso, keys, probes, distance, belief, meg, plans, patching):
        attempt(make)
    return rows


# ---------------------------------------------------------------------------------------------
# Page
# ---------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;
padding:1.5rem;color:#1d2731;line-height:1.45}
h1{margin-bottom:.2rem}h2{border-bottom:2px solid #1d3557;padding-bottom:.2rem;margin-top:2.5rem}
table{border-collapse:collapse;margin:.8rem 0;font-size:.88rem}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f1f4f8}caption{caption-side:bottom;text-align:left;color:#5a6570;font-size:.8rem;
padding-top:.3rem}
.box{border-radius:6px;padding:.7rem 1rem;margin:.8rem 0}
.box.failed{background:#fdecea;border:1px solid #d62828}
.box.not_run{background:#fff8e1;border:1px solid #e9c46a}
details.config{margin:.5rem 0;font-size:.85rem}details.config summary{cursor:pointer;color:#457b9d}
nav a{margin-right:.8rem}code{background:#f1f4f8;padding:0 .2rem;border-radius:3px}
"""


def _run_section(run: _Run, config: Mapping | None) -> str:
    from goalprobe.stages import STAGES

    rows = []
    for stage in STAGES:
        record = run.stage_record(stage)
        failure = run.stage_failure(stage)
        if failure:
            rows.append((stage, failure, "–", "–"))
        elif record is not None:
            rows.append(
                (
                    stage,
                    "finished",
                    f"{record.get('seconds', 0):.1f}",
                    ", ".join(sorted(record.get("outputs", {}).values())),
                )
            )
        else:
            rows.append((stage, "not run", "–", "–"))
    if config is None:
        try:
            config = run.json("demo_config.json")
        except MissingInput:
            config = {}
    cfg = _table(("field", "value"), [(k, json.dumps(v)) for k, v in config.items()])
    return (
        _table(
            ("stage", "status", "seconds", "outputs"), rows, caption="Stage records in RUN/stages/."
        )
        + "<details class='config'><summary>Demo configuration</summary>"
        + cfg
        + "</details>"
    )


_BUILDERS: dict[str, Callable[[_Run, _Figures], str]] = {
    "behaviour": _behaviour,
    "iso": _iso,
    "keys": _keys,
    "probes": _probes,
    "localisation": _localisation,
    "distance": _distance,
    "belief": _belief,
    "plans": _plans,
    "patching": _patching,
}


def _section(run: _Run, section: str, fig: _Figures) -> str:
    stage = STAGE_OF_SECTION[section]
    failure = run.stage_failure(stage)
    if failure:
        body = _box("failed" if failure.startswith("failed") else "not_run", failure)
    else:
        try:
            body = _BUILDERS[section](run, fig) + _config_block(run, stage)
        except MissingInput as err:
            body = _box("not_run", f"not run: {err} (stage {stage})")
        except (KeyError, IndexError, TypeError, ValueError) as err:
            body = _box("failed", f"failed to draw from stage {stage}'s outputs: {err!r}")
    return (
        f"<section id='{section}'><h2>{html.escape(SECTION_TITLES[section])}</h2>{body}</section>"
    )


def write_report(
    run_dir: str | Path, *, config: Mapping | None = None, out: str | Path | None = None
) -> Path:
    """Write the report of ``run_dir`` (default ``RUN/report.html``) and return its path.

    Args:
        run_dir: the run directory (layout: :mod:`activations.run_layout`).
        config: the demo config to show (default: ``RUN/demo_config.json``).
        out: where to write (default ``RUN/report.html``).
    """
    from plotly.offline import get_plotlyjs

    run = _Run(Path(run_dir))
    fig = _Figures()
    headline = headline_rows(run.root)
    head_html = (
        _table(
            ("finding", "value [95% CI]", "baseline"),
            [(r.finding, r.value, r.baseline) for r in headline],
        )
        if headline
        else _box("not_run", "no stage produced a headline figure yet")
    )
    sections = [
        f"<section id='run'><h2>{SECTION_TITLES['run']}</h2>{_run_section(run, config)}</section>",
        f"<section id='headline'><h2>{SECTION_TITLES['headline']}</h2>{head_html}</section>",
        *(_section(run, s, fig) for s in _BUILDERS),
    ]
    nav = "".join(
        f"<a href='#{k}'>{html.escape(v.split(' (')[0])}</a>" for k, v in SECTION_TITLES.items()
    )
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<title>goalprobe report</title>"
        f"<style>{_CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
        "<body><h1>goalprobe report</h1>"
        f"<p>Run directory <code>{html.escape(str(run.root.resolve()))}</code>, written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}. Study: goal-directedness "
        "of an LLM agent in a text grid world (behaviour, probes, plans, patching, MEG).</p>"
        f"<nav>{nav}</nav>{''.join(sections)}</body></html>"
    )
    path = Path(out) if out is not None else run.root / "report.html"
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path
