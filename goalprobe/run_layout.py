"""The one layout of a goalprobe run directory (every layer uses it; nothing else names paths).

A run directory holds one agent's study: ``demo_config.json``, ``provenance.json``, the stage
records ``stages/<stage>.json`` (and ``.failed.json``), one folder per stage with its
``config.json`` and outputs (:data:`ARTEFACTS` lists every file, docs/formats.md its format),
``report.html``, and ``control/``: the positive-control agent's run in the same layout.
``goalprobe demo`` writes it stage by stage; the single-stage verbs, the report and the viewer
find every artefact through :class:`RunLayout`. Paths are plain attributes, so a typo is an
``AttributeError``, not a missing file. Imports nothing but the standard library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Artefact:
    """One named artefact of a run directory: ``name`` for messages, its path ``relative`` to
    the run directory, the ``stage`` that writes it and the verb that writes it alone (``hint``)."""

    name: str
    relative: str
    stage: str
    hint: str = "goalprobe demo"


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (its folder made) through a temporary file and a rename, so
    that a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


class _Path:
    """A :class:`RunLayout` attribute: the absolute path of ``relative`` in the run directory."""

    def __init__(self, relative: str) -> None:
        self.relative = relative

    def __get__(self, layout: RunLayout, owner: type | None = None) -> Path:
        return layout.root / self.relative


class _Entry(_Path):
    """A :class:`RunLayout` attribute that is an :class:`Artefact`: ``stage`` is the first
    folder of ``relative`` unless named, ``verb`` the one that writes it alone (``demo``)."""

    def __init__(self, name: str, relative: str, stage: str = "", verb: str = "demo") -> None:
        super().__init__(relative)
        stage = stage or relative.split("/")[0]
        self.artefact = Artefact(name, relative, stage, f"goalprobe {verb}")


@dataclass(frozen=True)
class RunLayout:
    """Absolute paths of the artefacts of the run directory ``root``."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def path(self, name: str) -> Path:
        """The path of the artefact ``name`` (a key of :data:`ARTEFACTS`)."""
        return self.root / ARTEFACTS[name].relative

    def relative(self, path: Path) -> str:
        """``path`` relative to the run directory, as POSIX text."""
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    # -- bookkeeping ------------------------------------------------------------------------------

    demo_config = _Path("demo_config.json")
    """``demo_config.json``: the demo config of the last call."""

    provenance = _Path("provenance.json")
    """``provenance.json``: commit, command, threads and library versions of the last call."""

    stages_dir = _Path("stages")
    """``stages/``: one record per finished stage."""

    def stage_dir(self, stage: str) -> Path:
        """``<stage>/``: where a stage writes its outputs and ``config.json``."""
        return self.root / stage

    def stage_record(self, stage: str) -> Path:
        """``stages/<stage>.json``: the record of a finished stage."""
        return self.stages_dir / f"{stage}.json"

    def stage_failure(self, stage: str) -> Path:
        """``stages/<stage>.failed.json``: why a stage failed or did not run."""
        return self.stages_dir / f"{stage}.failed.json"

    # -- behaviour --------------------------------------------------------------------------------

    grids = _Entry("grid set", "grids/grids.jsonl", verb="grids")

    trajectories = _Entry("trajectories", "rollouts/trajectories.jsonl", verb="rollout")

    behaviour_metrics = _Entry("behaviour metrics", "behaviour/metrics.json")

    iso_grids = _Entry("iso-difficulty grids", "iso/grids.jsonl")
    """The iso-difficulty (transformed) grids."""

    iso_trajectories = _Entry("iso-difficulty trajectories", "iso/trajectories.jsonl")

    iso_results = _Entry("iso-difficulty results", "iso/results.json")
    """Paired tests of the iso-difficulty transforms."""

    keys_grids = _Entry("key-variant grids", "keys/grids.jsonl")
    """Key-variant grids and their matched controls."""

    keys_trajectories = _Entry("key-variant trajectories", "keys/trajectories.jsonl")

    keys_results = _Entry("key-variant results", "keys/results.json")

    false_belief_grids = _Entry(
        "false-belief grids", "false_belief/grids.jsonl", "false_belief_rollouts"
    )
    """False-belief grids (the prompt draws ``shown``) and their matched controls."""

    false_belief_trajectories = _Entry(
        "false-belief trajectories", "false_belief/trajectories.jsonl", "false_belief_rollouts"
    )

    false_belief_states = _Entry("false-belief states", "false_belief/states.jsonl")
    """Prompt-only start states of the false-belief grids (for the probe's reading)."""

    false_belief_store = _Entry("false-belief store", "false_belief/activations.h5")
    """Pre-reasoning anchors of the false-belief start states."""

    false_belief_results = _Entry("false-belief results", "false_belief/results.json")
    """Oracle-belief scoring and the probe's shown-vs-true reading."""

    false_belief_decoded = _Entry("false-belief decoded maps", "false_belief/decoded_maps.h5")
    """The decoded map of every false-belief step (``goalprobe.step_maps``, for the viewer)."""

    harm_grids = _Entry("harm grids", "harm/grids.jsonl")

    harm_neutral = _Entry("harm trajectories (neutral)", "harm/trajectories_neutral.jsonl")

    harm_moral = _Entry("harm trajectories (moral)", "harm/trajectories_moral.jsonl")

    def harm_trajectories(self, condition: str) -> Path:
        """Rollouts on the harm grids under the prompt ``condition`` (neutral or moral)."""
        return self.path(f"harm trajectories ({condition})")

    fog_grids = _Entry("fog grids", "fog/grids.jsonl")
    """The fogged grids (plain layouts, variant ``fog``)."""

    fog_trajectories = _Entry("fog trajectories", "fog/trajectories.jsonl")

    fog_results = _Entry("fog results", "fog/results.json")
    """Behaviour under fog against the references, with the failure modes."""

    decision_lens = _Entry("decision lens", "decision/lens.json")
    """The logit lens on the answer and along the reasoning (curves per layer)."""

    decision_steps = _Entry("decision steps", "decision/steps.jsonl")
    """The lens of each sampled step chunk by chunk (the viewer's coloured reasoning)."""

    fog_store = _Entry("fog store", "fog/activations.h5", "fog_map")
    """Pre-reasoning anchors of the fogged rollouts (the headline layer)."""

    fog_map_results = _Entry("fog map results", "fog/map.json", "fog_map")
    """The revealed-mask probe and the hidden-wall tracking of the decoded map."""

    harm_results = _Entry("harm results", "harm/results.json")
    """Reward, harm, behaviour scores, the moral-conditioning ablation and MEG."""

    intention_grids = _Entry("intention grids", "intention/grids.jsonl")
    """The key-variant grids of the intention test and their intervened copies."""

    intention_results = _Entry("intention results", "intention/results.json")
    """Behavioural intention: the test per variant and intervention, per-state counts."""

    intention_map_states = _Entry("intention map states", "intention_map/states.jsonl")
    """Prompt-only start states of the intention grids (original and intervened)."""

    intention_map_store = _Entry("intention map store", "intention_map/activations.h5")
    """Their pre-reasoning anchors at the headline layer."""

    intention_map_results = _Entry("intention map results", "intention_map/results.json")
    """The intervened cells as the headline cell probe decodes them."""

    # -- representations --------------------------------------------------------------------------

    probing_grids = _Entry("probing grid set", "probing/grids.jsonl", verb="grids")

    probing_states = _Entry("probing states", "probing/states.jsonl", verb="states")
    """Prompt-only states of the probing grids (a trajectory file without behaviour)."""

    probing_store = _Entry("probing store", "probing/activations.h5", verb="extract")
    """Pre-reasoning anchors of every probing state."""

    probing_probes = _Entry("probing-set probes", "probes/probing", verb="train-probe")
    """Cell-type probes fit on the probing set: ``<sweep>.json`` tables and ``models/``."""

    def probing_probe_sweep(self, name: str) -> Path:
        return self.probing_probes / f"{name}.json"

    def probing_probe_sweeps(self) -> list[Path]:
        """The probing-set cell-probe tables present (``probes/probing/cell_*.json``), sorted."""
        return sorted(self.probing_probes.glob("cell_*.json"))

    learning_curve = _Entry("learning curve", "probes/probing/learning_curve.json")
    """The headline probe's learning curve on the probing set."""

    probing_positions = _Entry("position probes", "probes/probing/positions.json")
    """Agent and goal position probes on the probing set, against their baselines."""

    def position_probe(self, target: str) -> Path:
        """The agent's or the goal's (``target``) position probe of the probing set (headline
        stage and layer; safetensors + JSON card stem)."""
        return self.probing_probes / "models" / f"position_{target}_pre_reasoning"

    wall_readout = _Entry("wall read-out", "probes/wall_readout.json")
    """The conditional wall test in both frames (absolute cells, offsets from the agent) per
    store, stage and layer, with verdicts and power (``goalprobe.wall_readouts/2``)."""

    def wall_probe(self, frame: str) -> Path:
        """The conditional wall probe of ``frame`` (``absolute`` / ``agent``) fit on the probing
        set's training grids at the headline stage and layer: the decoded maps' walls."""
        return self.probing_probes / "models" / f"wall_{frame}_pre_reasoning"

    def headline_maps(self, layer: int) -> Path:
        """The rollouts' steps decoded by the probing-set probes at ``layer`` (cells, agent and
        goal), the maps ``goalprobe score`` reads first."""
        return self.decoded_map(f"headline_pre_reasoning_L{int(layer)}")

    probing_headline_seeds = _Entry("headline probe seeds", "probes/probing/headline_seeds.json")
    """The headline probe under several training seeds, with seed-pooled intervals."""

    probing_distance = _Entry("probing-set distance", "distance/probing", verb="train-probe")
    """Goal-distance regressors fit on the probing set: tables and ``models/``."""

    def probing_distance_sweep(self, name: str) -> Path:
        return self.probing_distance / f"{name}.json"

    store = _Entry("activation store", "activations/activations.h5", verb="extract")

    probe_models = _Entry("probe models", "probes/models", verb="train-probe")

    decoded_dir = _Entry("decoded maps", "probes/decoded", verb="train-probe")
    """Decoded maps, one HDF5 file per probe run."""

    probe_sweeps = _Entry("probe sweeps", "probes/sweeps", verb="train-probe")

    def decoded_map(self, name: str) -> Path:
        """The decoded maps of one probe run (``name`` with or without ``.h5``)."""
        return self.decoded_dir / (name if name.endswith(".h5") else f"{name}.h5")

    def probe_sweep(self, name: str) -> Path:
        return self.probe_sweeps / f"{name}.json"

    def cell_probe_sweeps(self) -> list[Path]:
        """The cell-type probe sweep tables present (``probes/sweeps/cell_*.json``), sorted."""
        return sorted(self.probe_sweeps.glob("cell_*.json"))

    def decoded_maps(self) -> list[Path]:
        """The decoded-map files present (``probes/decoded/*.h5``), sorted."""
        return sorted(self.decoded_dir.glob("*.h5"))

    distance_models = _Entry("distance models", "distance/models", verb="train-probe")

    distance_sweeps = _Entry("distance sweeps", "distance/sweeps", verb="train-probe")

    def distance_sweep(self, name: str) -> Path:
        return self.distance_sweeps / f"{name}.json"

    def distance_sweep_files(self) -> list[Path]:
        """The goal-distance sweep tables present (``distance/sweeps/*.json``), sorted."""
        return sorted(self.distance_sweeps.glob("*.json"))

    plan_sweep = _Entry("plan sweep", "plans/sweep.json", verb="train-plan-decoder")

    plan_models = _Entry("plan models", "plans/models", verb="train-plan-decoder")

    predicted_plans = _Entry(
        "predicted plans", "plans/predicted/plan_decoder.h5", verb="train-plan-decoder"
    )
    """Predicted plans of every decoder run (one HDF5 file)."""

    predicted_plans_dir = _Path("plans/predicted")
    """The folder of predicted-plan files (the viewer lists it)."""

    patch_results = _Entry("patching results", "patching/patch_results.json", verb="patch")
    """Patching records, summary and configuration (JSON)."""

    patch_records_csv = _Entry("patching records", "patching/patch_records.csv", verb="patch")

    patch_heatmap = _Entry("patching heatmap", "patching/patch_heatmap.html", verb="patch")

    patching_dir = _Path("patching")
    """The patching stage's folder (CSV tables and heatmap beside the JSON)."""

    attribution = _Entry("attribution file", "attribution/attribution.json", verb="attribute")
    """The attribution file's card (``attribution.safetensors`` beside it, issue 41)."""

    attribution_heatmap = _Entry(
        "attribution heatmap", "attribution/attribution_heatmap.html", verb="attribute"
    )

    attribution_check = _Path("attribution/attribution_check.json")
    """The attribution's check against real patches (absent when none ran)."""

    steering_results = _Entry("steering results", "steering/results.json")
    """The steering test along the wall probe's directions, with its per-state records."""

    # -- scoring and report -----------------------------------------------------------------------

    scoring_dir = _Path("scoring")
    """Belief scoring and MEG outputs."""

    belief = _Entry("belief scoring", "scoring/belief.json", verb="score")
    """Policy against decoded belief (JSON)."""

    belief_csv = _Path("scoring/belief.csv")
    """Policy against decoded belief, long format (CSV)."""

    meg = _Entry("MEG scoring", "scoring/meg.json", verb="score")
    """MEG on the true and the decoded grids (JSON)."""

    meg_csv = _Path("scoring/meg.csv")
    """MEG aggregates, long format (CSV)."""

    meg_grids_csv = _Path("scoring/meg_grids.csv")
    """MEG per grid (CSV)."""

    scoring_figures = _Entry("scoring figures", "scoring/figures", verb="score")
    """Plotly figures of the scoring (``<name>.json``, ``fig.to_json()``)."""

    def scoring_figure(self, name: str) -> Path:
        return self.scoring_figures / f"{name}.json"

    report = _Entry("report", "report.html", "report")

    @property
    def control(self) -> RunLayout:
        """``control/``: the positive-control agent's run (a run directory of its own)."""
        return RunLayout(self.root / "control")


ARTEFACTS: dict[str, Artefact] = {
    e.artefact.name: e.artefact for e in vars(RunLayout).values() if isinstance(e, _Entry)
}
"""Every artefact a run directory may hold, by name (the viewer lists the missing ones)."""
