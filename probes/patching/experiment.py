"""The patching experiment: its config, and the counterfactual pairs prepared for patching
(:mod:`goalprobe.probes.patching.patched_runs` patches them).

Both sides of each :class:`~goalprobe.probes.patching.counterfactuals.CounterfactualPair` get a
teacher-forced sequence (prompt + own reasoning + answer prefix,
:mod:`goalprobe.probes.patching.sites`) and one clean run capturing every position a site may
read; per direction the *source* side's values are written into the *target* side's run
(``"base_to_cf"`` or ``"cf_to_base"``).

The reasoning held fixed (:attr:`PatchConfig.reasoning`): ``"recorded"`` (the base's recorded
completion, the counterfactual's greedy one), ``"greedy"`` or ``"oracle"`` (the bundled agent's
reasoning text with an optimal plan). ``regenerate=True`` also patches the prompt sites into a
greedy *generation* whose parsed action is the outcome. ``reasoning_chunks=n`` patches the
reasoning itself, cf -> base, up to the end of chunk ``i`` of ``n``
(:func:`~goalprobe.probes.patching.sites.chunk_positions`), the rest regenerated. By default only
pairs optimal on both sides are kept (``require_optimal``), so capability does not confound.

**Memory plan.** Each patched copy holds ``3 x heads x S x (P + S + 1)`` eager attention scores,
so at the paper's scale a batch of 16 copies exceeds an A100. The greedy completions come first
and take hours, so :func:`plan_patching` plans before them and refuses a run whose longest
sequence does not fit one copy (:class:`PatchingDoesNotFitError`, naming the budget that would
fit). Each forward pass then takes the largest batch that fits at its lengths, capped by the
config, halving on an out-of-memory error (:class:`~goalprobe.agents.oom.HalvingBatch`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from goalprobe.activations.capture.base import CleanRun, ResidualBackend
from goalprobe.activations.extract import default_layers
from goalprobe.activations.plan import (
    GB,
    ModelShape,
    device_memory_bytes,
    generation_bytes,
    loaded_weights_bytes,
    patched_run_bytes,
    planned_attention,
)
from goalprobe.agents.backend import SamplingConfig
from goalprobe.agents.chat_format import chat_format_for
from goalprobe.agents.harmony import ReasoningEffort, split_completion
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.oom import HalvingBatch
from goalprobe.agents.parser import parse_completion
from goalprobe.agents.prompts import PromptTemplate, build_messages, uses_key_prompt
from goalprobe.agents.reasoning import PLAN_STEPS, reasoning_text
from goalprobe.gridworld.core import Action, Grid, State
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render
from goalprobe.probes.patching.counterfactuals import BaseState, CounterfactualPair
from goalprobe.probes.patching.sites import (
    DEFAULT_SITES,
    SITES,
    ActionTokens,
    SequenceError,
    TeacherForcedSequence,
    build_sequence,
    capture_positions,
    check_aligned,
    reasoning_ids,
)

DIRECTIONS: tuple[str, ...] = ("base_to_cf", "cf_to_base")
REASONING_MODES: tuple[str, ...] = ("recorded", "greedy", "oracle")
ReasoningMode = Literal["recorded", "greedy", "oracle"]


@dataclass(frozen=True)
class PatchConfig:
    """What to patch and how (no I/O).

    Attributes:
        sites: patch sites (:data:`goalprobe.probes.patching.sites.SITES`).
        layers: layer-set specs, each patched as one run (:func:`resolve_layer_sets`): ``"thirds"``,
            ``"each"``, ``"cumulative"`` (``first<k>`` / ``last<k>``), ``"all"``, ``"7"``, ``"-1"``,
            ``"7+15"``.
        directions: ``"base_to_cf"`` and/or ``"cf_to_base"``.
        reasoning: ``"recorded"``, ``"greedy"`` or ``"oracle"`` (module docstring).
        require_optimal: keep only pairs whose unpatched action is optimal on both sides.
        regenerate: also regenerate the reasoning under the patch (prompt sites only).
        max_new_tokens: token budget of every greedy completion.
        batch_size: patched copies per forward pass (and prompts per greedy-completion call).
        regenerate_batch_size: regenerations per decoding loop, pooled across pairs.
        anchor_sites, anchor_layers: what every kept pair is patched at (the headline's power).
        full_pairs: pairs of each kind patched at every site x layer set; None: all.
        random_control: also patch disjoint targets with a random other grid of the same size
            (drawn with ``seed``) at the anchor layers: kind ``"random_grid"``.
        seed: seed of the random-grid draw.
        reasoning_effort: harmony reasoning effort of the prompts.
        template_dir: prompt templates directory; None uses the packaged ones.
        reasoning_chunks, chunk_layers, chunk_pairs: chunks of the reasoning patched (0: none),
            their layer sets and the pairs of each kind patched there (None: all).
        sanity_pairs: disjoint pairs also given the input sanity check (site ``grid``, layer set
            ``all``, which ``layers`` or ``anchor_layers`` must resolve)."""

    sites: tuple[str, ...] = DEFAULT_SITES
    layers: tuple[str, ...] = ("thirds", "all")
    directions: tuple[str, ...] = DIRECTIONS
    reasoning: ReasoningMode = "greedy"
    require_optimal: bool = True
    regenerate: bool = False
    max_new_tokens: int = 256
    batch_size: int = 16
    regenerate_batch_size: int = 64
    anchor_sites: tuple[str, ...] = ("pre_reasoning",)
    anchor_layers: tuple[str, ...] = ("all",)
    full_pairs: int | None = None
    random_control: bool = True
    seed: int = 0
    reasoning_effort: ReasoningEffort = "low"
    template_dir: str | None = None
    reasoning_chunks: int = 0
    chunk_layers: tuple[str, ...] = ("all",)
    chunk_pairs: int | None = None
    sanity_pairs: int = 24

    def __post_init__(self) -> None:
        for name, values, allowed in (
            ("sites", self.sites, SITES),
            ("directions", self.directions, DIRECTIONS),
        ):
            if not values or any(v not in allowed for v in values):
                raise ValueError(f"{name} must be a non-empty subset of {allowed}, got {values}")
        if self.reasoning not in REASONING_MODES:
            raise ValueError(f"reasoning must be one of {REASONING_MODES}, got {self.reasoning!r}")
        if not self.layers:
            raise ValueError("layers needs at least one layer-set spec")
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.regenerate_batch_size < 1:
            raise ValueError("max_new_tokens, batch_size and regenerate_batch_size must be >= 1")
        if not self.anchor_layers:
            raise ValueError("anchor_layers needs at least one layer-set spec")
        if self.full_pairs is not None and self.full_pairs < 0:
            raise ValueError(f"full_pairs must be >= 0 or None, got {self.full_pairs}")
        if self.sanity_pairs < 0:
            raise ValueError(f"sanity_pairs must be >= 0, got {self.sanity_pairs}")
        if self.reasoning_chunks < 0 or (self.chunk_pairs is not None and self.chunk_pairs < 0):
            raise ValueError("reasoning_chunks and chunk_pairs must be >= 0")
        if self.reasoning_chunks and not self.chunk_layers:
            raise ValueError("chunk_layers needs at least one layer-set spec")
        if self.reasoning_chunks and self.reasoning != "greedy":
            raise ValueError(
                "reasoning chunks need reasoning='greedy': the run regenerated after a chunk is "
                "compared with the base's own greedy run"
            )


def resolve_layer_sets(specs: Sequence[str], n_layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """Expand layer-set specs into ``(label, layers)`` pairs, first occurrence kept; ValueError for
    a spec that is not a name or ``+``-joined indices in ``[-n_layers, n_layers)``."""
    out: dict[tuple[int, ...], str] = {}
    for spec in specs:
        spec = str(spec).strip()
        if spec in ("each", "thirds"):
            for layer in range(n_layers) if spec == "each" else default_layers(n_layers):
                out.setdefault((layer,), str(layer))
            continue
        if spec == "cumulative":
            for k in range(1, n_layers + 1):
                first, last = tuple(range(k)), tuple(range(n_layers - k, n_layers))
                for layers, name in ((first, f"first{k}"), (last, f"last{k}")):
                    label = "all" if k == n_layers else str(layers[0]) if k == 1 else name
                    out.setdefault(layers, label)
            continue
        if spec == "all":
            out.setdefault(tuple(range(n_layers)), "all")
            continue
        try:
            raw = [int(part) for part in spec.split("+")]
        except ValueError as err:
            raise ValueError(
                f"bad layer spec {spec!r}; use 'thirds', 'each', 'all', an index or indices "
                "joined by '+'"
            ) from err
        if any(not -n_layers <= x < n_layers for x in raw):
            raise ValueError(f"layer spec {spec!r} lies outside the model's {n_layers} blocks")
        layers = tuple(sorted({x % n_layers for x in raw}))
        out.setdefault(layers, "+".join(str(x) for x in layers))
    return [(label, layers) for layers, label in out.items()]


@dataclass(frozen=True)
class Side:
    """One unpatched side of a prepared pair: the ``grid`` and ``state`` shown, its teacher-forced
    ``sequence`` and ``clean`` run, ``optimal`` (``pi*``), the ``(4,)`` ``action_logits`` at the
    readout, the ``completion_ids`` its reasoning came from and the ``generated_action`` of a
    greedy completion (None: none)."""

    grid: Grid
    state: State
    sequence: TeacherForcedSequence
    clean: CleanRun
    optimal: frozenset[Action]
    action_logits: np.ndarray
    completion_ids: tuple[int, ...]
    generated_action: Action | None

    @property
    def action(self) -> Action:
        """The teacher-forced (argmax) action."""
        return Action(int(np.argmax(self.action_logits)))

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's ids."""
        return self.sequence.token_ids[: self.sequence.prompt_length].tolist()


@dataclass(frozen=True)
class PreparedPair:
    """A pair ready for patching: the pair and its two unpatched sides."""

    pair: CounterfactualPair
    base: Side
    cf: Side

    def sides(self, direction: str) -> tuple[Side, Side]:
        """``(source, target)`` of ``direction``."""
        if direction == "base_to_cf":
            return self.base, self.cf
        if direction == "cf_to_base":
            return self.cf, self.base
        raise ValueError(f"unknown direction {direction!r}; expected one of {DIRECTIONS}")


@dataclass
class PreparationReport:
    """What preparation kept (``n_kept`` of ``n_pairs``) and the pairs dropped per reason."""

    n_pairs: int = 0
    n_kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    @property
    def dropped_truncated(self) -> int:
        """Pairs dropped because a greedy completion hit the token limit
        (:data:`TRUNCATED_DROP`)."""
        return sum(n for reason, n in self.dropped.items() if TRUNCATED_DROP in reason)

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {
            "n_pairs": self.n_pairs,
            "n_kept": self.n_kept,
            "dropped": dict(self.dropped),
            "dropped_truncated": self.dropped_truncated,
        }


TRUNCATED_DROP = "truncated: the greedy completion hit max_new_tokens"
"""The drop reason (after ``base: `` or ``counterfactual: ``) of a truncated greedy completion."""


class PatchingContext:
    """The model-side objects an experiment shares: tokenizer ids, prompt building, generation;
    ``backend``'s model also makes the greedy completions."""

    def __init__(
        self,
        backend: ResidualBackend,
        config: PatchConfig,
        *,
        budget: PatchingBudget | None = None,
        batch_limits: Mapping[str, int] | None = None,
        on_halve: Callable[[HalvingBatch], None] | None = None,
    ) -> None:
        if backend.tokenizer is None:
            raise ValueError(f"the {backend.name} backend needs the model's tokenizer to patch")
        self.model = model = backend.model
        self.tokenizer = tokenizer = backend.tokenizer
        self.backend = backend
        self.config = config
        self.chat_format = chat_format_for(tokenizer)
        self.special_ids = getattr(self.chat_format, "special", None)
        """The harmony token ids (None in another chat format)."""
        self.action_tokens = ActionTokens.from_tokenizer(tokenizer)
        self.template = (
            PromptTemplate.default()
            if config.template_dir is None
            else PromptTemplate.from_dir(config.template_dir)
        )
        self.generator = LocalBackend(model, tokenizer, chat_format=self.chat_format)
        self.layer_sets = resolve_layer_sets(config.layers, backend.n_layers)
        self.anchor_layer_sets = resolve_layer_sets(config.anchor_layers, backend.n_layers)
        self.chunk_layer_sets = (
            resolve_layer_sets(config.chunk_layers, backend.n_layers)
            if config.reasoning_chunks
            else []
        )
        self.capture_layers = sorted(
            {x for _, layers in self.layer_sets + self.anchor_layer_sets for x in layers}
        )
        self.budget = budget
        """The memory budget batches are planned in (None: only the config's batch sizes)."""
        self.plan: PatchingPlan | None = None
        """The plan :func:`prepare_pairs` made before the greedy completions (with a budget)."""
        limits = dict(batch_limits or {})
        self.batches = {
            name: HalvingBatch(name, planned, size=int(limits.get(name, 0)), on_halve=on_halve)
            for name, planned in (
                ("greedy", config.batch_size),
                ("teacher_forced", config.batch_size),
                ("regenerate", config.regenerate_batch_size),
            )
        }
        """Per kind of forward pass, its batch, halved on OOM and started from ``batch_limits``."""
        self.identity_records: list = []
        """The identity patches' records (:func:`~goalprobe.probes.patching.patched_runs.run_patching`)."""

    def messages(self, grid: Grid, state: State):
        """The conversation showing ``grid`` in ``state``."""
        return build_messages(
            render(grid, state), variant=grid.variant, has_key=state.has_key, template=self.template
        )

    def prompt_ids(self, grid: Grid, state: State) -> list[int]:
        """``(n_prompt,)`` ids of the prompt showing ``grid`` in ``state``."""
        return self.generator.encode_prompt(
            self.messages(grid, state), self.config.reasoning_effort
        )

    def greedy(self, prompts: Sequence[list[int]]) -> list[tuple[list[int] | None, Action | None]]:
        """Greedy completions of prompt ids and their parsed actions; a completion cut off by the
        token limit gives ``(None, None)``."""
        sampling = SamplingConfig(
            temperature=0.0,
            max_new_tokens=self.config.max_new_tokens,
            reasoning_effort=self.config.reasoning_effort,
            seed=0,
        )
        prompts = [list(p) for p in prompts]

        def complete(chunk):
            out = []
            for completion in self.generator.generate_ids(list(chunk), sampling):
                parsed = parse_completion(completion.final, completion.finish_reason)
                ids = None if parsed.truncated else completion.generated_token_ids
                out.append((ids, parsed.action))
            return out

        cap = None
        if self.budget is not None and prompts:
            longest = max(len(p) for p in prompts)
            cap = self.budget.generation_batch(
                longest, self.config.max_new_tokens, self.config.batch_size
            )
        return self.batches["greedy"].run(prompts, complete, cap=cap)

    def oracle_completion(self, grid: Grid, state: State) -> list[int]:
        """Completion ids holding the bundled agent's reasoning with an optimal plan."""
        _, actions = solve(grid).optimal_trajectory(start=state)
        text = reasoning_text(
            grid, state, actions[:PLAN_STEPS], key_variant=uses_key_prompt(grid.variant)
        )
        if self.special_ids is None:
            return self.chat_format.encode_reasoning(text)
        return reasoning_ids(self.tokenizer, text, self.special_ids)

    def parse_generated(self, ids: Sequence[int], forced: Sequence[int] = ()) -> Action | None:
        """The action named by a generated completion (None when unparsable or truncated);
        ``forced``: completion ids teacher-forced before the generated ones, parsed with them."""
        ids = list(ids)
        stops = set(self.chat_format.stop_ids)
        cut = len(ids) >= self.config.max_new_tokens and not (ids and ids[-1] in stops)
        if self.special_ids is not None:  # harmony, decoded as it always was
            split = split_completion([*forced, *ids], self.tokenizer)
        else:
            split = self.chat_format.split_completion([*forced, *ids])
        return parse_completion(split.final, "length" if cut else "stop").action

    def side(
        self,
        grid: Grid,
        state: State,
        prompt: list[int],
        completion: Sequence[int],
        generated_action: Action | None,
        sites: Sequence[str],
    ) -> Side:
        """Build the teacher-forced sequence and run it clean (raises :class:`SequenceError`)."""
        sequence = build_sequence(
            prompt,
            completion,
            tokenizer=self.tokenizer,
            grid_text=render(grid, state),
            special_ids=self.special_ids,
            action_tokens=self.action_tokens,
            chat_format=self.chat_format,
        )
        clean = self.backend.clean_run(
            sequence.token_ids, self.capture_layers, capture_positions(sequence, sites)
        )
        action_ids = list(self.action_tokens.action_ids)
        return Side(
            grid=grid,
            state=state,
            sequence=sequence,
            clean=clean,
            optimal=solve(grid).optimal_actions(state),
            action_logits=clean.logits[action_ids].numpy().astype(np.float64),
            completion_ids=tuple(int(i) for i in completion),
            generated_action=generated_action,
        )


def prepare_pairs(
    pairs: Sequence[CounterfactualPair],
    context: PatchingContext,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[PreparedPair], PreparationReport]:
    """Tokenise, complete and run both sides of every pair unpatched; filter.

    Pairs are dropped (counted by reason) when a greedy completion was truncated
    (:data:`TRUNCATED_DROP`), a completion has no closed reasoning, ``"recorded"`` reasoning
    lacks a recorded completion, or, with ``require_optimal``, a side's unpatched action is not
    optimal. A base with recorded ``prompt_token_ids`` is replayed on them; its counterfactuals
    are the recorded prompt with the grid's tokens replaced (:func:`served_counterfactual`).

    Raises:
        SequenceError: a recorded prompt does not hold the locally rendered user message, or base
            and counterfactual prompts do not align token for token."""
    config = context.config
    report = PreparationReport(n_pairs=len(pairs))
    bases: dict[str, BaseState] = {}
    for pair in pairs:
        bases.setdefault(pair.base.base_id, pair.base)
    local_prompts = {key: context.prompt_ids(b.grid, b.state) for key, b in bases.items()}
    base_prompts = {  # the recorded prompts where there are
        key: local_prompts[key]
        if b.prompt_token_ids is None
        else list(map(int, b.prompt_token_ids))
        for key, b in bases.items()
    }
    cf_prompts = {
        pair.pair_id: served_counterfactual(
            base_prompts[pair.base.base_id],
            local_prompts[pair.base.base_id],
            context.prompt_ids(pair.cf_grid, pair.cf_state),
            where=f"base {pair.base.base_id}",
        )
        for pair in pairs
    }
    if context.budget is not None:  # planned (and refused) before any generation
        recorded = [
            len(base_prompts[key]) + len(b.generated_token_ids)
            for key, b in bases.items()
            if config.reasoning == "recorded" and b.generated_token_ids is not None
        ]
        context.plan = plan_patching(
            [len(x) for x in [*base_prompts.values(), *cf_prompts.values()]],
            context.budget,
            max_new_tokens=config.max_new_tokens,
            batch_size=config.batch_size,
            generation_batch_size=config.regenerate_batch_size,
            recorded_lengths=recorded,
        )
        require_patching_fits(context.plan)
    # greedy completions: the reasoning of "greedy"/"recorded" runs, the reference of regeneration
    need_greedy: dict[str, list[int]] = {}
    if config.reasoning == "greedy" or config.regenerate:
        need_greedy |= base_prompts
    if config.reasoning != "oracle" or config.regenerate:
        need_greedy |= {p.pair_id: cf_prompts[p.pair_id] for p in pairs}
    greedy = dict(zip(need_greedy, context.greedy(list(need_greedy.values())), strict=True))
    base_sides: dict[str, Side | str] = {}
    prepared = []
    for index, pair in enumerate(pairs):
        if progress is not None:
            progress(index, len(pairs))
        base = pair.base
        if base.base_id not in base_sides:
            base_sides[base.base_id] = _make_side(
                context,
                "base",
                (base.grid, base.state),
                base_prompts[base.base_id],
                greedy.get(base.base_id),
                base.generated_token_ids,
            )
        base_side = base_sides[base.base_id]
        if isinstance(base_side, str):
            report.dropped[base_side] += 1
            continue
        cf_side = _make_side(
            context,
            "counterfactual",
            (pair.cf_grid, pair.cf_state),
            cf_prompts[pair.pair_id],
            greedy.get(pair.pair_id),
        )
        if isinstance(cf_side, str):
            report.dropped[cf_side] += 1
            continue
        try:
            check_aligned(base_side.sequence, cf_side.sequence, pair.changed_cells)
        except SequenceError as err:
            raise SequenceError(f"pair {pair.pair_id}: {err}") from err
        if config.require_optimal and not (
            base_side.action in base_side.optimal and cf_side.action in cf_side.optimal
        ):
            report.dropped["not optimal before patching"] += 1
            continue
        prepared.append(PreparedPair(pair=pair, base=base_side, cf=cf_side))
    report.n_kept = len(prepared)
    return prepared, report


def served_counterfactual(
    served: Sequence[int], local: Sequence[int], local_cf: Sequence[int], *, where: str = ""
) -> list[int]:
    """The counterfactual of a prompt someone else rendered: ``served`` with the tokens in which the
    local renderings of base (``local``) and counterfactual (``local_cf``) differ replaced.

    They differ only inside the user message, so ``served`` must end with ``local`` from the
    first differing token on (else :class:`SequenceError`); its head (system and developer
    messages, which a server renders its own way) is kept."""
    served, local, local_cf = list(served), list(local), list(local_cf)
    if served == local:
        return local_cf
    prefix = 0
    while prefix < min(len(local), len(local_cf)) and local[prefix] == local_cf[prefix]:
        prefix += 1
    shared = 0  # the tail that served and local have in common
    while shared < min(len(served), len(local)) and served[-1 - shared] == local[-1 - shared]:
        shared += 1
    start = len(local) - shared  # local[start:] == served[-shared:]
    if start > prefix:
        raise SequenceError(
            f"{where}: the recorded prompt_token_ids do not end with the user message rendered "
            "now (another tokenizer, template or reasoning effort?)"
        )
    return served[: len(served) - shared] + local_cf[start:]


def _make_side(context, who, shown, prompt, greedy, recorded=None) -> Side | str:
    """The side of ``who`` (``"base"`` or ``"counterfactual"``) showing ``(grid, state)``, or why
    it cannot be used; ``greedy``: its greedy ``(ids, action)`` (None: none made; ids None:
    truncated), ``recorded``: a base's recorded completion (``reasoning="recorded"``)."""
    config = context.config
    ids, action = greedy or (None, None)
    if config.reasoning == "oracle":
        completion = context.oracle_completion(*shown)
    elif config.reasoning == "recorded" and who == "base":
        if recorded is None:
            return "base: no recorded completion (use reasoning='greedy')"
        completion = list(recorded)
    elif ids is None:  # every side that needs one has a greedy completion: it was truncated
        return f"{who}: {TRUNCATED_DROP} ({config.max_new_tokens})"
    else:
        completion = ids
    try:
        return context.side(*shown, prompt, completion, action, config.sites)
    except SequenceError as err:
        return f"{who}: {err}"


ANSWER_TOKENS = 32
"""Margin for the tokens a teacher-forced sequence holds after the reasoning."""


@dataclass(frozen=True)
class PatchingBudget:
    """The memory one patching run may use: the model's ``shape``, the device's ``memory_bytes``,
    the weights as loaded, the compute dtype's bytes, the kernel's memory model
    (:func:`~goalprobe.activations.plan.planned_attention`), the ``fraction`` of the device the
    plan may fill and the ``reserve_bytes`` kept free beside it."""

    shape: ModelShape
    memory_bytes: float
    weights_bytes: float
    dtype_bytes: int = 2
    attention: str = "eager"
    fraction: float = 0.85
    reserve_bytes: float = 1.5 * GB

    @classmethod
    def for_model(cls, model, device: str = "") -> PatchingBudget:
        """The budget of a loaded transformers model on ``device`` ('' or ``auto``: its
        parameters')."""
        params = next(model.parameters())
        if device in ("", "auto"):
            device = str(params.device)
        return cls(
            shape=ModelShape.from_config(model.config),
            memory_bytes=device_memory_bytes(device),
            weights_bytes=loaded_weights_bytes(model, device),
            dtype_bytes=params.element_size(),
            attention=planned_attention(str(model.config._attn_implementation), device),
        )

    @property
    def available(self) -> float:
        """Bytes left to activations: ``fraction x memory - weights - reserve``."""
        return self.fraction * self.memory_bytes - self.weights_bytes - self.reserve_bytes

    def patched_bytes(self, batch: int, prefix: int, suffix: int) -> float:
        """:func:`~goalprobe.activations.plan.patched_run_bytes` in this budget's dtype and
        kernel."""
        return patched_run_bytes(
            self.shape, batch, prefix, suffix, self.dtype_bytes, self.attention
        )

    def generate_bytes(self, batch: int, prompt: int, new_tokens: int) -> float:
        """:func:`~goalprobe.activations.plan.generation_bytes` in this budget's dtype and
        kernel."""
        return generation_bytes(
            self.shape, batch, prompt, new_tokens, self.dtype_bytes, self.attention
        )

    def patched_batch(self, prefix: int, suffix: int, cap: int) -> int:
        """The most patched copies (at most ``cap``, at least 1) that fit at these lengths."""
        return _fit(self.available, self.patched_bytes(1, prefix, suffix), cap)

    def generation_batch(self, prompt: int, new_tokens: int, cap: int) -> int:
        """The most prompts generated at once (at most ``cap``, at least 1) that fit."""
        return _fit(self.available, self.generate_bytes(1, prompt, new_tokens), cap)


def _fit(available: float, one: float, cap: int) -> int:
    if available <= 0 or one <= 0:
        return 1
    return max(1, min(int(cap), int(available // one)))


@dataclass(frozen=True)
class PatchingPlan:
    """The plan made before the greedy completions (fields as ``memory.plan`` in docs/formats.md):
    ``longest`` is the longest teacher-forced sequence a kept pair can have (prompt, a completion
    shorter than ``max_new_tokens``, :data:`ANSWER_TOKENS`; or a recorded completion), the batch
    sizes are the config's caps at that length, ``fits`` says whether one copy and one completion
    fit at all and ``max_new_tokens_fitting`` the largest token budget that does (0: none)."""

    longest_prompt: int
    longest: int
    max_new_tokens: int
    batch_size: int
    generation_batch_size: int
    one_gb: float
    generation_one_gb: float
    budget_gb: float
    weights_gb: float
    attention: str
    fits: bool
    max_new_tokens_fitting: int


def plan_patching(
    prompt_lengths: Sequence[int],
    budget: PatchingBudget,
    *,
    max_new_tokens: int,
    batch_size: int,
    generation_batch_size: int,
    recorded_lengths: Sequence[int] = (),
) -> PatchingPlan:
    """Plan from the prompts and the token budget (module docstring); ``recorded_lengths``:
    recorded completions teacher-forced as they are (``reasoning="recorded"``)."""
    prompt = max(prompt_lengths, default=1)
    longest = max(prompt + max_new_tokens - 1, max(recorded_lengths, default=0)) + ANSWER_TOKENS
    one = budget.patched_bytes(1, 0, longest)
    gen_one = budget.generate_bytes(1, prompt, max_new_tokens)
    fits = budget.available >= max(one, gen_one)
    fitting = 0
    low, high = 1, max_new_tokens
    while low <= high:  # the largest budget at which one copy and one completion fit
        mid = (low + high) // 2
        length = max(prompt + mid - 1, max(recorded_lengths, default=0)) + ANSWER_TOKENS
        need = max(budget.patched_bytes(1, 0, length), budget.generate_bytes(1, prompt, mid))
        if need <= budget.available:
            fitting, low = mid, mid + 1
        else:
            high = mid - 1
    return PatchingPlan(
        longest_prompt=prompt,
        longest=longest,
        max_new_tokens=max_new_tokens,
        batch_size=budget.patched_batch(0, longest, batch_size),
        generation_batch_size=budget.generation_batch(
            prompt, max_new_tokens, generation_batch_size
        ),
        one_gb=one / GB,
        generation_one_gb=gen_one / GB,
        budget_gb=budget.available / GB,
        weights_gb=budget.weights_bytes / GB,
        attention=budget.attention,
        fits=fits,
        max_new_tokens_fitting=fitting,
    )


class PatchingDoesNotFitError(ValueError):
    """The longest sequence a pair can have does not fit the device one copy at a time."""


def require_patching_fits(plan: PatchingPlan) -> None:
    """Raise :class:`PatchingDoesNotFitError` when one patched copy of the longest possible sequence
    (or one completion) does not fit beside the weights; the message names what would fit."""
    if plan.fits:
        return
    fix = (
        f"lower max_new_tokens to {plan.max_new_tokens_fitting:,} or less"
        if plan.max_new_tokens_fitting
        else "no token budget fits"
    )
    raise PatchingDoesNotFitError(
        f"patching does not fit: a pair's teacher-forced sequence can reach {plan.longest:,} "
        f"tokens (prompt {plan.longest_prompt:,} + max_new_tokens {plan.max_new_tokens:,}), "
        f"which needs {_gb(plan.one_gb)} of activations one copy at a time with "
        f"{plan.attention} attention (a greedy completion {_gb(plan.generation_one_gb)}), and "
        f"{_gb(max(plan.budget_gb, 0.0))} are left after the weights ({_gb(plan.weights_gb)}) "
        f"and the reserve; {fix}, or use a larger device"
    )


def _gb(value: float) -> str:
    return f"{value:.1f} GB" if value >= 1 else f"{value:.3g} GB"
