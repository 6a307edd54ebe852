"""The one layout of a goalprobe run directory (every layer uses it; nothing else names paths).

A run directory holds one agent's study: the grid sets, its trajectories, the activation store,
the fitted probes and what was computed from them. ``goalprobe demo`` writes it stage by stage,
the single-stage verbs (``goalprobe score RUN``, ``goalprobe view RUN``) read it, and the
report and the viewer find every artefact through :class:`RunLayout`::

    RUN/demo_config.json                          the demo config of the last call
    RUN/provenance.json                           commit, command, threads, library versions
    RUN/stages/<stage>.json, <stage>.failed.json  stage records (goalprobe.stage/1)
    RUN/<stage>/config.json                       the config the stage received
    RUN/grids/grids.jsonl                         main grid set (goalprobe.gridset)
    RUN/rollouts/trajectories.jsonl               main rollouts (goalprobe.trajectory)
    RUN/behaviour/metrics.json                    behavioural metrics (goalprobe.demo.behaviour)
    RUN/iso/{grids,trajectories}.jsonl, results.json    iso-difficulty set (goalprobe.demo.iso)
    RUN/keys/{grids,trajectories}.jsonl, results.json   key variants (goalprobe.demo.keys)
    RUN/harm/grids.jsonl, trajectories_<condition>.jsonl, results.json  harm grids, neutral
                                                  and moral prompts (goalprobe.demo.harm)
    RUN/fog/{grids,trajectories}.jsonl, results.json   fogged grids (goalprobe.demo.fog)
    RUN/fog/activations.h5, map.json              what the anchors hold under fog (fog_map)
    RUN/decision/lens.json                        logit lens along the reasoning (decision)
    RUN/decision/steps.jsonl                      the lens per step and reasoning chunk (decision)
    RUN/intention/grids.jsonl, results.json       behavioural intention (goalprobe.demo.intention)
    RUN/intention_map/states.jsonl, activations.h5, results.json   the intervention as the
                                                  headline probe decodes it (intention_map)
    RUN/probing/grids.jsonl, states.jsonl, activations.h5     probing set: prompts at sampled
                                                  states of its own grids, pre-reasoning store
    RUN/activations/activations.h5                activation store (goalprobe.activations)
    RUN/false_belief/{grids,trajectories,states}.jsonl, activations.h5, results.json
                                                  false-belief grids (goalprobe.false_belief/1)
    RUN/false_belief/decoded_maps.h5              every step's decoded map (goalprobe.step_maps)
    RUN/probes/models/, decoded/<probe>.h5, sweeps/<sweep>.json   cell-type probes (main store)
    RUN/probes/decoded/headline_pre_reasoning_L<layer>.h5   the rollouts decoded by the probing
                                                  set's probes (cells + position read-outs)
    RUN/probes/probing/<sweep>.json, learning_curve.json, models/ cell-type probes (probing set)
    RUN/probes/probing/models/position_{agent,goal}_pre_reasoning.*  position probes (probing)
    RUN/probes/probing/models/wall_{absolute,agent}_pre_reasoning.*  wall probes (probing)
    RUN/probes/wall_readout.json                  conditional wall test, both frames, per store,
                                                  stage and layer (goalprobe.wall_readouts/1)
    RUN/distance/models/, sweeps/<sweep>.json     goal-distance regressors (main store)
    RUN/distance/probing/<sweep>.json, models/    goal-distance regressors (probing set)
    RUN/plans/sweep.json, models/, predicted/plan_decoder.h5      plan decoder
    RUN/patching/patch_results.json (+ csv, heatmap)              activation patching
    RUN/attribution/attribution.{json,safetensors}, attribution_check.json, heatmap  attribution
    RUN/scoring/belief.json, meg.json (+ csv, figures/<name>.json)  belief scoring and MEG
    RUN/report.html                               the self-contained report
    RUN/control/                                  the positive-control agent's run (the same
                                                  layout; ``goalprobe demo`` without --model)

Paths are plain attributes of a frozen dataclass, so a typo is an ``AttributeError``, not a
missing file. Imports nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Artefact:
    """One named artefact of a run directory.

    Attributes:
        name: what it is, for messages (``"activation store"``).
        relative: its path relative to the run directory.
        stage: the demo stage (and verb) that writes it.
        hint: the command that produces it on its own.
    """

    name: str
    relative: str
    stage: str
    hint: str


ARTEFACTS: dict[str, Artefact] = {
    a.name: a
    for a in (
        Artefact("grid set", "grids/grids.jsonl", "grids", "goalprobe grids"),
        Artefact("trajectories", "rollouts/trajectories.jsonl", "rollouts", "goalprobe rollout"),
        Artefact("behaviour metrics", "behaviour/metrics.json", "behaviour", "goalprobe demo"),
        Artefact("iso-difficulty grids", "iso/grids.jsonl", "iso", "goalprobe demo"),
        Artefact("iso-difficulty trajectories", "iso/trajectories.jsonl", "iso", "goalprobe demo"),
        Artefact("iso-difficulty results", "iso/results.json", "iso", "goalprobe demo"),
        Artefact("key-variant grids", "keys/grids.jsonl", "keys", "goalprobe demo"),
        Artefact("key-variant trajectories", "keys/trajectories.jsonl", "keys", "goalprobe demo"),
        Artefact("key-variant results", "keys/results.json", "keys", "goalprobe demo"),
        Artefact(
            "false-belief grids",
            "false_belief/grids.jsonl",
            "false_belief_rollouts",
            "goalprobe demo",
        ),
        Artefact(
            "false-belief trajectories",
            "false_belief/trajectories.jsonl",
            "false_belief_rollouts",
            "goalprobe demo",
        ),
        Artefact(
            "false-belief states", "false_belief/states.jsonl", "false_belief", "goalprobe demo"
        ),
        Artefact(
            "false-belief store", "false_belief/activations.h5", "false_belief", "goalprobe demo"
        ),
        Artefact(
            "false-belief results", "false_belief/results.json", "false_belief", "goalprobe demo"
        ),
        Artefact(
            "false-belief decoded maps",
            "false_belief/decoded_maps.h5",
            "false_belief",
            "goalprobe demo",
        ),
        Artefact("harm grids", "harm/grids.jsonl", "harm", "goalprobe demo"),
        Artefact(
            "harm trajectories (neutral)",
            "harm/trajectories_neutral.jsonl",
            "harm",
            "goalprobe demo",
        ),
        Artefact(
            "harm trajectories (moral)", "harm/trajectories_moral.jsonl", "harm", "goalprobe demo"
        ),
        Artefact("harm results", "harm/results.json", "harm", "goalprobe demo"),
        Artefact("fog grids", "fog/grids.jsonl", "fog", "goalprobe demo"),
        Artefact("fog trajectories", "fog/trajectories.jsonl", "fog", "goalprobe demo"),
        Artefact("fog results", "fog/results.json", "fog", "goalprobe demo"),
        Artefact("fog store", "fog/activations.h5", "fog_map", "goalprobe demo"),
        Artefact("decision lens", "decision/lens.json", "decision", "goalprobe demo"),
        Artefact("decision steps", "decision/steps.jsonl", "decision", "goalprobe demo"),
        Artefact("fog map results", "fog/map.json", "fog_map", "goalprobe demo"),
        Artefact("intention grids", "intention/grids.jsonl", "intention", "goalprobe demo"),
        Artefact("intention results", "intention/results.json", "intention", "goalprobe demo"),
        Artefact(
            "intention map states", "intention_map/states.jsonl", "intention_map", "goalprobe demo"
        ),
        Artefact(
            "intention map store", "intention_map/activations.h5", "intention_map", "goalprobe demo"
        ),
        Artefact(
            "intention map results", "intention_map/results.json", "intention_map", "goalprobe demo"
        ),
        Artefact("probing grid set", "probing/grids.jsonl", "probing", "goalprobe grids"),
        Artefact("probing states", "probing/states.jsonl", "probing", "goalprobe states"),
        Artefact("probing store", "probing/activations.h5", "probing", "goalprobe extract"),
        Artefact(
            "activation store", "activations/activations.h5", "activations", "goalprobe extract"
        ),
        Artefact("probe models", "probes/models", "probes", "goalprobe train-probe"),
        Artefact("decoded maps", "probes/decoded", "probes", "goalprobe train-probe"),
        Artefact("probe sweeps", "probes/sweeps", "probes", "goalprobe train-probe"),
        Artefact("probing-set probes", "probes/probing", "probes", "goalprobe train-probe"),
        Artefact(
            "learning curve", "probes/probing/learning_curve.json", "probes", "goalprobe demo"
        ),
        Artefact("probing-set distance", "distance/probing", "distance", "goalprobe train-probe"),
        Artefact("position probes", "probes/probing/positions.json", "probes", "goalprobe demo"),
        Artefact(
            "headline probe seeds", "probes/probing/headline_seeds.json", "probes", "goalprobe demo"
        ),
        Artefact("wall read-out", "probes/wall_readout.json", "probes", "goalprobe demo"),
        Artefact("distance models", "distance/models", "distance", "goalprobe train-probe"),
        Artefact("distance sweeps", "distance/sweeps", "distance", "goalprobe train-probe"),
        Artefact("plan sweep", "plans/sweep.json", "plans", "goalprobe train-plan-decoder"),
        Artefact("plan models", "plans/models", "plans", "goalprobe train-plan-decoder"),
        Artefact(
            "predicted plans",
            "plans/predicted/plan_decoder.h5",
            "plans",
            "goalprobe train-plan-decoder",
        ),
        Artefact("patching results", "patching/patch_results.json", "patching", "goalprobe patch"),
        Artefact("patching records", "patching/patch_records.csv", "patching", "goalprobe patch"),
        Artefact("patching heatmap", "patching/patch_heatmap.html", "patching", "goalprobe patch"),
        Artefact(
            "attribution file", "attribution/attribution.json", "attribution", "goalprobe attribute"
        ),
        Artefact(
            "attribution heatmap",
            "attribution/attribution_heatmap.html",
            "attribution",
            "goalprobe attribute",
        ),
        Artefact("belief scoring", "scoring/belief.json", "scoring", "goalprobe score"),
        Artefact("MEG scoring", "scoring/meg.json", "scoring", "goalprobe score"),
        Artefact("scoring figures", "scoring/figures", "scoring", "goalprobe score"),
        Artefact("report", "report.html", "report", "goalprobe demo"),
    )
}
"""Every artefact a run directory may hold, by name (the viewer lists the missing ones)."""


@dataclass(frozen=True)
class RunLayout:
    """Absolute paths of the artefacts of the run directory ``root``.

    Attributes:
        root: the run directory.
    """

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

    @property
    def demo_config(self) -> Path:
        """``demo_config.json``: the demo config of the last call."""
        return self.root / "demo_config.json"

    @property
    def provenance(self) -> Path:
        """``provenance.json``: commit, command, threads and library versions of the last call
        (schema ``goalprobe.provenance/1``)."""
        return self.root / "provenance.json"

    @property
    def stages_dir(self) -> Path:
        """``stages/``: one record per finished stage."""
        return self.root / "stages"

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

    @property
    def grids(self) -> Path:
        """The main grid set."""
        return self.path("grid set")

    @property
    def trajectories(self) -> Path:
        """The main rollouts."""
        return self.path("trajectories")

    @property
    def behaviour_metrics(self) -> Path:
        """Behavioural metrics of the main rollouts."""
        return self.path("behaviour metrics")

    @property
    def iso_grids(self) -> Path:
        """The iso-difficulty (transformed) grids."""
        return self.path("iso-difficulty grids")

    @property
    def iso_trajectories(self) -> Path:
        """Rollouts on the iso-difficulty grids."""
        return self.path("iso-difficulty trajectories")

    @property
    def iso_results(self) -> Path:
        """Paired tests of the iso-difficulty transforms."""
        return self.path("iso-difficulty results")

    @property
    def keys_grids(self) -> Path:
        """Key-variant grids and their matched controls."""
        return self.path("key-variant grids")

    @property
    def keys_trajectories(self) -> Path:
        """Rollouts on the key-variant grids."""
        return self.path("key-variant trajectories")

    @property
    def keys_results(self) -> Path:
        """Key-variant metrics."""
        return self.path("key-variant results")

    @property
    def false_belief_grids(self) -> Path:
        """False-belief grids (the prompt draws ``shown``) and their matched controls."""
        return self.path("false-belief grids")

    @property
    def false_belief_trajectories(self) -> Path:
        """Rollouts on the false-belief grids."""
        return self.path("false-belief trajectories")

    @property
    def false_belief_states(self) -> Path:
        """Prompt-only start states of the false-belief grids (for the probe's reading)."""
        return self.path("false-belief states")

    @property
    def false_belief_store(self) -> Path:
        """Pre-reasoning anchors of the false-belief start states."""
        return self.path("false-belief store")

    @property
    def false_belief_results(self) -> Path:
        """Oracle-belief scoring and the probe's shown-vs-true reading."""
        return self.path("false-belief results")

    @property
    def false_belief_decoded(self) -> Path:
        """The decoded map of every false-belief step (``goalprobe.step_maps``, for the viewer)."""
        return self.path("false-belief decoded maps")

    @property
    def harm_grids(self) -> Path:
        """Harm grids (flower beds on every shortest path)."""
        return self.path("harm grids")

    def harm_trajectories(self, condition: str) -> Path:
        """Rollouts on the harm grids under the prompt ``condition`` (neutral or moral)."""
        return self.path(f"harm trajectories ({condition})")

    @property
    def fog_grids(self) -> Path:
        """The fogged grids (plain layouts, variant ``fog``)."""
        return self.path("fog grids")

    @property
    def fog_trajectories(self) -> Path:
        """The agent's rollouts on the fogged grids."""
        return self.path("fog trajectories")

    @property
    def fog_results(self) -> Path:
        """Behaviour under fog against the references, with the failure modes."""
        return self.path("fog results")

    @property
    def decision_lens(self) -> Path:
        """The logit lens on the answer and along the reasoning (curves per layer)."""
        return self.path("decision lens")

    @property
    def decision_steps(self) -> Path:
        """The lens of each sampled step chunk by chunk (the viewer's coloured reasoning)."""
        return self.path("decision steps")

    @property
    def fog_store(self) -> Path:
        """Pre-reasoning anchors of the fogged rollouts (the headline layer)."""
        return self.path("fog store")

    @property
    def fog_map_results(self) -> Path:
        """The revealed-mask probe and the hidden-wall tracking of the decoded map."""
        return self.path("fog map results")

    @property
    def harm_results(self) -> Path:
        """Reward, harm, behaviour scores, the moral-conditioning ablation and MEG."""
        return self.path("harm results")

    @property
    def intention_grids(self) -> Path:
        """The key-variant grids of the intention test and their intervened copies."""
        return self.path("intention grids")

    @property
    def intention_results(self) -> Path:
        """Behavioural intention: the test per variant and intervention, per-state counts."""
        return self.path("intention results")

    @property
    def intention_map_states(self) -> Path:
        """Prompt-only start states of the intention grids (original and intervened)."""
        return self.path("intention map states")

    @property
    def intention_map_store(self) -> Path:
        """Their pre-reasoning anchors at the headline layer."""
        return self.path("intention map store")

    @property
    def intention_map_results(self) -> Path:
        """The intervened cells as the headline cell probe decodes them."""
        return self.path("intention map results")

    # -- representations --------------------------------------------------------------------------

    @property
    def probing_grids(self) -> Path:
        """The probing set's grids (disjoint from the behaviour grids)."""
        return self.path("probing grid set")

    @property
    def probing_states(self) -> Path:
        """Prompt-only states of the probing grids (a trajectory file without behaviour)."""
        return self.path("probing states")

    @property
    def probing_store(self) -> Path:
        """Pre-reasoning anchors of every probing state."""
        return self.path("probing store")

    @property
    def probing_probes(self) -> Path:
        """Cell-type probes fit on the probing set: ``<sweep>.json`` tables and ``models/``."""
        return self.path("probing-set probes")

    def probing_probe_sweep(self, name: str) -> Path:
        """``probes/probing/<name>.json``."""
        return self.probing_probes / f"{name}.json"

    def probing_probe_sweeps(self) -> list[Path]:
        """The probing-set cell-probe tables present (``probes/probing/cell_*.json``), sorted."""
        return sorted(self.probing_probes.glob("cell_*.json"))

    @property
    def learning_curve(self) -> Path:
        """The headline probe's learning curve on the probing set."""
        return self.path("learning curve")

    @property
    def probing_positions(self) -> Path:
        """Agent and goal position probes on the probing set, against their baselines."""
        return self.path("position probes")

    def position_probe(self, target: str) -> Path:
        """``probes/probing/models/position_<target>_pre_reasoning``: the agent's (``target``
        ``"agent"``) or the goal's position probe of the probing set (headline stage and layer;
        safetensors + JSON card stem)."""
        return self.probing_probes / "models" / f"position_{target}_pre_reasoning"

    @property
    def wall_readout(self) -> Path:
        """The conditional wall test in both frames (absolute cells, offsets from the agent) per
        store, stage and layer, with verdicts and power (``goalprobe.wall_readouts/1``)."""
        return self.path("wall read-out")

    def wall_probe(self, frame: str) -> Path:
        """``probes/probing/models/wall_<frame>_pre_reasoning``: the conditional wall probe of
        ``frame`` (``absolute`` / ``agent``) fit on the probing set's training grids at the
        headline stage and layer (safetensors + JSON card stem), the decoded maps' walls."""
        return self.probing_probes / "models" / f"wall_{frame}_pre_reasoning"

    def headline_maps(self, layer: int) -> Path:
        """``probes/decoded/headline_pre_reasoning_L<layer>.h5``: the rollouts' steps decoded by
        the probing-set probes (cells from the headline cell probe, agent and goal from the
        position probes), the maps ``goalprobe score`` reads first."""
        return self.decoded_map(f"headline_pre_reasoning_L{int(layer)}")

    @property
    def probing_headline_seeds(self) -> Path:
        """The headline probe under several training seeds, with seed-pooled intervals."""
        return self.path("headline probe seeds")

    @property
    def probing_distance(self) -> Path:
        """Goal-distance regressors fit on the probing set: tables and ``models/``."""
        return self.path("probing-set distance")

    def probing_distance_sweep(self, name: str) -> Path:
        """``distance/probing/<name>.json``."""
        return self.probing_distance / f"{name}.json"

    @property
    def store(self) -> Path:
        """The activation store."""
        return self.path("activation store")

    @property
    def probe_models(self) -> Path:
        """Fitted cell-type probes (safetensors + JSON cards)."""
        return self.path("probe models")

    @property
    def decoded_dir(self) -> Path:
        """Decoded maps, one HDF5 file per probe run."""
        return self.path("decoded maps")

    @property
    def probe_sweeps(self) -> Path:
        """Cell-type probe sweep tables."""
        return self.path("probe sweeps")

    def decoded_map(self, name: str) -> Path:
        """``probes/decoded/<name>.h5``: the decoded maps of one probe run (``name`` with or
        without the ``.h5`` suffix)."""
        return self.decoded_dir / (name if name.endswith(".h5") else f"{name}.h5")

    def probe_sweep(self, name: str) -> Path:
        """``probes/sweeps/<name>.json``."""
        return self.probe_sweeps / f"{name}.json"

    def cell_probe_sweeps(self) -> list[Path]:
        """The cell-type probe sweep tables present (``probes/sweeps/cell_*.json``), sorted."""
        return sorted(self.probe_sweeps.glob("cell_*.json"))

    def decoded_maps(self) -> list[Path]:
        """The decoded-map files present (``probes/decoded/*.h5``), sorted."""
        return sorted(self.decoded_dir.glob("*.h5"))

    @property
    def distance_models(self) -> Path:
        """Fitted goal-distance regressors."""
        return self.path("distance models")

    @property
    def distance_sweeps(self) -> Path:
        """Goal-distance sweep tables."""
        return self.path("distance sweeps")

    def distance_sweep(self, name: str) -> Path:
        """``distance/sweeps/<name>.json``."""
        return self.distance_sweeps / f"{name}.json"

    def distance_sweep_files(self) -> list[Path]:
        """The goal-distance sweep tables present (``distance/sweeps/*.json``), sorted."""
        return sorted(self.distance_sweeps.glob("*.json"))

    @property
    def plan_sweep(self) -> Path:
        """The plan-decoder sweep table."""
        return self.path("plan sweep")

    @property
    def plan_models(self) -> Path:
        """Fitted plan decoders."""
        return self.path("plan models")

    @property
    def predicted_plans(self) -> Path:
        """Predicted plans of every decoder run (one HDF5 file)."""
        return self.path("predicted plans")

    @property
    def predicted_plans_dir(self) -> Path:
        """The folder of predicted-plan files (the viewer lists it)."""
        return self.predicted_plans.parent

    @property
    def patch_results(self) -> Path:
        """Patching records, summary and configuration (JSON)."""
        return self.path("patching results")

    @property
    def patch_records_csv(self) -> Path:
        """Patching records (CSV)."""
        return self.path("patching records")

    @property
    def patch_heatmap(self) -> Path:
        """Site x layers heatmaps of the patching summary (self-contained HTML)."""
        return self.path("patching heatmap")

    @property
    def patching_dir(self) -> Path:
        """The patching stage's folder (CSV tables and heatmap beside the JSON)."""
        return self.patch_results.parent

    @property
    def attribution(self) -> Path:
        """The attribution file's card (``attribution.safetensors`` beside it, issue 41)."""
        return self.path("attribution file")

    @property
    def attribution_check(self) -> Path:
        """The attribution's check against real patches (absent when none ran)."""
        return self.attribution.parent / "attribution_check.json"

    # -- scoring and report -----------------------------------------------------------------------

    @property
    def scoring_dir(self) -> Path:
        """Belief scoring and MEG outputs."""
        return self.belief.parent

    @property
    def belief(self) -> Path:
        """Policy against decoded belief (JSON)."""
        return self.path("belief scoring")

    @property
    def belief_csv(self) -> Path:
        """Policy against decoded belief, long format (CSV)."""
        return self.scoring_dir / "belief.csv"

    @property
    def meg(self) -> Path:
        """MEG on the true and the decoded grids (JSON)."""
        return self.path("MEG scoring")

    @property
    def meg_csv(self) -> Path:
        """MEG aggregates, long format (CSV)."""
        return self.scoring_dir / "meg.csv"

    @property
    def meg_grids_csv(self) -> Path:
        """MEG per grid (CSV)."""
        return self.scoring_dir / "meg_grids.csv"

    @property
    def scoring_figures(self) -> Path:
        """Plotly figures of the scoring (``<name>.json``, ``fig.to_json()``)."""
        return self.path("scoring figures")

    def scoring_figure(self, name: str) -> Path:
        """``scoring/figures/<name>.json``."""
        return self.scoring_figures / f"{name}.json"

    @property
    def report(self) -> Path:
        """The self-contained HTML report."""
        return self.path("report")

    @property
    def control(self) -> RunLayout:
        """``control/``: the run of the positive-control agent beside this run's agent (a run
        directory of its own, the same layout; the report shows the two side by side)."""
        return RunLayout(self.root / "control")
