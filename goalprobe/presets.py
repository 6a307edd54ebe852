"""The named scales of ``goalprobe demo``: the sections each preset sets, one seed throughout.

:data:`PAPER` is the study's scale; :data:`PRESETS` maps each scale name to the sections it sets
over it, :data:`N_BOOTSTRAP` to its bootstrap size, and :func:`seeded` gives every section the
study's one seed and bootstrap size (:func:`goalprobe.config.demo_config` composes them). No I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from goalprobe.activations.extract import ExtractConfig
from goalprobe.agents.prompt_states import PromptStatesConfig
from goalprobe.agents.rollout import RolloutConfig
from goalprobe.attribution_section import AttributionSection
from goalprobe.gridworld.behaviour import BehaviourConfig
from goalprobe.gridworld.false_belief import FalseBeliefSetConfig
from goalprobe.gridworld.generator import GridSetConfig
from goalprobe.gridworld.harm import HarmGridConfig
from goalprobe.gridworld.intention import IntentionTestConfig
from goalprobe.probes.patching.experiment import PatchConfig
from goalprobe.probes.plan_sweep import PlanSweepConfig
from goalprobe.probes.steering import SteeringConfig
from goalprobe.sections import (
    DEMO_PATCH,
    ActivationsConfig,
    DecisionConfig,
    DistanceConfig,
    FalseBeliefConfig,
    FogConfig,
    HarmConfig,
    IntentionConfig,
    IsoConfig,
    KeysConfig,
    PatchingConfig,
    PlanDecoderTraining,
    PlansConfig,
    ProbesConfig,
    ProbeTraining,
    ProbingConfig,
)

STUDY_FIELDS = ("seed", "random_state", "n_bootstrap")
"""The fields :func:`seeded` sets in every section: the seeds and the bootstrap size."""


def seeded(config: Any, seed: int, n_bootstrap: int) -> Any:
    """``config`` (a frozen dataclass) with every field of :data:`STUDY_FIELDS` in it, nested
    sections included, set to the study's ``seed`` (``seed``, ``random_state``) and
    ``n_bootstrap``; a ``probing`` section's grid set draws ``seed + 1`` (disjoint from the
    behaviour grids)."""
    study = dict(zip(STUDY_FIELDS, (seed, seed, n_bootstrap), strict=True))
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in study:
            changes[f.name] = study[f.name]
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[f.name] = seeded(value, seed, n_bootstrap)
            if f.name == "probing":
                grids = dataclasses.replace(changes[f.name].grids, seed=seed + 1)
                changes[f.name] = dataclasses.replace(changes[f.name], grids=grids)
    return dataclasses.replace(config, **changes)


def demo_patch(**changes: Any) -> PatchConfig:
    """The demo's patching (:data:`~goalprobe.sections.DEMO_PATCH`) with ``changes``."""
    return dataclasses.replace(DEMO_PATCH, **changes)


PAPER: dict[str, Any] = dict(
    grids=GridSetConfig(n_per_cell=10),
    rollouts=RolloutConfig(episodes_per_grid=10, batch_size=64, max_new_tokens=4096),
    harm=HarmConfig(grids=HarmGridConfig(n_grids=50), episodes_per_grid=10),
    intention=IntentionConfig(grids_per_variant=50, states_per_grid=3, samples_per_state=10),
    patching=PatchingConfig(patch=demo_patch(max_new_tokens=4096, full_pairs=24, chunk_pairs=100)),
    false_belief=FalseBeliefConfig(
        grids=FalseBeliefSetConfig(size=9, pairs_per_kind=10), episodes_per_grid=5
    ),
    decision=DecisionConfig(max_steps=600),
    fog=FogConfig(grids=GridSetConfig(densities=(0.4, 1.0), n_per_cell=10), episodes_per_grid=5),
)
"""The paper-scale sections that differ from the sections' defaults."""

_TINY_TRAINING = ProbeTraining(hidden_size=32, max_epochs=2, batch_size=64)

