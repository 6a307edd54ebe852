"""Static, self-contained HTML export of selected episodes (``goalprobe view RUN --export``):
plotly.js inlined once, every step's figures embedded as JSON and stepped through by a little
plain JavaScript; text from the run is escaped."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from goalprobe.gridworld.core import CellType
from goalprobe.viewer.data import RunData, UnknownKeyError
from goalprobe.viewer.figures.maps import probability_figure
from goalprobe.viewer.figures.style import LEGEND, class_name
from goalprobe.viewer.step import (
    StepView,
    build_step_view,
    default_map_source,
    default_plan_source,
    step_badges,
    step_figures,
    timeline_figure,
)

from goalprobe.run_layout import write_atomic

PANELS = ("timeline", "true", "decoded", "plan", "plan_strip")
"""Figures stored for every step (the probability heatmaps come per class)."""

_CSS = """
* { box-sizing: border-box; }
body { margin: 0; font-family: Inter, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif;
       color: #1f2933; background: #f5f6f8; font-size: 14px; }
header { padding: 12px 20px; background: #1d3557; color: white; }
header h1 { font-size: 18px; margin: 0 0 2px; font-weight: 600; }
header p { margin: 0; font-size: 13px; opacity: .85; }
.notice { margin: 12px 20px 0; padding: 10px 14px; background: #fff8e1; border: 1px solid #f2d47a;
          border-radius: 6px; font-size: 13px; }
.notice ul { margin: 4px 0 0; padding-left: 20px; }
section.episode { margin: 14px 20px; background: white; border-radius: 8px; padding: 12px 14px;
                  box-shadow: 0 1px 2px rgba(0,0,0,.06); }
section.episode h2 { font-size: 16px; margin: 0 0 8px; }
.controls { display: flex; align-items: center; gap: 10px; flex-wrap: wrap; }
.controls input[type=range] { flex: 1 1 300px; }
.controls button { padding: 4px 12px; border: 1px solid #c5ccd3; background: #f8f9fa;
                   border-radius: 5px; cursor: pointer; }
.badges { display: flex; flex-wrap: wrap; gap: 6px; margin: 8px 0 4px; }
.badge { padding: 3px 9px; border-radius: 999px; font-size: 13px; background: #e9ecef; }
.badge.ok { background: #d8f3dc; color: #1b4332; } .badge.bad { background: #f8d7da; color: #842029; }
.badge.info { background: #e7e0f5; color: #4a1f8a; }
.row3 { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 10px; }
.row2 { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 10px; }
.panel { min-height: 120px; }
pre { white-space: pre-wrap; word-break: break-word; background: #f8f9fa; border-radius: 5px;
      padding: 8px; margin: 0 0 8px; font-size: 12.5px; max-height: 220px; overflow: auto; }
h4 { margin: 6px 0 4px; font-size: 13px; color: #52606d; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 12px; color: #3e4c59;
          margin: 4px 0; }
.legend span.item { display: inline-flex; align-items: center; gap: 6px; }
.sw { width: 13px; height: 13px; border: 1px solid #8a8f98; border-radius: 2px; display: inline-block; }
.ln { width: 20px; height: 4px; border-radius: 2px; display: inline-block; }
.rg { width: 12px; height: 12px; border: 3px solid; border-radius: 50%; display: inline-block; }
"""

_JS = """
(function () {
  const config = {displaylogo: false, responsive: true};
  document.querySelectorAll('section.episode').forEach(function (section) {
    const data = JSON.parse(section.querySelector('script.episode-data').textContent);
    const slider = section.querySelector('input[type=range]');
    const select = section.querySelector('select.class-select');
    const info = section.querySelector('.stepinfo');
    const badges = section.querySelector('.badges');
    let current = 0;
    function draw(panel, fig) {
      const div = section.querySelector('[data-panel="' + panel + '"]');
      if (fig) { Plotly.react(div, fig.data, fig.layout, config); }
    }
    function show(t) {
      current = Math.max(0, Math.min(data.steps.length - 1, t));
      slider.value = current;
      const step = data.steps[current];
      info.textContent = 'step ' + current + ' of ' + (data.steps.length - 1);
      badges.replaceChildren();
      step.badges.forEach(function (b) {
        const span = document.createElement('span');
        span.className = 'badge ' + b[1];
        span.textContent = b[0];
        badges.appendChild(span);
      });
      data.panels.forEach(function (panel) { draw(panel, step.figures[panel]); });
      draw('probability', step.probability[select.value]);
      section.querySelector('.reasoning').textContent = step.reasoning;
      section.querySelector('.final').textContent = step.final;
    }
    slider.addEventListener('input', function () { show(parseInt(slider.value, 10)); });
    select.addEventListener('change', function () { show(current); });
    section.querySelector('.prev').addEventListener('click', function () { show(current - 1); });
    section.querySelector('.next').addEventListener('click', function () { show(current + 1); });
    section.addEventListener('keydown', function (e) {
      if (e.key === 'ArrowLeft') { show(current - 1); }
      if (e.key === 'ArrowRight') { show(current + 1); }
    });
    show(0);
  });
})();
"""


def select_episodes(run: RunData, specs: Sequence[str] | None, *, limit: int = 3) -> list[str]:
    """Episode keys from ``GRID_ID:EPISODE`` or ``GRID_ID`` (every episode of the grid) specs
    (None or empty: the first ``limit``); :class:`UnknownKeyError` for a spec naming none."""
    if not specs:
        return list(run.episodes)[:limit]
    keys: list[str] = []
    for spec in specs:
        spec = spec.strip()
        grid = [k for k, info in run.episodes.items() if info.grid_id == spec]
        matches = [spec] if spec in run.episodes else grid
        if not matches:
            raise UnknownKeyError(
                f"{spec!r} is not an episode (GRID_ID:EPISODE) or grid of the run; e.g. "
                + ", ".join(list(run.episodes)[:3])
            )
        keys.extend(k for k in matches if k not in keys)
    return keys


def _badges(view: StepView, map_label: str | None) -> list[list[str]]:
    out = [list(b) for b in step_badges(view)]
    if map_label:
        out.append([f"probe: {map_label}", ""])
    out.extend([note, "bad"] for note in view.notes)
    return out


def _legend_html() -> str:
    items = []
    for label, colour, kind in LEGEND:
        css = {"square": "sw", "line": "ln", "ring": "rg"}[kind]
        style = f"border-color:{colour}" if kind == "ring" else f"background:{colour}"
        items.append(
            f'<span class="item"><span class="{css}" style="{style}"></span>{html.escape(label)}</span>'
        )
    return f'<div class="legend">{"".join(items)}</div>'


def _episode_section(
    run: RunData, key: str, index: int, map_source: str | None, plan_source: str | None
) -> str:
    info = run.episode_info(key)
    source = run.map_sources[map_source] if map_source else None
    map_label = source.label if source else None
    classes = [c for c in source.classes if c != CellType.PADDING] if source else []
    steps = []
    for t in range(info.summary.length):
        view = build_step_view(run, key, t, map_source=map_source, plan_source=plan_source)
        figs = step_figures(view, show_legend=False)
        figs["timeline"] = timeline_figure(run, key, t, map_source)
        probability = {}
        for c in classes:
            if view.decoded is None:
                fig = figs["probability"]  # the blank figure saying why
            else:
                fig = probability_figure(
                    view.decoded.probs[:, :, c],
                    c,
                    title=f"P({class_name(c)}) per cell",
                    true_cell_types=view.true_cells,
                )
            probability[class_name(c)] = json.loads(fig.to_json())
        steps.append(
            {
                "figures": {p: json.loads(figs[p].to_json()) for p in PANELS},
                "probability": probability,
                "badges": _badges(view, map_label),
                "reasoning": view.reasoning or "(none)",
                "final": view.final or "(none)",
            }
        )
    payload = {"panels": list(PANELS), "steps": steps}
    # "</" would end the <script> element early; "\\/" is the same string in JSON
    blob = json.dumps(payload, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    options = "".join(
        f'<option value="{class_name(c)}"{" selected" if c == CellType.GOAL else ""}>'
        f"P({class_name(c)})</option>"
        for c in classes
    )
    n = info.summary.length
    return f"""
<section class="episode" id="episode-{index}" tabindex="0">
  <h2>{html.escape(info.label)}</h2>
  <div class="controls">
    <button class="prev" type="button">◀ prev</button>
    <input type="range" min="0" max="{max(n - 1, 0)}" value="0" step="1" aria-label="step">
    <button class="next" type="button">next ▶</button>
    <span class="stepinfo"></span>
    <label>probability map <select class="class-select">{options or '<option value="">none</option>'}</select></label>
  </div>
  <div class="badges"></div>
  <div class="panel" data-panel="timeline"></div>
  {_legend_html()}
  <div class="row3">
    <div class="panel" data-panel="true"></div>
    <div class="panel" data-panel="decoded"></div>
    <div class="panel" data-panel="probability"></div>
  </div>
  <div class="row2">
    <div class="panel" data-panel="plan"></div>
    <div>
      <div class="panel" data-panel="plan_strip"></div>
      <h4>Reasoning</h4><pre class="reasoning"></pre>
      <h4>Final answer</h4><pre class="final"></pre>
    </div>
  </div>
  <script type="application/json" class="episode-data">{blob}</script>
</section>"""


def export_html(
    run: RunData | str | Path,
    out_path: str | Path,
    *,
    episodes: Sequence[str] | None = None,
    map_source: str | None = None,
    plan_source: str | None = None,
) -> Path:
    """Write the HTML page of the ``episodes`` (:func:`select_episodes`) of ``run`` to
    ``out_path`` and return it; the sources default to those the app shows first
    (:class:`UnknownKeyError` for a key not in the run)."""
    from plotly.offline import get_plotlyjs

    run = run if isinstance(run, RunData) else RunData(run)
    keys = select_episodes(run, episodes)
    for key, known, what in (
        (map_source, run.map_sources, "decoded-map source"),
        (plan_source, run.plan_sources, "plan source"),
    ):
        if key is not None and key not in known:
            available = ", ".join(known) or "none"
            raise UnknownKeyError(f"unknown {what} {key!r}; available: {available}")
    if map_source is None:
        map_source = default_map_source(run)
    if plan_source is None:
        source = run.map_sources.get(map_source) if map_source else None
        plan_source = default_plan_source(
            run, source.stage if source else None, source.layer if source else None
        )
    sections = "".join(
        _episode_section(run, key, i, map_source, plan_source) for i, key in enumerate(keys)
    )
    notice = ""
    if run.missing:
        items = "".join(f"<li>{html.escape(str(m))}</li>" for m in run.missing)
        notice = f'<div class="notice"><b>{len(run.missing)} artefact(s) missing or unreadable</b><ul>{items}</ul></div>'
    title = f"goalprobe cognitive maps · {run.root.name}"
    subtitle = f"run {run.header.run_id}" if run.header else ""
    if map_source:
        subtitle += f" · probe {run.map_sources[map_source].label}"
    if plan_source:
        subtitle += f" · plan decoder {run.plan_sources[plan_source].label}"
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head>
<body>
<header><h1>{html.escape(title)}</h1><p>{html.escape(subtitle)}</p></header>
{notice}
{sections}
<script type="text/javascript">{_JS}</script>
</body>
</html>
"""
    return write_atomic(Path(out_path), page)
