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

SECTION_TITLES: dict[str, str] = {
    "headline": "Headline results",
    "agents": "Both agents side by side: the default agent and the positive control",
    "behaviour": "Behaviour by grid size, density and goal distance (Fig. 4, Fig. 12)",
    "iso": "Iso-difficulty transforms (Table 3, Fig. 14)",
    "keys": "Instrumental and implicit goals: key variants (Table 1)",
    "harm": "Reward-harm trade-offs: flower beds and moral conditioning (MACHIAVELLI)",
    "fog": "Fogged grids: partial observability (appendix A)",
    "intention": "Behavioural intention: does guaranteeing the key change the policy? "
    "(Ward et al., Definition 20)",
    "intention_map": "Behavioural intention, subjective reading: the intervention in the "
    "decoded map",
    "probing": "The cognitive map on the probing set: hundreds of grids, learning curve",
    "probes": "Cognitive-map probes on the rollouts (Figs. 6, 8, 15)",
    "localisation": "Agent and goal localisation (Fig. 7)",
    "walls": "Walls in both frames: the conditional wall test with its power",
    "distance": "Goal-distance regressors (Table 4)",
    "belief": "Policy against decoded belief (Table 2, Fig. 9) and MEG",
    "plans": "One-shot plan decoder (Fig. 10, Table 5)",
    "patching": "Activation patching (section 5.2, appendix F)",
    "attribution": "Where the coordinates are read from: attribution patching over every block "
    "and prompt position",
    "steering": "Do the wall probe directions matter? Steering the anchors along them",
    "false_belief": "False-belief grids: scoring against a known belief",
    "decision": "Where the decision is made: a logit lens and a read-out over reasoning time",
    "run": "Run and configuration",
}
"""Section id -> heading, in page order (tests look for these headings)."""

STAGE_OF_SECTION: dict[str, str] = {
    "behaviour": "behaviour",
    "iso": "iso",
    "keys": "keys",
    "harm": "harm",
    "fog": "fog",
    "intention": "intention",
    "intention_map": "intention_map",
    "probing": "probes",
    "probes": "probes",
    "localisation": "probes",
    "walls": "probes",
    "distance": "distance",
    "belief": "scoring",
    "plans": "plans",
    "patching": "patching",
    "attribution": "attribution",
    "steering": "steering",
    "false_belief": "false_belief",
    "decision": "decision",
}
"""The demo stage behind each data section (for its config and failure record)."""

BUILDERS: dict[str, Callable[[RunReader, Figures], list[Block]]] = {
    "behaviour": behaviour.behaviour,
    "iso": behaviour.iso,
    "keys": behaviour.keys,
    "harm": harm.harm,
    "fog": fog.fog,
    "intention": intention.intention,
    "intention_map": intention.intention_map,
    "probing": probing.probing,
    "probes": probes.probes,
    "localisation": probes.localisation,
    "walls": walls.walls,
    "distance": probes.distance,
    "belief": outcomes.belief,
    "plans": outcomes.plans,
    "patching": outcomes.patching,
    "attribution": attribution.attribution,
    "steering": steering.steering,
    "false_belief": false_belief.false_belief,
    "decision": decision.decision,
}
"""Section id -> the function that builds its blocks from the run."""


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


def _data_section(run: RunReader, section: str, fig: Figures) -> Section:
    stage = STAGE_OF_SECTION[section]
    title = SECTION_TITLES[section]
    failure = run.stage_failure(stage)
    if failure:
        status = "failed" if failure.startswith("failed") else "not_run"
        return Section(section, title, [Box(status, failure)])
    try:
        blocks = BUILDERS[section](run, fig)
    except MissingInput as err:
        return Section(section, title, [Box("not_run", f"not run: {err} (stage {stage})")])
    except (KeyError, IndexError, TypeError, ValueError) as err:
        message = f"failed to draw from stage {stage}'s outputs: {err!r}"
        return Section(section, title, [Box("failed", message)])
    return Section(section, title, blocks, _stage_config(run, stage))


def _run_section(run: RunReader, config: Mapping | None) -> tuple[Table, Table]:
    """The stage records and the demo config."""
    rows = []
    for stage in demo_stages.STAGES:
        record = run.stage_record(stage)
        failure = run.stage_failure(stage)
        if failure:
            rows.append((stage, failure, "–", "–"))
        elif record is not None:
            env = record.get("environment") or {}
            commit = (env.get("commit") or "unknown")[:10] + (
                " (dirty)" if env.get("dirty") else ""
            )
            rows.append(
                (
                    stage,
                    f"finished at {commit}",
                    f"{record.get('seconds', 0):.1f}",
                    ", ".join(sorted(record.get("outputs", {}).values())),
                )
            )
        else:
            rows.append((stage, "not run", "–", "–"))
    if config is None:
        try:
            config = run.json(run.layout.demo_config)
        except MissingInput:
            config = {}
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


def _environment() -> Environment:
    return Environment(
        loader=PackageLoader("goalprobe.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_report(run_dir: str | Path, *, config: Mapping | None = None) -> str:
    """The report of ``run_dir`` as one self-contained HTML page (see :func:`write_report`)."""
    run = RunReader(run_dir)
    fig = Figures()
    stages, demo_config = _run_section(run, config)
    env = _environment()
    return env.get_template("report.html.j2").render(
        titles=SECTION_TITLES,
        run_root=str(run.root.resolve()),
        written=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        stages=stages,
        demo_config=demo_config,
        headline=headline_blocks(run),
        agents=agents.agents(run),
        sections=[_data_section(run, s, fig) for s in BUILDERS],
        plotly_js=Markup(get_plotlyjs()),
    )


def write_report(
    run_dir: str | Path, *, config: Mapping | None = None, out: str | Path | None = None
) -> Path:
    """Write the report of ``run_dir`` (default ``RUN/report.html``) and return its path.

    Args:
        run_dir: the run directory (layout: :mod:`goalprobe.run_layout`).
        config: the demo config to show (default: ``RUN/demo_config.json``).
        out: where to write (default ``RUN/report.html``).
    """
    page = render_report(run_dir, config=config)
    path = Path(out) if out is not None else RunReader(run_dir).layout.report
    return write_atomic(path, page)
