"""The config of ``goalprobe demo``: one section per stage, composed, with named scales.

:class:`DemoConfig` is made of the configs the stages take (the library's own where one exists:
:class:`~goalprobe.gridworld.generator.GridSetConfig`,
:class:`~goalprobe.agents.rollout.RolloutConfig`,
:class:`~goalprobe.gridworld.behaviour.BehaviourConfig`,
:class:`~goalprobe.probes.plan_sweep.PlanSweepConfig`,
:class:`~goalprobe.probes.scoring.config.ScoreConfig`; the demo's own sections below otherwise).
Each stage receives only the part it uses (``goalprobe/stages/<stage>.py``: ``inputs(config)``),
and its cache key is computed from what it receives, so no table of "which fields matter" can
drift. No I/O here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from goalprobe.agent_config import AgentConfig
from goalprobe.agents.bundled import MAP_AGENT
from goalprobe.agents.prompt_states import PromptStatesConfig
from goalprobe.agents.rollout import RolloutConfig
from goalprobe.gridworld.behaviour import BehaviourConfig
from goalprobe.gridworld.false_belief import FalseBeliefSetConfig
from goalprobe.gridworld.generator import GridSetConfig
from goalprobe.gridworld.harm import HarmGridConfig
from goalprobe.gridworld.intention import IntentionTestConfig
from goalprobe.probes.plan_sweep import PlanSweepConfig
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.sections import (
    ActivationsConfig,
    DistanceConfig,
    FalseBeliefConfig,
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

__all__ = [
    "SCALES",
    "ActivationsConfig",
    "DemoConfig",
    "DistanceConfig",
    "FalseBeliefConfig",
    "HarmConfig",
    "IntentionConfig",
    "IsoConfig",
    "KeysConfig",
    "PatchingConfig",
    "PlanDecoderTraining",
    "PlansConfig",
    "ProbeTraining",
    "ProbesConfig",
    "ProbingConfig",
    "control_config",
    "demo_config",
    "override",
]

SCALES: tuple[str, ...] = ("tiny", "default", "paper")
"""Named scale presets of :func:`demo_config`."""


@dataclass(frozen=True)
class DemoConfig:
    """Everything ``goalprobe demo`` does, one section per stage (see :func:`demo_config`)."""

    scale: str = "default"
    """Name of the preset this config started from (informational)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The agent and the engine that runs it."""
    grids: GridSetConfig = field(default_factory=GridSetConfig)
    """The main grid set (section 4: sizes x densities x grids per cell)."""
    rollouts: RolloutConfig = field(
        default_factory=lambda: RolloutConfig(episodes_per_grid=10, batch_size=64)
    )
    """Main and iso-difficulty rollouts (the key variants use their own horizon and count)."""
    behaviour: BehaviourConfig = field(default_factory=BehaviourConfig)
    """Behavioural metrics and baselines."""
    iso: IsoConfig = field(default_factory=IsoConfig)
    """The iso-difficulty set."""
    keys: KeysConfig = field(default_factory=KeysConfig)
    """The key variants."""
    harm: HarmConfig = field(default_factory=HarmConfig)
    """Reward-harm trade-offs on harm grids (neutral and morally conditioned prompts)."""
    intention: IntentionConfig = field(default_factory=IntentionConfig)
    """Behavioural intention on the key variants (Definition 20)."""
    probing: ProbingConfig = field(default_factory=ProbingConfig)
    """The probing set (prompts at sampled states of its own grids, pre-reasoning anchors)."""
    activations: ActivationsConfig = field(default_factory=ActivationsConfig)
    """The extraction."""
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    """Cell-type probes."""
    distance: DistanceConfig = field(default_factory=DistanceConfig)
    """Goal-distance regressors."""
    plans: PlansConfig = field(default_factory=PlansConfig)
    """The plan decoder."""
    patching: PatchingConfig = field(default_factory=PatchingConfig)
    """Activation patching."""
    scoring: ScoreConfig = field(default_factory=ScoreConfig)
    """Belief scoring and MEG."""
    false_belief: FalseBeliefConfig = field(default_factory=FalseBeliefConfig)
    """False-belief grids: scoring against a known belief."""

    @property
    def seed(self) -> int:
        """The seed every section was given."""
        return self.grids.seed

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (tuples as lists)."""
        return _jsonable(dataclasses.asdict(self))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _sections(seed: int, n_bootstrap: int) -> dict[str, Any]:
    """The paper-scale sections with one seed and one bootstrap size throughout."""
    return dict(
        grids=GridSetConfig(n_per_cell=10, seed=seed),
        rollouts=RolloutConfig(episodes_per_grid=10, batch_size=64, max_new_tokens=4096, seed=seed),
        behaviour=BehaviourConfig(n_bootstrap=n_bootstrap, seed=seed),
        keys=KeysConfig(seed=seed),
        harm=HarmConfig(
            grids=HarmGridConfig(n_grids=50, seed=seed),
            episodes_per_grid=10,
            n_bootstrap=n_bootstrap,
            seed=seed,
        ),
        intention=IntentionConfig(
            grids_per_variant=50,
            states_per_grid=3,
            samples_per_state=10,
            seed=seed,
            test=IntentionTestConfig(n_bootstrap=n_bootstrap, seed=seed),
        ),
        probing=ProbingConfig(
            grids=GridSetConfig(n_per_cell=14, seed=seed + 1),
            states=PromptStatesConfig(states_per_grid=4, seed=seed),
        ),
        probes=ProbesConfig(n_bootstrap=n_bootstrap, seed=seed),
        distance=DistanceConfig(n_bootstrap=n_bootstrap, seed=seed),
        plans=PlansConfig(sweep=PlanSweepConfig(n_bootstrap=n_bootstrap, random_state=seed)),
        patching=PatchingConfig(max_new_tokens=4096, n_bootstrap=n_bootstrap, seed=seed),
        scoring=ScoreConfig(n_bootstrap=n_bootstrap, random_state=seed),
        false_belief=FalseBeliefConfig(
            grids=FalseBeliefSetConfig(size=9, pairs_per_kind=10, seed=seed),
            episodes_per_grid=5,
            n_bootstrap=n_bootstrap,
            seed=seed,
        ),
    )


