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
from goalprobe.gridworld.behaviour import BehaviourConfig
from goalprobe.gridworld.false_belief import FalseBeliefSetConfig
from goalprobe.gridworld.generator import GridSetConfig
from goalprobe.gridworld.harm import HarmGridConfig
from goalprobe.gridworld.intention import IntentionTestConfig
from goalprobe.probes.plan_sweep import PlanSweepConfig
from goalprobe.probes.steering import SteeringConfig
from goalprobe.sections import (
    DEMO_PATCH,
    ActivationsConfig,
    AttributionSection,
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
    """``config`` with every :data:`STUDY_FIELDS` field, nested sections included, set to
    ``seed`` or ``n_bootstrap``; a ``probing`` section's grids draw ``seed + 1`` (disjoint)."""
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


PAPER: dict[str, Any] = dict(
    grids=GridSetConfig(n_per_cell=10),
    rollouts=RolloutConfig(episodes_per_grid=10, batch_size=64, max_new_tokens=4096),
    harm=HarmConfig(grids=HarmGridConfig(n_grids=50), episodes_per_grid=10),
    intention=IntentionConfig(grids_per_variant=50, states_per_grid=3, samples_per_state=10),
    patching=PatchingConfig(
        patch=dataclasses.replace(DEMO_PATCH, max_new_tokens=4096, full_pairs=24, chunk_pairs=100)
    ),
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
        patch=dataclasses.replace(
            DEMO_PATCH,
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
    # 128 in flight: about 10% more steps/s than 64 on 2 cores
    rollouts=RolloutConfig(episodes_per_grid=2, batch_size=128, max_new_tokens=256),
    behaviour=BehaviourConfig(random_walks_per_grid=200),
    # one symmetry on 60 grids: "equivalent" under no effect 63% of the time (12% at 30 grids)
    iso=IsoConfig(transforms=("reflect",), base_grids=60, episodes_per_grid=1),
    # 20 layouts per variant, 2 episodes each: descriptive rates clustered by layout
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
        # plain cross-entropy: weighting doubles the epochs to converge (over the budget);
        # localisation is read from the position probes
        class_balance="none",
        coordinates="onehot",
        training=_DEFAULT_TRAINING,
        test_fraction=0.25,
    ),
    distance=DistanceConfig(training=_DEFAULT_TRAINING, test_fraction=0.25),
    plans=PlansConfig(
        # 3-fold cross-fitting by grid: every grid is a test grid once; the sweep's ends only
        sweep=PlanSweepConfig(
            decoder_layers=(1, 4),
            control_decoder_layers=(1,),
            n_folds=3,
            validation_fraction=0.25 * 0.75,
        ),
        decoder=PlanDecoderTraining(d_bottleneck=64, n_heads=4, max_epochs=6, n_iter_no_change=2),
    ),
    # >= 100 disjoint pairs at the pre-reasoning anchor (the headline); the dose-response
    # (descriptive) on the first 3 pairs of each kind
    patching=PatchingConfig(
        patch=dataclasses.replace(
            DEMO_PATCH,
            anchor_sites=("pre_reasoning",),
            full_pairs=3,
            max_new_tokens=256,
            batch_size=64,
            regenerate_batch_size=128,
            # 0 of 24 pairs excludes effects above 14%
            chunk_pairs=24,
        ),
        max_bases=130,
        control_bases=24,
    ),
    # 20 pairs per kind: 20-30 changed cells, so a wall following them all shows >= 80%
    false_belief=FalseBeliefConfig(
        grids=FalseBeliefSetConfig(size=7, pairs_per_kind=20), episodes_per_grid=1
    ),
    # 240 steps: a read-out right 70% of the time against a 40% baseline is found 97% of the time
    decision=DecisionConfig(max_steps=240),
    # 10 pairs at <= 2 s each on CPU, the first checked against real patches
    attribution=AttributionSection(max_pairs=10, check_pairs=1),
    steering=SteeringConfig(max_states=100),
    # 12 fogged grids: descriptive at this scale (a verdict on +20 points needs about 43)
    fog=FogConfig(
        grids=GridSetConfig(sizes=(7, 9), densities=(0.4, 1.0), n_per_cell=3), episodes_per_grid=1
    ),
)
"""2 CPU cores, a 15-minute budget: the study's protocol on its 5 sizes x 6 densities, and a
probing set of 420 grids."""

PRESETS: dict[str, dict[str, Any]] = {"tiny": TINY, "default": DEFAULT, "paper": {}}
"""Each scale's sections over :data:`PAPER` (the paper scale changes none)."""

N_BOOTSTRAP: dict[str, int] = {"tiny": 100, "default": 1000, "paper": 1000}
"""Each scale's bootstrap size (every interval of every section)."""