TINY: dict[str, Any] = dict(
    grids=GridSetConfig(sizes=(7,), densities=(0.0, 0.5, 1.0), n_per_cell=2),
    rollouts=RolloutConfig(episodes_per_grid=2, horizon_steps=4, batch_size=64, max_new_tokens=96),
    behaviour=BehaviourConfig(random_walks_per_grid=50),
    iso=IsoConfig(transforms=("reflect", "start_goal_swap"), base_grids=2),
    keys=KeysConfig(
        variants=("key_door", "key_no_door"),
        sizes=(7,),
        grids_per_size=1,
        episodes_per_grid=1,
        horizon=3,
    ),
    harm=HarmConfig(grids=HarmGridConfig(n_grids=2), episodes_per_grid=1, random_trajectories=200),
    intention=IntentionConfig(
        grids_per_variant=2,
        states_per_grid=1,
        samples_per_state=2,
        test=IntentionTestConfig(n_permutations=200),
    ),
    probing=ProbingConfig(
        grids=GridSetConfig(sizes=(7, 9), densities=(0.0, 0.5), n_per_cell=3),
        states=PromptStatesConfig(states_per_grid=3),
        learning_curve_points=3,
    ),
    activations=ActivationsConfig(extract=ExtractConfig(batch_size=32, reasoning_every=4)),
    probes=ProbesConfig(training=_TINY_TRAINING, test_fraction=0.34),
    distance=DistanceConfig(training=_TINY_TRAINING, test_fraction=0.34),
    plans=PlansConfig(
        sweep=PlanSweepConfig(
            decoder_layers=(1, 2),
            control_decoder_layers=(1,),
            test_fraction=0.34 * 0.75,
            validation_fraction=0.34 * 0.75,
        ),
        decoder=PlanDecoderTraining(d_bottleneck=16, n_heads=2, max_epochs=2, n_iter_no_change=1),
    ),
    patching=PatchingConfig(
        patch=demo_patch(
            sites=("grid", "post_reasoning"),
            layers=("all",),
            require_optimal=False,
            max_new_tokens=96,
        ),
        max_bases=1,
    ),
    false_belief=FalseBeliefConfig(
        grids=FalseBeliefSetConfig(size=7, pairs_per_kind=1), episodes_per_grid=1
    ),
    decision=DecisionConfig(max_steps=6),
    # attribution (issue 41): the patching stage's 2 disjoint pairs, the first checked
    # against its real patches (measured in a tiny demo on 2 shared cores: 18 s default
    # agent, 13 s control)
    attribution=AttributionSection(max_pairs=2, check_pairs=1),
    steering=SteeringConfig(max_new_tokens=96),
    fog=FogConfig(
        grids=GridSetConfig(sizes=(7,), densities=(1.0,), n_per_cell=2),
        episodes_per_grid=1,
        horizon_factor=2.0,
        random_walks_per_grid=5,
    ),
)
"""CI: a handful of short episodes; every stage runs, nothing is meaningful statistically."""