def _tiny(seed: int) -> dict[str, Any]:
    """CI: a handful of short episodes; every stage runs, nothing is meaningful statistically."""
    n_boot = 100
    training = ProbeTraining(hidden_size=32, max_epochs=2, batch_size=64)
    return dict(
        grids=GridSetConfig(sizes=(7,), densities=(0.0, 0.5, 1.0), n_per_cell=2, seed=seed),
        rollouts=RolloutConfig(
            episodes_per_grid=2, horizon_steps=4, batch_size=64, max_new_tokens=96, seed=seed
        ),
        behaviour=BehaviourConfig(random_walks_per_grid=50, n_bootstrap=n_boot, seed=seed),
        iso=IsoConfig(transforms=("reflect", "start_goal_swap"), base_grids=2),
        keys=KeysConfig(
            variants=("key_door", "key_no_door"),
            sizes=(7,),
            grids_per_size=1,
            episodes_per_grid=1,
            horizon=3,
            seed=seed,
        ),
        harm=HarmConfig(
            grids=HarmGridConfig(n_grids=2, seed=seed),
            episodes_per_grid=1,
            random_trajectories=200,
            n_bootstrap=n_boot,
            seed=seed,
        ),
        intention=IntentionConfig(
            grids_per_variant=2,
            states_per_grid=1,
            samples_per_state=2,
            seed=seed,
            test=IntentionTestConfig(n_permutations=200, n_bootstrap=n_boot, seed=seed),
        ),
        probing=ProbingConfig(
            grids=GridSetConfig(sizes=(7, 9), densities=(0.0, 0.5), n_per_cell=3, seed=seed + 1),
            states=PromptStatesConfig(states_per_grid=3, seed=seed),
            learning_curve_points=3,
        ),
        activations=ActivationsConfig(batch_size=32),
        probes=ProbesConfig(training=training, test_fraction=0.34, n_bootstrap=n_boot, seed=seed),
        distance=DistanceConfig(
            training=training, test_fraction=0.34, n_bootstrap=n_boot, seed=seed
        ),
        plans=PlansConfig(
            sweep=PlanSweepConfig(
                decoder_layers=(1, 2),
                control_decoder_layers=(1,),
                test_fraction=0.34 * 0.75,
                validation_fraction=0.34 * 0.75,
                n_bootstrap=n_boot,
                random_state=seed,
            ),
            decoder=PlanDecoderTraining(
                d_bottleneck=16, n_heads=2, max_epochs=2, n_iter_no_change=1
            ),
        ),
        patching=PatchingConfig(
            sites=("grid", "post_reasoning"),
            layers=("all",),
            max_bases=1,
            require_optimal=False,
            max_new_tokens=96,
            n_bootstrap=n_boot,
            seed=seed,
        ),
        scoring=ScoreConfig(n_bootstrap=n_boot, random_state=seed),
        false_belief=FalseBeliefConfig(
            grids=FalseBeliefSetConfig(size=7, pairs_per_kind=1, seed=seed),
            episodes_per_grid=1,
            n_bootstrap=n_boot,
            seed=seed,
        ),
    )


