"""The pre-flight: measure a sample of steps before a long generation run, refuse a budget that
cuts too many of them, and say what the whole run will cost.

:func:`run_preflight` generates one step at the start state of a sample of the run's grids
(spread over the list) with the run's own sampling settings, and reports the truncation rate
with a Wilson 95% interval, the 95th percentile and mean of generated tokens per step (a cut
step counts at the budget), and the projected tokens and hours of the run at the measured
throughput. :meth:`PreflightReport.check` raises :class:`PreflightRefused` when more than
``PreflightConfig.max_truncated`` of the steps were cut, naming ``--allow-truncation`` and the
budget to raise. The bundled agents need none (:func:`goalprobe.agents.bundled.token_budget`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from goalprobe.agents.backend import Backend, Completion, generate_seeded
from goalprobe.agents.bundled import renders_effort
from goalprobe.agents.prompts import PromptTemplate, state_messages
from goalprobe.agents.rollout import RolloutConfig, derive_seed
from goalprobe.gridworld.core import Grid
from goalprobe.gridworld.dynamics import initial_state
from goalprobe.gridworld.optimal import solve

from goalprobe.stats import wilson_interval

OVERRIDE_FLAG = "--allow-truncation"
"""The command-line flag that runs a budget the pre-flight refused."""


@dataclass(frozen=True)
class PreflightConfig:
    """How the pre-flight samples and when it refuses."""

    steps: int = 16
    """Steps generated before the run (one at the start of each of that many grids, spread over
    the grid list); 0 skips the pre-flight."""
    max_truncated: float = 0.05
    """Largest fraction of sampled steps that may be cut off by the token limit."""
    allow_truncation: bool = False
    """Run anyway when more are cut (the truncated steps are still reported apart)."""

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"preflight: steps must be >= 0, got {self.steps}")
        if not 0 <= self.max_truncated <= 1:
            raise ValueError(
                f"preflight: max_truncated must be in [0, 1], got {self.max_truncated}"
            )


class PreflightRefused(RuntimeError):
    """Too many sampled steps were cut off by the token limit; the run was not started.

    Attributes:
        report: what the pre-flight measured.
    """

    def __init__(self, message: str, report: PreflightReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class PreflightReport:
    """What :func:`run_preflight` measured and projected.

    Attributes:
        steps: sampled steps.
        truncated: those cut off by the token limit.
        truncation_ci: Wilson 95% interval of the truncation rate.
        generated_tokens_p95: 95th percentile of generated tokens per step (reasoning + answer;
            a lower bound when steps were cut, which count at the budget).
        generated_tokens_mean: their mean.
        tokens_per_second: generated tokens per wall-clock second on the sample.
        seconds: wall time of the sample.
        projected_steps: at most this many steps in the whole run (episodes x horizon).
        projected_tokens: ``projected_steps x generated_tokens_mean``.
        projected_hours: ``projected_tokens / tokens_per_second / 3600``.
        max_new_tokens: the budget sampled with.
        reasoning_effort: the effort sampled with.
    """

    steps: int
    truncated: int
    truncation_ci: tuple[float, float]
    generated_tokens_p95: float
    generated_tokens_mean: float
    tokens_per_second: float
    seconds: float
    projected_steps: int
    projected_tokens: float
    projected_hours: float
    max_new_tokens: int
    reasoning_effort: str

    @property
    def truncation_rate(self) -> float:
        """Fraction of sampled steps cut off by the token limit (nan without steps)."""
        return self.truncated / self.steps if self.steps else math.nan

    def to_dict(self) -> dict:
        """JSON-ready, with the rate."""
        return {**asdict(self), "truncation_rate": self.truncation_rate}

    def describe(self) -> str:
        """One paragraph for a terminal."""
        low, high = self.truncation_ci
        bound = ">= " if self.truncated else ""
        return (
            f"pre-flight: {self.steps} steps at effort {self.reasoning_effort}, budget "
            f"{self.max_new_tokens:,} tokens: {self.truncated} cut off "
            f"({self.truncation_rate:.0%}, 95% CI {low:.0%}-{high:.0%}); generated tokens per "
            f"step p95 {bound}{self.generated_tokens_p95:,.0f}, mean "
            f"{self.generated_tokens_mean:,.0f}; {self.tokens_per_second:,.0f} tokens/s; the "
            f"run: up to {self.projected_steps:,} steps, {self.projected_tokens:,.0f} tokens, "
            f"{self.projected_hours:,.1f} h at this throughput"
        )

    def check(self, config: PreflightConfig) -> None:
        """Raise :class:`PreflightRefused` when more than ``config.max_truncated`` of the
        sampled steps were cut and ``config.allow_truncation`` is off."""
        if config.allow_truncation or not self.steps:
            return
        if self.truncation_rate > config.max_truncated:
            raise PreflightRefused(
                f"{self.truncated} of {self.steps} pre-flight steps "
                f"({self.truncation_rate:.0%}) were cut off by the token limit of "
                f"{self.max_new_tokens:,} (more than {config.max_truncated:.0%}); truncated steps "
                "carry no behaviour. Raise the budget (rollouts.max_new_tokens / "
                f"--max-new-tokens) or pass {OVERRIDE_FLAG} to run anyway. {self.describe()}",
                self,
            )


def sample_grids(grids: Sequence[Grid], steps: int) -> list[Grid]:
    """``steps`` grids spread evenly over ``grids`` (all of them when there are fewer)."""
    if steps >= len(grids):
        return list(grids)
    picks = np.linspace(0, len(grids) - 1, steps).round().astype(int)
    return [grids[i] for i in sorted(set(picks.tolist()))]


def run_preflight(
    grids: Sequence[Grid],
    backend: Backend,
    config: RolloutConfig,
    preflight: PreflightConfig,
) -> PreflightReport:
    """Generate one step at the start of ``preflight.steps`` of ``grids`` with ``config``'s
    sampling (in flight together, at most ``config.batch_size`` per call) and project the run;
    ``ValueError`` for no grids or ``preflight.steps`` 0.
    """
    if not grids or preflight.steps < 1:
        raise ValueError("the pre-flight needs grids and steps >= 1")
    template = PromptTemplate.from_dir(config.template_dir) if config.template_dir else None
    chosen = sample_grids(grids, preflight.steps)
    conversations = [
        state_messages(
            grid,
            initial_state(grid),
            template=template,
            moral_conditioning=config.moral_conditioning,
        )
        for grid in chosen
    ]
    seeds = [derive_seed(config.seed, "preflight", g.grid_id) for g in chosen]
    completions: list[Completion] = []
    started = time.perf_counter()
    for start in range(0, len(conversations), config.batch_size):
        batch = conversations[start : start + config.batch_size]
        batch_seeds = seeds[start : start + config.batch_size]
        completions += generate_seeded(
            backend, batch, config.sampling(None), batch_seeds, derive_seed(*batch_seeds)
        )
    seconds = time.perf_counter() - started
    lengths = np.asarray([len(c.generated_token_ids) for c in completions], dtype=float)
    truncated = sum(c.finish_reason == "length" for c in completions)
    projected_steps = sum(
        config.episodes_per_grid * config.horizon(solve(g).shortest_path_length) for g in grids
    )
    mean = float(lengths.mean())
    rate = float(lengths.sum() / seconds) if seconds > 0 else math.nan
    tokens = projected_steps * mean
    return PreflightReport(
        steps=len(completions),
        truncated=int(truncated),
        truncation_ci=wilson_interval(int(truncated), len(completions)),
        generated_tokens_p95=float(np.percentile(lengths, 95)),
        generated_tokens_mean=mean,
        tokens_per_second=rate,
        seconds=seconds,
        projected_steps=int(projected_steps),
        projected_tokens=float(tokens),
        projected_hours=float(tokens / rate / 3600) if rate > 0 else math.nan,
        max_new_tokens=config.max_new_tokens,
        reasoning_effort=_effort(backend, config.reasoning_effort),
    )


def _effort(backend: Backend, effort: str) -> str:
    """The effort as the report states it (marked where the backend's chat format does not
    render it)."""
    fmt = getattr(backend, "chat_format", None)
    if fmt is None or renders_effort(fmt):
        return effort
    return f"{effort} (not rendered: the chat template reads no effort)"
