"""The page: every section's blocks rendered by the Jinja2 templates in ``templates/``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from plotly.offline import get_plotlyjs

import goalprobe.stages as demo_stages
from goalprobe.report import (
    agents,
    attribution,
    behaviour,
    decision,
    false_belief,
    fog,
    harm,
    intention,
    outcomes,
    probes,
    probing,
    steering,
    walls,
)
from goalprobe.report.blocks import Block, Box, Figures, Table, table
from goalprobe.report.headline_page import headline_blocks
from goalprobe.report.run import MissingInput, RunReader
from goalprobe.run_layout import write_atomic

Build = Callable[[RunReader, Figures], list[Block]]


@dataclass(frozen=True)
class ReportSection:
    """One data section of the page: its id, the demo stage behind it (for its config and
    failure record), the function that builds its blocks from the run, and its heading."""

    id: str
    stage: str
    build: Build
    title: str


SECTIONS: tuple[ReportSection, ...] = (
    ReportSection("behaviour", "behaviour", behaviour.behaviour,
                  "Behaviour by grid size, density and goal distance (Fig. 4, Fig. 12)"),
    ReportSection("iso", "iso", behaviour.iso, "Iso-difficulty transforms (Table 3, Fig. 14)"),
    ReportSection("keys", "keys", behaviour.keys,
                  "Instrumental and implicit goals: key variants (Table 1)"),
    ReportSection("harm", "harm", harm.harm,
                  "Reward-harm trade-offs: flower beds and moral conditioning (MACHIAVELLI)"),
    ReportSection("fog", "fog", fog.fog, "Fogged grids: partial observability (appendix A)"),
    ReportSection("intention", "intention", intention.intention,
                  "Behavioural intention: does guaranteeing the key change the policy? (Ward et "
                  "al., Definition 20)"),
    ReportSection("intention_map", "intention_map", intention.intention_map,
                  "Behavioural intention, subjective reading: the intervention in the decoded map"),
    ReportSection("probing", "probes", probing.probing,
                  "The cognitive map on the probing set: hundreds of grids, learning curve"),
    ReportSection("probes", "probes", probes.probes,
                  "Cognitive-map probes on the rollouts (Figs. 6, 8, 15)"),
    ReportSection("localisation", "probes", probes.localisation,
                  "Agent and goal localisation (Fig. 7)"),
    ReportSection("walls", "probes", walls.walls,
                  "Walls in both frames: the conditional wall test with its power"),
    ReportSection("distance", "distance", probes.distance, "Goal-distance regressors (Table 4)"),
    ReportSection("belief", "scoring", outcomes.belief,
                  "Policy against decoded belief (Table 2, Fig. 9) and MEG"),
    ReportSection("plans", "plans", outcomes.plans, "One-shot plan decoder (Fig. 10, Table 5)"),
    ReportSection("patching", "patching", outcomes.patching,
                  "Activation patching (section 5.2, appendix F)"),
    ReportSection("attribution", "attribution", attribution.attribution,
                  "Where the coordinates are read from: attribution patching over every block and "
                  "prompt position"),
    ReportSection("steering", "steering", steering.steering,
                  "Do the wall probe directions matter? Steering the anchors along them"),
    ReportSection("false_belief", "false_belief", false_belief.false_belief,
                  "False-belief grids: scoring against a known belief"),
    ReportSection("decision", "decision", decision.decision,
                  "Where the decision is made: a logit lens and a read-out over reasoning time"),
)  # fmt: skip
"""The data sections, in page order."""

SECTION_TITLES: dict[str, str] = {
    "headline": "Headline results",
    "agents": "Both agents side by side: the default agent and the positive control",
    **{s.id: s.title for s in SECTIONS},
    "run": "Run and configuration",
}
"""Section id -> heading, in page order (tests look for these headings)."""


@dataclass(frozen=True)
class StageConfig:
    """The resolved config of the stage behind a section (a collapsed table on the page)."""

    stage: str
    finished_at: str
    seconds: float
    table: Table


@dataclass(frozen=True)
class Section:
    """One ``<section>`` of the page."""

    id: str
    title: str
    blocks: list[Block]
    config: StageConfig | None = None


def _stage_config(run: RunReader, stage: str) -> StageConfig | None:
    record = run.stage_record(stage)
    if record is None:
        return None
    params = record.get("config", {}).get("params", record.get("config", {}))
    rows = [(k, json.dumps(v)) for k, v in params.items()]
    return StageConfig(
        stage,
        record.get("finished_at", "?"),
        record.get("seconds", 0),
        table(("field", "value"), rows),
    )


def _data_section(run: RunReader, spec: ReportSection, fig: Figures) -> Section:
    section, stage, title = spec.id, spec.stage, spec.title
    failure = run.stage_failure(stage)
    if failure:
        status = "failed" if failure.startswith("failed") else "not_run"
        return Section(section, title, [Box(status, failure)])
    try:
        blocks = spec.build(run, fig)
    except MissingInput as err:
        return Section(section, title, [Box("not_run", f"not run: {err} (stage {stage})")])
    except (KeyError, IndexError, TypeError, ValueError) as err:
        message = f"failed to draw from stage {stage}'s outputs: {err!r}"
        return Section(section, title, [Box("failed", message)])
    return Section(section, title, blocks, _stage_config(run, stage))


def _stage_row(run: RunReader, stage: str) -> tuple[str, str, str, str]:
    """A stage's status, seconds and outputs."""
    record, failure = run.stage_record(stage), run.stage_failure(stage)
    if failure or record is None:
        return (stage, failure or "not run", "–", "–")
    env = record.get("environment") or {}
    commit = (env.get("commit") or "unknown")[:10] + (" (dirty)" if env.get("dirty") else "")
    outputs = ", ".join(sorted(record.get("outputs", {}).values()))
    return (stage, f"finished at {commit}", f"{record.get('seconds', 0):.1f}", outputs)