# converges on CPU at demo sizes (best epoch well below the limit on the probing set)
_DEFAULT_TRAINING = ProbeTraining(hidden_size=128, max_epochs=60, batch_size=32, learning_rate=3e-3)
DEFAULT: dict[str, Any] = dict(
    grids=GridSetConfig(n_per_cell=2),
    # 128 in flight: about 10% more steps/s than 64 on 2 cores (bench in docs/benchmarks.md)
    rollouts=RolloutConfig(episodes_per_grid=2, batch_size=128, max_new_tokens=256),
    behaviour=BehaviourConfig(random_walks_per_grid=200),
    # one symmetry on all 60 base grids, one episode each: the equivalence verdict reaches
    # "equivalent" under no effect 63% of the time at 60 grids, 12% at 30 (issue 40), for
    # the same 60 episodes as 30 grids x 2 transforms
    iso=IsoConfig(transforms=("reflect",), base_grids=60, episodes_per_grid=1),
    # 20 layouts per variant on 7 x 7 only, 2 episodes each (40 per variant, issue 40:
    # descriptive rates whose intervals are clustered by layout; 28 lost their power)
    keys=KeysConfig(
        variants=("key_door", "key_no_door", "two_path_key", "two_path_no_key"),
        sizes=(7,),
        grids_per_size=20,
        episodes_per_grid=2,
        horizon=30,
    ),
    harm=HarmConfig(grids=HarmGridConfig(n_grids=20), episodes_per_grid=2),
    intention=IntentionConfig(grids_per_variant=14, states_per_grid=2, samples_per_state=6),
    probing=ProbingConfig(learning_curve_points=4),
    activations=ActivationsConfig(extract=ExtractConfig(batch_size=16, reasoning_every=4)),
    probes=ProbesConfig(
        types=("coordinate",),
        # plain cross-entropy: under it three of five seeds of the control's MLP never
        # learnt the rare agent class (issue 40), so the seed-pooled localisation rows say
        # "unstable" (probes/seeds.py) and localisation is read from the position probes;
        # "weighted_loss" took 28 epochs to converge against 13 on demo-shaped data (1.6x
        # the MLP's training time, about a minute per agent: over the 15-minute budget)
        class_balance="none",
        coordinates="onehot",
        training=_DEFAULT_TRAINING,
        test_fraction=0.25,
    ),
    distance=DistanceConfig(training=_DEFAULT_TRAINING, test_fraction=0.25),
    plans=PlansConfig(
        # 3-fold cross-fitting by grid: every one of the 60 grids is a test grid once (>= 50
        # test grids) at 3/5 of 5 folds' training; capacities 1 and 4 (the sweep's ends;
        # 2 layers cost a third of the stage), the shuffled control at 1
        sweep=PlanSweepConfig(
            decoder_layers=(1, 4),
            control_decoder_layers=(1,),
            n_folds=3,
            validation_fraction=0.25 * 0.75,
        ),
        decoder=PlanDecoderTraining(d_bottleneck=64, n_heads=4, max_epochs=6, n_iter_no_change=2),
    ),
    # >= 100 disjoint pairs at the pre-reasoning anchor (the headline; 130 bases keep
    # 143 / 101 for the two agents); the post-reasoning anchor, teacher-forced and so out
    # of the headline (issue 40), only in the dose-response; the dose-response over single
    # blocks and first/last k blocks at every site on the first 3 pairs of each kind
    # (descriptive; the input sanity check has its own 24 regenerated pairs:
    # PatchConfig.sanity_pairs)
    patching=PatchingConfig(
        patch=demo_patch(
            anchor_sites=("pre_reasoning",),
            full_pairs=3,
            max_new_tokens=256,
            batch_size=64,
            regenerate_batch_size=128,
            # 24 pairs of each kind at each reasoning chunk (about 22 s more per agent than
            # 12); a 0 of n beside its exact bound (0 of 24 excludes effects above 14%)
            chunk_pairs=24,
        ),
        max_bases=130,
        control_bases=24,
    ),
    # 20 pairs per kind (120 grids x 1 episode of <= ~10 steps): about 20-30 changed cells per
    # kind at the start states, so a decoded wall that follows the drawn grid on all of them
    # shows >= 80% with its interval (issue 39; 4 pairs gave 5 cells)
    false_belief=FalseBeliefConfig(
        grids=FalseBeliefSetConfig(size=7, pairs_per_kind=20), episodes_per_grid=1
    ),
    # 240 steps: a read-out right 70% of the time against a 40% baseline is found 97% of
    # the time (44% at 60 steps; issue 40)
    decision=DecisionConfig(max_steps=240),
    # attribution (issue 41): 10 of the patching stage's disjoint pairs at <= 2 s each on CPU
    # (preparation + AtP with GradDrop, both metrics: 0.5-0.8 s on 7x7 grids alone, ~2 s on
    # a shared CPU, docs/benchmarks.md) plus the real-patch check of the first (3-6 s on
    # 7x7 alone, 11-16 s shared): estimated 25-40 s per agent
    attribution=AttributionSection(max_pairs=10, check_pairs=1),
    # steering (issue 39 item 6): 100 test states with an edit x 4 regenerations, about 23
    # CPU-seconds for the control (one thread; 77 kept), about 25 s on 2 idle cores
    steering=SteeringConfig(max_states=100),
    # 12 fogged grids x 1 episode at T = ceil(3 L): the bundled agents cannot read the
    # hidden cell (prompt coverage: "n/a"), so the fog rows are descriptive at this scale;
    # a verdict on +20 points needs about 43 grids (issue 40)
    fog=FogConfig(
        grids=GridSetConfig(sizes=(7, 9), densities=(0.4, 1.0), n_per_cell=3), episodes_per_grid=1
    ),
)
"""2 CPU cores, a 15-minute budget (14.2 minutes measured before issue 40, about 14.3
estimated after it: docs/benchmarks.md): the study's protocol (horizons ceil(1.5 L), key
variants at T = 30 with 40 episodes each, patching with greedy regenerated reasoning and the
optimality filter) on the study's 5 sizes x 6 densities, and a probing set of 420 grids."""

PRESETS: dict[str, dict[str, Any]] = {"tiny": TINY, "default": DEFAULT, "paper": {}}
"""Each scale's sections over :data:`PAPER` (the paper scale changes none)."""

N_BOOTSTRAP: dict[str, int] = {"tiny": 100, "default": 1000, "paper": 1000}
"""Each scale's bootstrap size (every interval of every section)."""
