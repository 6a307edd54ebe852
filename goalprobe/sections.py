"""The sections of the demo config that the library has no config for (one per stage), each
a frozen dataclass with a docstring per field; :mod:`goalprobe.config` composes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from goalprobe.activations.extract import ExtractConfig
from goalprobe.agents.prompt_states import PromptStatesConfig
from goalprobe.gridworld.false_belief import FalseBeliefSetConfig
from goalprobe.gridworld.generator import GridSetConfig
from goalprobe.gridworld.harm import HarmGridConfig
from goalprobe.gridworld.intention import IntentionTestConfig
from goalprobe.probes.attribution import AttributionConfig
from goalprobe.probes.patching.experiment import PatchConfig
from goalprobe.probes.plan_sweep import PlanSweepConfig


@dataclass(frozen=True)
class IsoConfig:
    """The iso-difficulty set (section 4.2, Table 3)."""

    transforms: tuple[str, ...] = ("reflect", "rotate90", "start_goal_swap", "transpose")
    """Transforms applied to the base grids (:mod:`goalprobe.gridworld.variants`)."""
    base_grids: int = 0
    """Base grids transformed (spread evenly over the main grid set); 0 transforms every grid.
    At least 30 for an equivalence verdict that can say "equivalent" at a 5-point margin."""
    episodes_per_grid: int = 0
    """Episodes per transformed grid (0: the main rollouts' count)."""
    equivalence_margin: float = 0.05
    """Equivalence margin of the accuracy and success-rate differences (transformed − base):
    "equivalent" when their paired 95% interval lies inside ±margin."""

    def __post_init__(self) -> None:
        if self.base_grids < 0 or self.episodes_per_grid < 0:
            raise ValueError("base_grids and episodes_per_grid must be >= 0")
        if not 0 < self.equivalence_margin < 1:
            raise ValueError(
                f"equivalence_margin must lie in (0, 1), got {self.equivalence_margin}"
            )


@dataclass(frozen=True)
class KeysConfig:
    """The key variants and their matched controls (section 4.3, Table 1)."""

    variants: tuple[str, ...] = (
        "key_door",
        "key_no_door",
        "key_door_control",
        "two_path_key",
        "two_path_no_key",
    )
    """Key variants generated (each with the same layouts)."""
    sizes: tuple[int, ...] = (7, 9)
    """Grid sides."""
    density: float = 0.4
    """Obstacle density."""
    grids_per_size: int = 10
    """Layouts per variant and size."""
    episodes_per_grid: int = 10
    """Trajectories per grid."""
    horizon: int = 30
    """Fixed horizon of every key-variant episode (the study's T = 30)."""
    seed: int = 0
    """Seed of the layouts."""

    def __post_init__(self) -> None:
        if self.grids_per_size < 1 or self.episodes_per_grid < 1 or self.horizon < 1:
            raise ValueError("keys: grids_per_size, episodes_per_grid and horizon must be >= 1")


@dataclass(frozen=True)
class HarmConfig:
    """Reward-harm trade-offs on harm grids (MACHIAVELLI's method)."""

    grids: HarmGridConfig = field(default_factory=HarmGridConfig)
    """The harm grids (flower beds on every shortest path, a bounded harm-free detour)."""
    conditions: tuple[str, ...] = ("neutral", "moral")
    """Prompt conditions run on the same grids: ``neutral`` names the flower beds without a
    penalty, ``moral`` adds the instruction to avoid them (moral conditioning)."""
    episodes_per_grid: int = 2
    """Trajectories per grid and condition (horizon ``ceil(1.5 L)`` as the main rollouts)."""
    random_trajectories: int = 1000
    """Random-agent trajectories per grid behind the behaviour score's baseline (MACHIAVELLI's)."""
    oracle_episodes: int = 20
    """Episodes per grid of each shortest-path oracle reference (harm-blind and harm-avoiding,
    ties broken at random; no model involved), against which the harm verdict is read."""
    harm_weight: float = 5.0
    """Cost of a step on a flower bed under MEG's ``goal_minus_harm`` utility, in steps of
    delay; above ``grids.max_detour`` so that the harm-free route is that utility's optimum."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every interval."""
    seed: int = 0
    """Seed of the random agent and the bootstrap."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.conditions) - {"neutral", "moral"})
        if unknown or not self.conditions or len(set(self.conditions)) != len(self.conditions):
            raise ValueError(
                f"harm: conditions must be distinct names among 'neutral' and 'moral', "
                f"got {self.conditions}"
            )
        if self.oracle_episodes < 0:
            raise ValueError(f"harm: oracle_episodes must be >= 0, got {self.oracle_episodes}")
        if self.episodes_per_grid < 1 or self.random_trajectories < 1 or self.n_bootstrap < 0:
            raise ValueError(
                "harm: episodes_per_grid and random_trajectories must be >= 1, n_bootstrap >= 0"
            )
        if not self.harm_weight > self.grids.max_detour:
            raise ValueError(
                f"harm: harm_weight ({self.harm_weight}) must exceed grids.max_detour "
                f"({self.grids.max_detour})"
            )


@dataclass(frozen=True)
class IntentionConfig:
    """Behavioural intention on the key variants (Ward et al., Definition 20)."""

    variants: tuple[str, ...] = ("key_door", "key_no_door", "two_path_key")
    """Key variants tested, each with its interventions (``gridworld.intention.INTERVENTIONS``)."""
    size: int = 7
    """Grid side."""
    density: float = 0.4
    """Obstacle density."""
    grids_per_variant: int = 14
    """Original layouts per variant (the bootstrap's clusters)."""
    states_per_grid: int = 2
    """Matched states per grid: the first cells of the original's optimal path before the key."""
    samples_per_state: int = 6
    """Actions sampled per state and condition (K); at 14 layouts x 2 states, 6 keeps an agent
    adapting like pi* a quarter of the time from reading "not intended"."""
    irrelevant_change: bool = True
    """Also sample every layout under an irrelevant change (a far wall opened; the optimal
    actions unchanged): an adaptation counts only beyond it (the prompt merely being new)."""
    seed: int = 0
    """Seed of the layouts and of the optimal-policy control's samples."""
    test: IntentionTestConfig = field(default_factory=IntentionTestConfig)
    """Permutations, bootstrap and the thresholds of the verdict."""

    def __post_init__(self) -> None:
        if min(self.grids_per_variant, self.states_per_grid, self.samples_per_state) < 1:
            raise ValueError(
                "intention: grids_per_variant, states_per_grid and samples_per_state must be >= 1"
            )


@dataclass(frozen=True)
class ActivationsConfig:
    """What the extraction stores (section 5)."""

    extract: ExtractConfig = ExtractConfig(batch_size=16, reasoning_every=4)
    """The ``activations`` stage's extraction (the planner adds a token budget that fits the
    device); prompt-only extractions (probing, decoding) take its layers and batches."""
    attn_implementation: str = "agent"
    """Replay attention: ``agent`` (the agent's kernel), ``eager``, ``flex_attention`` (CUDA;
    rows differ from eager's) or ``flex_fp32_sinks`` (FlexAttention, the sinks in fp32)."""

    def __post_init__(self) -> None:
        if self.attn_implementation not in ("agent", "eager", "flex_attention", "flex_fp32_sinks"):
            raise ValueError(
                f"activations.attn_implementation {self.attn_implementation!r}: expected "
                "'agent', 'eager', 'flex_attention' or 'flex_fp32_sinks'"
            )


@dataclass(frozen=True)
class ProbeTraining:
    """How every probe and regressor of a stage is trained."""

    hidden_size: int = 1024
    """MLP hidden width (1024 in the study)."""
    max_epochs: int = 20
    """Most training epochs (early stopping on validation grids)."""
    batch_size: int = 128
    """Training batch size."""
    learning_rate: float = 1e-3
    """Adam learning rate."""


@dataclass(frozen=True)
class ProbesConfig:
    """Cell-type probes (section 5.1, appendix E)."""

    types: tuple[str, ...] = ("coordinate", "per_cell")
    """Probe kinds: the study's coordinate-conditioned probe and per-cell heads."""
    families: tuple[Literal["linear", "mlp"], ...] = ("linear", "mlp")
    """Read-outs."""
    class_balance: str = "upsample"
    """Class weighting of the cell probes (``upsample``: the study's; ``none``: plain
    cross-entropy, which converges on CPU at demo sizes)."""
    coordinates: str = "raw"
    """How the coordinate probe is told the cell (``raw`` row and column, or ``onehot``)."""
    training: ProbeTraining = field(default_factory=ProbeTraining)
    """Training settings."""
    test_fraction: float = 0.2
    """Fraction of grids held out for testing."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every interval."""
    seed: int = 0
    """Seed of the split, the controls, the training and the bootstrap."""
    headline_seeds: int = 5
    """Training seeds of the headline probe on the probing set (``seed`` onwards, same split):
    the headline rows report the seed-pooled intervals; 1: the sweep's single seed."""
    wall_stores: tuple[Literal["probing", "main"], ...] = ("probing",)
    """Stores the conditional wall test reads (both frames, on each sweep's split by grid); the
    probing set only by default: its design is the committed power curve's."""
    wall_stages: tuple[str, ...] = ("pre_reasoning",)
    """Anchor stages of the wall test (every stored layer of each)."""


@dataclass(frozen=True)
class DistanceConfig:
    """Goal-distance regressors (Table 4)."""

    families: tuple[Literal["linear", "quadratic", "mlp"], ...] = ("linear", "quadratic", "mlp")
    """Read-outs: ``linear`` (ridge), ``quadratic`` (degree-2 kernel ridge: a distance from the
    positions a linear read-out finds; the headline's test row) and ``mlp``."""
    training: ProbeTraining = field(default_factory=ProbeTraining)
    """Training settings of the MLP."""
    test_fraction: float = 0.2
    """Fraction of grids held out for testing."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every interval."""
    seed: int = 0
    """Seed of the split, the controls, the training and the bootstrap."""


@dataclass(frozen=True)
class PlanDecoderTraining:
    """The :class:`~goalprobe.probes.plan_decoder.PlanDecoder` hyperparameters the demo sets."""

    d_bottleneck: int = 1024
    """Decoder width (1024 in the study)."""
    n_heads: int = 8
    """Attention heads per decoder layer."""
    max_epochs: int = 100
    """Most epochs."""
    n_iter_no_change: int = 10
    """Epochs without validation improvement before stopping."""


@dataclass(frozen=True)
class PlansConfig:
    """The one-shot plan decoder (section 5.3, Fig. 10, Table 5)."""

    sweep: PlanSweepConfig = field(default_factory=PlanSweepConfig)
    """Capacities, controls, split, bootstrap and seed (empty stages and layers: every stage
    with rows in the store and every stored layer)."""
    decoder: PlanDecoderTraining = field(default_factory=PlanDecoderTraining)
    """Decoder width and training."""


DEMO_PATCH = PatchConfig(
    sites=("grid", "changed_cells", "pre_reasoning", "post_reasoning"),
    layers=("each", "cumulative"),
    anchor_sites=("pre_reasoning", "post_reasoning"),
    regenerate=True,
    max_new_tokens=512,
    reasoning_chunks=4,
    chunk_layers=("peak",),
    chunk_pairs=24,
)
"""The demo's patching (the study's choices): every block alone and the first and last k
blocks at the prompt and anchor sites; greedy reasoning regenerated under each prompt-site patch
(appendix F); 4 chunks of the counterfactual's reasoning patched at the block where the decision
stage's read-out peaks, on the first 24 pairs of each kind. Its ``seed`` also draws the pairs."""


@dataclass(frozen=True)
class PatchingConfig:
    """Activation patching with counterfactual grids (section 5.2, appendix F)."""

    patch: PatchConfig = DEMO_PATCH
    """What is patched and how (:class:`~goalprobe.probes.patching.experiment.PatchConfig`;
    the prompts' reasoning effort and templates are the trajectories')."""
    max_bases: int = 100
    """Most base steps, drawn at random (seeded) from the main rollouts."""
    disjoint_per_move: int = 1
    """Disjoint pairs drawn per base and per move (agent, goal)."""
    control_bases: int | None = None
    """Bases (the first drawn) that also get no-relevant-change control pairs, one per move;
    None: every base."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every interval."""


@dataclass(frozen=True)
class ProbingConfig:
    """The probing set: prompts at sampled states of a grid set of its own, with no rollout
    (pre-reasoning anchors depend on the prompt alone), so that the representational findings
    rest on hundreds of grids (``goalprobe states`` + ``extract --stages pre_reasoning``)."""

    grids: GridSetConfig = field(default_factory=lambda: GridSetConfig(n_per_cell=14, seed=1))
    """The probing grid set (its own seed: disjoint from the behaviour grids)."""
    states: PromptStatesConfig = field(default_factory=lambda: PromptStatesConfig(4))
    """States per grid (the start, then random reachable cells) and their prompts."""
    learning_curve_points: int = 5
    """Training-set sizes of the learning curve (geometric, up to every training grid)."""


@dataclass(frozen=True)
class FalseBeliefConfig:
    """False-belief grids: the prompt draws a grid that differs from the true one in known
    cells, so the agent's belief is known (the oracle belief)."""

    grids: FalseBeliefSetConfig = field(default_factory=FalseBeliefSetConfig)
    """Which pairs (false-belief grid and matched control) of which kinds and size."""
    episodes_per_grid: int = 2
    """Trajectories per grid (horizons follow the main rollouts' rule)."""
    decode: bool = True
    """Apply the headline cell probe to the start-state prompts (needs the probes stage)."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every interval."""
    seed: int = 0
    """Seed of the bootstrap."""

    def __post_init__(self) -> None:
        if self.episodes_per_grid < 1 or self.n_bootstrap < 1:
            raise ValueError("false_belief: episodes_per_grid and n_bootstrap must be >= 1")


@dataclass(frozen=True)
class FogConfig:
    """Fogged grids (the study's Appendix A): the agent sees cells within a radius along lines
    of sight; scored against the free-space planner on what it has seen."""

    grids: GridSetConfig = field(
        default_factory=lambda: GridSetConfig(sizes=(7, 9), densities=(0.4, 1.0), n_per_cell=3)
    )
    """The layouts, fogged (the plain grid set of these settings: same layouts, starts, goals)."""
    radius: int = 3
    """Visibility radius in cells (Chebyshev distance; the study's 3)."""
    episodes_per_grid: int = 2
    """Agent episodes per fogged grid."""
    horizon_factor: float = 3.0
    """Horizon ``ceil(horizon_factor * L)``: exploring under fog takes longer than ``L``."""
    random_walks_per_grid: int = 20
    """Random walks per grid behind the random-walk reference."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every interval."""
    seed: int = 0
    """Seed of the random walks and the bootstrap."""

    def __post_init__(self) -> None:
        if self.radius < 0 or self.episodes_per_grid < 1 or self.random_walks_per_grid < 1:
            raise ValueError(
                "fog: radius must be >= 0, episodes_per_grid and random_walks_per_grid >= 1"
            )
        if not self.horizon_factor > 0 or self.n_bootstrap < 0:
            raise ValueError("fog: horizon_factor must be > 0 and n_bootstrap >= 0")


@dataclass(frozen=True)
class DecisionConfig:
    """Where the decision is made (issue 30): a logit lens on the answer and along the reasoning."""

    max_steps: int = 120
    """Steps read (spread over the grids, the same for every run of a seed); 0 reads none."""
    chunk: int = 8
    """Reasoning tokens per chunk: the lens reads the end of each chunk and the last one."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples of every interval."""
    seed: int = 0
    """Seed of the step sample and the bootstrap."""

    def __post_init__(self) -> None:
        if self.max_steps < 0 or self.chunk < 1 or self.n_bootstrap < 0:
            raise ValueError("decision: max_steps >= 0, chunk >= 1 and n_bootstrap >= 0")


@dataclass(frozen=True)
class AttributionSection:
    """Attribution patching on the patching stage's pairs (``RUN/attribution/``)."""

    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    """The metrics, positions and AtP*'s GradDrop to attribute (:class:`AttributionConfig`)."""
    kinds: tuple[str, ...] = ("disjoint",)
    """Which of the patching stage's pair kinds to attribute (``disjoint``, ``control``)."""
    max_pairs: int = 10
    """Most pairs: the first kept pairs of :attr:`kinds` in ``RUN/patching/patch_pairs.jsonl``."""
    check_pairs: int = 1
    """Pairs (the first attributed) whose attribution is checked against the real patch of
    every affected block x prompt position (:mod:`goalprobe.probes.attribution_check`); 0: none."""
    top_k: int = 5
    """The ``k`` of the check's top-k hit rate."""
    backend: str = "hooks"
    """Capture backend of the gradient runs (``hooks``: GradDrop; ``nnsight``: plain AtP)."""

    def __post_init__(self) -> None:
        if self.max_pairs < 1 or self.check_pairs < 0 or self.top_k < 1:
            raise ValueError("max_pairs and top_k must be >= 1, check_pairs >= 0")
        if not self.kinds or any(k not in ("disjoint", "control") for k in self.kinds):
            raise ValueError(f"kinds must be a subset of ('disjoint', 'control'), got {self.kinds}")
        if self.backend not in ("hooks", "nnsight"):
            raise ValueError(f"backend must be hooks or nnsight, got {self.backend!r}")
        if self.attribution.grad_drop and self.backend != "hooks":
            raise ValueError("GradDrop runs on the hooks backend")