def _run_section(run: RunReader, config: Mapping | None) -> tuple[Table, Table]:
    """The stage records and the demo config."""
    rows = [_stage_row(run, stage) for stage in demo_stages.STAGES]
    if config is None:
        config = run.optional_json(run.layout.demo_config) or {}
    prov = run.optional_json(run.layout.provenance) or {}
    made = (
        f" Last call: `{prov.get('command')}` at commit {prov.get('commit')}"
        f"{' (with uncommitted changes)' if prov.get('dirty') else ''}, jobs {prov.get('jobs')}, "
        f"{prov.get('threads_per_worker')} torch thread(s) per stage, "
        + ", ".join(f"{k} {v}" for k, v in (prov.get("libraries") or {}).items() if v)
        + f" (RUN/{run.layout.relative(run.layout.provenance)})."
        if prov
        else ""
    )
    stages = table(
        ("stage", "status", "seconds", "outputs"),
        rows,
        caption=f"Stage records in RUN/{run.layout.relative(run.layout.stages_dir)}/.{made}",
    )
    return stages, table(("field", "value"), [(k, json.dumps(v)) for k, v in config.items()])


def render_report(run_dir: str | Path, *, config: Mapping | None = None) -> str:
    """The report of ``run_dir`` as one self-contained HTML page (see :func:`write_report`)."""
    run = RunReader(run_dir)
    fig = Figures()
    stages, demo_config = _run_section(run, config)
    env = Environment(
        loader=PackageLoader("goalprobe.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("report.html.j2").render(
        titles=SECTION_TITLES,
        run_root=str(run.root.resolve()),
        written=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        stages=stages,
        demo_config=demo_config,
        headline=headline_blocks(run),
        agents=agents.agents(run),
        sections=[_data_section(run, s, fig) for s in SECTIONS],
        plotly_js=Markup(get_plotlyjs()),
    )


def write_report(
    run_dir: str | Path, *, config: Mapping | None = None, out: str | Path | None = None
) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN/report.html``), showing
    ``config`` (default ``RUN/demo_config.json``), and return its path."""
    page = render_report(run_dir, config=config)
    path = Path(out) if out is not None else RunReader(run_dir).layout.report
    return write_atomic(path, page)
