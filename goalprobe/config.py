"""The config of ``goalprobe demo``: one section per stage, composed, with named scales.

:class:`DemoConfig` is made of the configs the stages take (the library's own where one exists:
:class:`~goalprobe.gridworld.generator.GridSetConfig`,
:class:`~goalprobe.agents.rollout.RolloutConfig`,
:class:`~goalprobe.gridworld.behaviour.BehaviourConfig`,
:class:`~goalprobe.probes.plan_sweep.PlanSweepConfig`,
:class:`~goalprobe.probes.scoring.config.ScoreConfig`; the demo's own sections below otherwise).
Each stage receives only the part it declares (its ``STAGE``), and its cache key is computed
from what it receives. No I/O here.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from dataclasses import dataclass, field
from typing import Any, cast

from goalprobe.agents.agent_config import AgentConfig
from goalprobe.agents.bundled import MAP_AGENT, token_budget
from goalprobe.agents.preflight import PreflightConfig
from goalprobe.agents.rollout import RolloutConfig
from goalprobe.gridworld.behaviour import BehaviourConfig
from goalprobe.gridworld.generator import GridSetConfig
from goalprobe.presets import N_BOOTSTRAP, PAPER, PRESETS, seeded
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.probes.steering import SteeringConfig
from goalprobe.sections import (
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
    PlansConfig,
    ProbesConfig,
    ProbingConfig,
)

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
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    """The pre-flight before the rollouts of a model other than the bundled ones."""
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
    fog: FogConfig = field(default_factory=FogConfig)
    """Fogged grids (partial observability): behaviour against the free-space planner."""
    decision: DecisionConfig = field(default_factory=DecisionConfig)
    """Where the decision is made: a logit lens on the answer and along the reasoning."""
    attribution: AttributionSection = field(default_factory=AttributionSection)
    """Attribution patching over every block x prompt position of the patching stage's pairs."""
    steering: SteeringConfig = field(default_factory=SteeringConfig)
    """Steering the pre-reasoning anchors along the wall probe's directions (probing set)."""

    @property
    def seed(self) -> int:
        """The seed every section was given."""
        return self.grids.seed

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (tuples as lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


def demo_config(
    scale: str = "default",
    *,
    model: str = "bundled",
    backend: str = "local",
    base_url: str | None = None,
    device: str = "cpu",
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    chat_format: Any = None,
) -> DemoConfig:
    """The preset config of ``scale`` for one agent and seed.

    Args:
        scale: ``tiny`` (CI), ``default`` (2 CPU cores) or ``paper`` (the study's counts).
        model, backend, base_url, device: the agent (:class:`~goalprobe.agents.agent_config.AgentConfig`).
        seed: the seed of every section.
        overrides: ``{"section.field": value}`` (e.g. ``{"behaviour.random_walks_per_grid": 7}``,
            ``{"probes.training.max_epochs": 3}``) applied after the preset.
        chat_format: the agent's :class:`~goalprobe.agents.chat_format.ChatFormat`: its name
            goes to ``agent.chat_format`` and it sizes the token budgets (:func:`fit_budgets`);
            None: detected when the agent runs, budgeted as harmony.

    Raises:
        ValueError: an unknown scale, section or field, or an invalid value.
    """
    if scale not in PRESETS:
        raise ValueError(f"unknown scale {scale!r}; expected one of {SCALES}")
    agent = AgentConfig(
        model=model,
        backend=backend,
        base_url=base_url,
        device=device,
        chat_format=None if chat_format is None else chat_format.name,
    )
    preset = DemoConfig(scale=scale, agent=agent, **{**PAPER, **PRESETS[scale]})
    config = seeded(preset, seed, N_BOOTSTRAP[scale])
    for path, value in (overrides or {}).items():
        config = override(config, path, value)
    if config.activations.attn_implementation == "flex_attention" and not device.startswith("cuda"):
        raise ValueError(
            f"activations.attn_implementation={config.activations.attn_implementation} needs "
            f"--device cuda (GPT-OSS's attention sinks run under flex attention on CUDA only), "
            f"not {device!r}"
        )
    fixed = {resolve_path(config, path) for path in overrides or ()}
    if config.agent.backend == "oracle":  # one replace: PatchConfig checks them together
        changes = {k.rsplit(".", 1)[1]: v for k, v in ORACLE_PATCHING.items() if k not in fixed}
        patch = dataclasses.replace(config.patching.patch, **changes)
        config = override(config, "patching.patch", patch)
    return fit_budgets(config, fixed, chat_format)


ORACLE_PATCHING: dict[str, Any] = {
    "patching.patch.reasoning": "oracle",
    "patching.patch.reasoning_chunks": 0,
}
"""What the oracle engine (``agent.backend="oracle"``) changes in patching unless ``--set``:
the oracle's reasoning teacher-forced, as its episodes were written (a model that cannot do the
task never closes a greedy reasoning, so every pair would be dropped as truncated), and no
reasoning chunks (they need the base's own greedy run)."""


def fit_budgets(
    config: DemoConfig, fixed: frozenset[str] | set[str] = frozenset(), chat_format: Any = None
) -> DemoConfig:
    """``config`` with rollout, patching and steering token budgets that fit its agent
    (:func:`goalprobe.agents.bundled.token_budget`), except fields in ``fixed`` (set by the
    user), at the ``tiny`` scale, and the oracle engine's rollouts (a few dozen tokens a step)."""
    for path in ("rollouts.max_new_tokens", "patching.patch.max_new_tokens",
                 "steering.max_new_tokens"):  # fmt: skip
        oracle = config.agent.backend == "oracle" and path.startswith("rollouts.")
        if config.scale != "tiny" and path not in fixed and not oracle:
            small = operator.attrgetter(path)(config)
            effort = config.rollouts.reasoning_effort
            budget = token_budget(config.agent.model, effort, small, chat_format)
            config = override(config, path, budget)
    return config


def control_config(config: DemoConfig) -> DemoConfig:
    """The positive control's config beside ``config``: the map agent
    (:data:`goalprobe.agents.bundled.MAP_AGENT`), everything else the same (paired figures)."""
    return dataclasses.replace(config, agent=dataclasses.replace(config.agent, model=MAP_AGENT))


def override(config: Any, path: str, value: Any) -> Any:
    """A copy of the frozen dataclass ``config`` with the dotted field ``path`` set to ``value``
    (:func:`resolve_path`: ``patching.batch_size`` sets ``patching.patch.batch_size``).

    Raises:
        ValueError: no such field, or the value is invalid for it.
    """
    path = resolve_path(config, path)
    head, _, rest = path.partition(".")
    if rest:
        value = override(getattr(config, head), rest, value)
    return dataclasses.replace(config, **{head: value})


def resolve_path(config: Any, path: str) -> str:
    """The dotted field ``path`` of ``config`` as the config nests it: below a section, a field
    of an embedded config may be named without it when unambiguous (``patching.batch_size`` is
    ``patching.patch.batch_size``).

    Raises:
        ValueError: no such field (the message lists the fields there), or an ambiguous one.
    """
    target, parts, out = config, path.split("."), []
    for depth, part in enumerate(parts):
        fields = dataclasses.fields(target)
        names = sorted(f.name for f in fields)
        if part not in names:
            hosts = [
                f.name
                for f in fields
                if depth > 0
                and dataclasses.is_dataclass(getattr(target, f.name))
                and part in {g.name for g in dataclasses.fields(getattr(target, f.name))}
            ]
            if len(hosts) != 1:
                raise ValueError(
                    f"unknown config field {path!r}: {type(target).__name__} has {names}"
                    + (f" ({part} is in {hosts}: name one)" if hosts else "")
                )
            out.append(hosts[0])
            target = getattr(target, hosts[0])
        out.append(part)
        if depth < len(parts) - 1:
            target = getattr(target, part)
            if not dataclasses.is_dataclass(target):
                raise ValueError(f"unknown config field {path!r}: {part} has no fields")
    return ".".join(out)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """The frozen dataclass ``cls`` from its JSON form (:meth:`DemoConfig.to_dict`): lists
    become tuples, nested sections their dataclasses.

    Raises:
        ValueError: a field ``cls`` does not have, or a value its checks refuse.
    """
    import typing

    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            values[name] = from_dict(cast(type, kind), value)
        else:
            values[name] = _tuples(value)
    return cls(**values)


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