def _default(seed: int) -> dict[str, Any]:
    """2 CPU cores, <= 15 minutes: the study's protocol (horizons ceil(1.5 L), key variants at
    T = 30 with 70 episodes each, patching with greedy regenerated reasoning and the optimality
    filter) on the study's 5 sizes x 6 densities, and a probing set of 420 grids."""
    n_boot = 1000
    # converges on CPU at demo sizes (best epoch well below the limit on the probing set)
    training = ProbeTraining(hidden_size=128, max_epochs=60, batch_size=32, learning_rate=3e-3)
    return dict(
        grids=GridSetConfig(n_per_cell=2, seed=seed),
        # 128 in flight: about 10% more steps/s than 64 on 2 cores (bench in docs/benchmarks.md)
        rollouts=RolloutConfig(episodes_per_grid=2, batch_size=128, max_new_tokens=256, seed=seed),
        behaviour=BehaviourConfig(random_walks_per_grid=200, n_bootstrap=n_boot, seed=seed),
        # 30 base grids (the equivalence verdict's n), one episode per transformed grid
        iso=IsoConfig(base_grids=30, episodes_per_grid=1),
        keys=KeysConfig(
            variants=("key_door", "key_no_door", "two_path_key", "two_path_no_key"),
            sizes=(7, 9),
            grids_per_size=7,
            episodes_per_grid=5,
            horizon=30,
            seed=seed,
        ),
        harm=HarmConfig(
            grids=HarmGridConfig(n_grids=20, seed=seed),
            episodes_per_grid=2,
            n_bootstrap=n_boot,
            seed=seed,
        ),
        intention=IntentionConfig(
            grids_per_variant=14,
            states_per_grid=2,
            samples_per_state=6,
            seed=seed,
            test=IntentionTestConfig(n_bootstrap=n_boot, seed=seed),
        ),
        probing=ProbingConfig(
            grids=GridSetConfig(n_per_cell=14, seed=seed + 1),
            states=PromptStatesConfig(states_per_grid=4, seed=seed),
        ),
        activations=ActivationsConfig(batch_size=16),
        probes=ProbesConfig(
            types=("coordinate",),
            class_balance="none",
            coordinates="onehot",
            training=training,
            test_fraction=0.25,
            n_bootstrap=n_boot,
            seed=seed,
        ),
        distance=DistanceConfig(
            training=training, test_fraction=0.25, n_bootstrap=n_boot, seed=seed
        ),
        plans=PlansConfig(
            sweep=PlanSweepConfig(
                test_fraction=0.25 * 0.75,
                validation_fraction=0.25 * 0.75,
                n_bootstrap=n_boot,
                random_state=seed,
            ),
            decoder=PlanDecoderTraining(
                d_bottleneck=64, n_heads=4, max_epochs=6, n_iter_no_change=2
            ),
        ),
        patching=PatchingConfig(max_bases=16, max_new_tokens=256, n_bootstrap=n_boot, seed=seed),
        scoring=ScoreConfig(n_bootstrap=n_boot, random_state=seed),
        # 24 grids x 2 episodes of <= ~10 steps: about a minute with the bundled agent
        false_belief=FalseBeliefConfig(
            grids=FalseBeliefSetConfig(size=7, pairs_per_kind=4, seed=seed),
            episodes_per_grid=2,
            n_bootstrap=n_boot,
            seed=seed,
        ),
    )


_PRESETS = {"tiny": _tiny, "default": _default, "paper": lambda seed: {}}


def demo_config(
    scale: str = "default",
    *,
    model: str = "bundled",
    backend: str = "local",
    base_url: str | None = None,
    device: str = "cpu",
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> DemoConfig:
    """The preset config of ``scale`` for one agent and seed.

    Args:
        scale: ``tiny`` (CI), ``default`` (2 CPU cores) or ``paper`` (the study's counts).
        model, backend, base_url, device: the agent (:class:`~goalprobe.agent_config.AgentConfig`).
        seed: the seed of every section.
        overrides: ``{"section.field": value}`` (e.g. ``{"behaviour.random_walks_per_grid": 7}``,
            ``{"probes.training.max_epochs": 3}``) applied after the preset.

    Raises:
        ValueError: an unknown scale, section or field, or an invalid value.
    """
    if scale not in _PRESETS:
        raise ValueError(f"unknown scale {scale!r}; expected one of {SCALES}")
    sections = {**_sections(seed, 1000), **_PRESETS[scale](seed)}
    config = DemoConfig(
        scale=scale,
        agent=AgentConfig(model=model, backend=backend, base_url=base_url, device=device),
        **sections,
    )
    for path, value in (overrides or {}).items():
        config = override(config, path, value)
    return config


def control_config(config: DemoConfig) -> DemoConfig:
    """The positive control's config beside ``config``: the map agent
    (:data:`goalprobe.agents.bundled.MAP_AGENT`) on the same engine and device, every section
    and seed the same (so the same grids, probing set and counterfactuals: paired figures)."""
    return dataclasses.replace(config, agent=dataclasses.replace(config.agent, model=MAP_AGENT))


def override(config: Any, path: str, value: Any) -> Any:
    """A copy of the frozen dataclass ``config`` with the dotted field ``path`` set to ``value``.

    Raises:
        ValueError: no such field, or the value is invalid for it.
    """
    target, parts = config, path.split(".")
    for depth, part in enumerate(parts):
        names = sorted(f.name for f in dataclasses.fields(target))
        if part not in names:
            raise ValueError(f"unknown config field {path!r}: {type(target).__name__} has {names}")
        if depth < len(parts) - 1:
            target = getattr(target, part)
            if not dataclasses.is_dataclass(target):
                raise ValueError(f"unknown config field {path!r}: {part} has no fields")
    head, _, rest = path.partition(".")
    if rest:
        value = override(getattr(config, head), rest, value)
    return dataclasses.replace(config, **{head: value})
