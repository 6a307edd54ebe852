"""Patching's memory plan: batches from the memory model, refused before any generation.

Each patched copy holds ``3 x heads x S x (P + S + 1)`` eager attention scores, so at the paper's
scale a batch of 16 copies exceeds an A100. The greedy completions come first and take hours, so
:func:`plan_patching` plans before them and refuses a run whose longest sequence does not fit one
copy (:class:`PatchingDoesNotFitError`, naming the budget that would fit). Each forward pass then
takes the largest batch that fits at its lengths, capped by the config, halving on an
out-of-memory error (:class:`~goalprobe.agents.oom.HalvingBatch`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from goalprobe.activations.plan import (
    GB,
    ModelShape,
    device_memory_bytes,
    generation_bytes,
    loaded_weights_bytes,
    patched_run_bytes,
    planned_attention,
)

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

    def to_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)


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
