"""Run an agent in the grid world: many episodes at once, every step recorded.

An episode starts in the settled initial state of its grid; at every step it shows the agent the
current grid in a fresh conversation (:mod:`goalprobe.agents.prompts`), parses the answer
(:mod:`goalprobe.agents.parser`) and executes the action. It ends at the goal or after ``T``
steps. An answer naming no action is retried ``RolloutConfig.retries`` times, then the step is
invalid (the agent stays; ``action: null, valid: false``); a generation cut off by the token
limit ends the episode (``end_reason: "truncated"``). No episode is ever dropped.

**Scheduling.** A backend with ``session()`` and ``acomplete()`` (a server) is scheduled per
episode: ``batch_size`` workers each send an episode's next request as soon as its answer came
back. Other backends (a local model) run in lockstep rounds: each round sends the conversation
of every episode in flight to ``backend.generate``, in generation batches that halve on an
out-of-memory error (:class:`~goalprobe.agents.oom.HalvingBatch`; the batch used is in the
report). A failed request or conversation is sent again with the same seed;
``max_failed_rounds`` consecutive failures stop the run (:class:`RolloutStopped`).

**Seeds.** Episode ``e`` on grid ``g`` samples with ``episode_seed = H(seed, g, e)`` and attempt
``k`` of step ``t`` with ``H(episode_seed, t, k)`` (SHA-256 folded to 31 bits), passed per
conversation when ``generate`` accepts ``seeds=``, so an episode does not depend on which
episodes share its batch (else one derived seed per call).

**Resume.** Each episode is appended as one block when it ends; rerunning with the same config
and output skips finished episodes and cuts an interrupted tail.

**Shards.** Episodes are independent of the shard they ran in (``goalprobe rollout --shard i/N``),
so the shards of one run hold, together, exactly the episodes of the unsharded run;
:func:`merge_trajectory_files` joins them under the run's header (same run id), every episode
once, in ``(grid_id, episode)`` order.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from goalprobe.agents.backend import (
    Backend,
    BatchGenerationError,
    Completion,
    SamplingConfig,
    generate_seeded,
    run_sync,
)
from goalprobe.agents.harmony import Message, ReasoningEffort
from goalprobe.agents.oom import HalvingBatch
from goalprobe.agents.parser import parse_completion
from goalprobe.agents.prompts import PromptTemplate, backend_coverage, build_messages
from goalprobe.agents.trajectories import (
    Attempt,
    Episode,
    EpisodeSummary,
    RunHeader,
    StepRecord,
    TrajectoryFormatError,
    append_episode,
    open_for_resume,
    read_run_header,
    read_trajectories,
)
from goalprobe.gridworld.core import Action, Grid, RowCol, State, Variant
from goalprobe.gridworld.dynamics import initial_state, is_success, step
from goalprobe.gridworld.fog import fog_radius, fog_view
from goalprobe.gridworld.optimal import OptimalPolicy, solve
from goalprobe.gridworld.text import render

from goalprobe.version import package_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are run (defaults: the study's section 4 and appendix G.1)."""

    episodes_per_grid: int = 10
    """Episodes (trajectories) per grid."""

    horizon_factor: float = 1.5
    """Horizon rule ``T = ceil(horizon_factor * L)``, L the shortest path length from the start
    (ignored when ``horizon_steps`` is set)."""

    horizon_steps: int | None = None
    """A fixed horizon ``T`` for every grid (the study uses 30 for the key variants); None
    applies ``horizon_factor``."""

    retries: int = 2
    """Extra attempts of a step whose answer names no action (0: no retry)."""

    batch_size: int = 16
    """Episodes in flight (conversations per ``backend.generate`` call). Does not change the
    run's identity: a resume may use another batch size."""

    temperature: float = 0.7
    """Sampling temperature (0: greedy)."""

    top_p: float = 0.95
    """Nucleus-sampling mass."""

    max_new_tokens: int = 10_000
    """Most tokens generated per attempt (reasoning + answer)."""

    reasoning_effort: ReasoningEffort = "low"
    """Harmony reasoning effort: ``"low"``, ``"medium"`` or ``"high"``."""

    seed: int = 0
    """Base seed: every episode's and attempt's sampling seed derives from it."""

    template_dir: str | None = None
    """Directory of prompt templates (see :mod:`goalprobe.agents.prompts`); None uses the
    packaged ones."""

    moral_conditioning: bool = False
    """Add the instruction to avoid the flower beds to the prompt of harm grids only
    (MACHIAVELLI's moral conditioning; :func:`goalprobe.agents.prompts.build_instructions`)."""

    def __post_init__(self) -> None:
        for name, low in (("episodes_per_grid", 1), ("retries", 0), ("batch_size", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not (math.isfinite(self.horizon_factor) and self.horizon_factor > 0):
            raise ValueError(f"horizon_factor must be > 0, got {self.horizon_factor}")
        if self.horizon_steps is not None and self.horizon_steps < 1:
            raise ValueError(f"horizon_steps must be >= 1 or None, got {self.horizon_steps}")
        self.sampling(0)  # validates temperature, top_p, max_new_tokens, reasoning_effort

    def horizon(self, shortest_path_length: int) -> int:
        """The step budget ``T`` of an episode whose shortest path has ``L`` steps."""
        if self.horizon_steps is not None:
            return self.horizon_steps
        return math.ceil(Fraction(str(self.horizon_factor)) * int(shortest_path_length))

    def sampling(self, seed: int | None) -> SamplingConfig:
        """The :class:`SamplingConfig` of one generation with ``seed``."""
        return SamplingConfig(
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            reasoning_effort=self.reasoning_effort,
            seed=seed,
        )

    def identity(self) -> dict[str, Any]:
        """The fields that determine the rollouts (everything but ``batch_size``), as JSON."""
        fields = asdict(self)
        fields.pop("batch_size")
        if not self.moral_conditioning:
            # added later: left out when off, so the ids of runs made before it stay the same
            fields.pop("moral_conditioning")
        return fields


@dataclass(frozen=True)
class RolloutReport:
    """What :func:`run_rollouts` did now (counts of episodes, steps and calls of this call;
    ``failed_rounds``: rounds, or per-episode requests, that failed and were sent again;
    ``retokenized_steps``: steps whose token ids were rebuilt from a server's text)."""

    out_path: Path
    run_id: str
    episodes_total: int
    episodes_skipped: int
    episodes_run: int
    successes: int
    steps: int
    invalid_steps: int
    generate_calls: int
    seconds: float
    failed_rounds: int = 0
    failed_generations: int = 0
    retokenized_steps: int = 0
    scheduling: str = "lockstep"
    truncated_episodes: int = 0
    """Episodes run now that ended on a generation cut off by the token limit."""
    batch: dict | None = None
    """Lockstep scheduling: the generation batch planned, in force at the end and the largest
    that ran, with its halvings on out-of-memory errors (:meth:`HalvingBatch.to_dict`)."""

    @property
    def steps_per_second(self) -> float:
        """Steps taken per wall-clock second (nan when nothing ran)."""
        return self.steps / self.seconds if self.seconds > 0 and self.steps else math.nan


class RolloutStopped(RuntimeError):
    """The backend kept failing; the run stopped in a resumable state (``report``: what it did
    before, its finished episodes on disk)."""

    def __init__(self, message: str, report: RolloutReport) -> None:
        super().__init__(message)
        self.report = report


def derive_seed(*parts: object) -> int:
    """A 31-bit seed from ``parts`` (SHA-256 of their ``repr``s joined; stable across runs)."""
    digest = hashlib.sha256("\x1f".join(repr(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def describe_backend(backend: Backend) -> dict[str, Any]:
    """A JSON description of ``backend`` (its ``describe()`` when it has one, else its class)."""
    describe = getattr(backend, "describe", None)
    if callable(describe):
        return dict(describe())
    cls = type(backend)
    return {"class": f"{cls.__module__}.{cls.__qualname__}"}


def rollout_coverage(
    backend: object,
    grids: Sequence[Grid],
    policies: Sequence[OptimalPolicy],
    config: RolloutConfig,
    template: PromptTemplate | None,
) -> dict | None:
    """:func:`~goalprobe.agents.prompts.backend_coverage` of every grid's first prompt."""
    firsts = [
        _Episode(run_id="", grid=g, policy=p, index=0, config=config, template=template)
        for g, p in zip(grids, policies, strict=True)
    ]
    shown = [(e.messages(), e) for e in firsts]  # messages() draws the grid text
    return backend_coverage(backend, [(e._grid_text, m) for m, e in shown], config.reasoning_effort)


def run_id_for(config: RolloutConfig, backend_description: dict[str, Any]) -> str:
    """The run id: 16 hex digits of the SHA-256 of the config identity and the backend."""
    payload = json.dumps(
        {"config": config.identity(), "backend": backend_description},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(eq=False)
class _Episode:
    """The mutable state of one episode in flight."""

    run_id: str
    grid: Grid
    policy: OptimalPolicy
    index: int
    config: RolloutConfig
    template: PromptTemplate | None
    steps: list[StepRecord] = field(default_factory=list)
    rejected: list[Attempt] = field(default_factory=list)
    truncated: bool = False

    def __post_init__(self) -> None:
        self.seed = derive_seed(self.config.seed, self.grid.grid_id, self.index)
        self.horizon = self.config.horizon(self.policy.shortest_path_length)
        self.start = self.state = initial_state(self.grid)
        self._messages: list[Message] | None = None
        self._grid_text = ""

    @property
    def key(self) -> tuple[str, int]:
        return (self.grid.grid_id, self.index)

    @property
    def done(self) -> bool:
        return (
            self.truncated or is_success(self.grid, self.state) or len(self.steps) >= self.horizon
        )

    @property
    def attempt_seed(self) -> int:
        return derive_seed(self.seed, len(self.steps), len(self.rejected))

    def messages(self) -> list[Message]:
        """The conversation of the current step (built once per step)."""
        if self._messages is None:
            history = None
            if self.grid.variant == Variant.FOG:
                # a fogged grid draws what the episode has seen so far, with its past moves
                self._grid_text, history = fog_view(self.grid, *self._fog_history())
            else:
                # a false-belief grid draws its shown grid (with the true agent position)
                self._grid_text = render(self.grid.prompt_grid, self.state)
            self._messages = build_messages(
                self._grid_text,
                variant=self.grid.variant,
                has_key=self.state.has_key,
                template=self.template,
                moral_conditioning=self.config.moral_conditioning,
                history=history,
                fog_radius=fog_radius(self.grid) if history is not None else None,
            )
        return self._messages

    def _fog_history(self) -> tuple[list[State], list[tuple[RowCol, Action]]]:
        """The states visited so far (the current one last) and the past valid moves."""
        visited = [self.start, *(State(s.next_agent_row_col) for s in self.steps)]
        moves = [(s.agent_row_col, Action[s.action]) for s in self.steps if s.action is not None]
        return visited, moves

    def consume(self, completion: Completion) -> None:
        """Take one completion for the current step: retry, or record the step and move."""
        parsed = parse_completion(completion.final, completion.finish_reason)
        generated: dict[str, Any] = {  # what a step and a rejected attempt both record
            "generated_token_ids": [int(i) for i in completion.generated_token_ids],
            "token_ids_source": completion.token_ids_source,
            "reasoning": completion.reasoning,
            "final": completion.final,
            "finish_reason": completion.finish_reason,
        }
        if not parsed.ok and not parsed.truncated and len(self.rejected) < self.config.retries:
            self.rejected.append(Attempt(**generated, parse_error=str(parsed.error)))
            return
        state = self.state
        next_state = step(self.grid, state, parsed.action) if parsed.action is not None else state
        self.truncated = parsed.truncated
        outcome = "truncated" if parsed.truncated else "invalid" if not parsed.ok else None
        if outcome is None and next_state.agent == state.agent:
            outcome = "blocked_move"
        raised = {
            "retried": bool(self.rejected),
            outcome: outcome is not None,
            "relaxed_parse": parsed.form in ("relaxed_json", "key_value"),
            "retokenized": completion.token_ids_source == "retokenized",
            "max_tokens_reached": completion.finish_reason == "length",
            "malformed_harmony": not completion.well_formed,
        }
        flags = [str(flag) for flag, on in raised.items() if on]
        self.steps.append(
            StepRecord(
                run_id=self.run_id,
                episode=self.index,
                step=len(self.steps),
                episode_seed=self.seed,
                **state_fields(self.grid, self.policy, state, self._grid_text),
                action=parsed.action.name if parsed.action is not None else None,
                valid=parsed.ok,
                next_agent_row_col=next_state.agent,
                prompt_token_ids=[int(i) for i in completion.prompt_token_ids],
                **generated,
                parse_error=parsed.error,
                parse_form=parsed.form,
                attempts=len(self.rejected) + 1,
                rejected_attempts=list(self.rejected),
                flags=flags,
            )
        )
        self.rejected = []
        self.state = next_state
        self._messages = None

    def summary(self) -> EpisodeSummary:
        success = is_success(self.grid, self.state) and not self.truncated
        end_reason: Literal["goal", "horizon", "truncated"] = (
            "goal" if success else "truncated" if self.truncated else "horizon"
        )
        return EpisodeSummary(
            run_id=self.run_id,
            grid_id=self.grid.grid_id,
            episode=self.index,
            episode_seed=self.seed,
            grid_size=self.grid.size,
            density=self.grid.density,
            variant=str(self.grid.variant),
            success=success,
            end_reason=end_reason,
            length=len(self.steps),
            invalid_steps=sum(not s.valid and not s.truncated for s in self.steps),
            optimal_steps=sum(
                s.action is not None and s.action in s.optimal_actions for s in self.steps
            ),
            total_attempts=sum(s.attempts for s in self.steps),
            horizon=self.horizon,
            shortest_path_length=self.policy.shortest_path_length,
            start_row_col=self.start.agent,
            goal_row_col=self.grid.goal,
            final_agent_row_col=self.state.agent,
            final_has_key=self.state.has_key,
            final_door_open=self.state.door_open,
        )


def state_fields(grid: Grid, policy: OptimalPolicy, state: State, grid_text: str) -> dict:
    """The :class:`StepRecord` fields that describe the state ``s_t`` shown to the agent. Cells,
    optimal actions and distance are the true grid's; ``grid_text`` is what the prompt drew (a
    false-belief grid's shown grid, a fogged grid's view), ``true_grid_text`` the true grid's
    text when the two differ (else None)."""
    drawn_otherwise = grid.shown is not None or grid.variant == Variant.FOG
    true_text = render(grid, state) if drawn_otherwise else None
    return dict(
        grid_id=grid.grid_id,
        grid_size=grid.size,
        density=grid.density,
        variant=str(grid.variant),
        grid_text=grid_text,
        true_grid_text=true_text if true_text != grid_text else None,
        agent_row_col=state.agent,
        goal_row_col=grid.goal,
        has_key=state.has_key,
        door_open=state.door_open,
        key_row_col=grid.key,
        door_row_col=grid.door,
        optimal_actions=[a.name for a in sorted(policy.optimal_actions(state))],
        distance_to_goal=_finite_distance(policy, state),
    )


def _finite_distance(policy: OptimalPolicy, state: State) -> int:
    distance = policy.distance(state)
    if distance == math.inf:  # the dynamics never leave the start's connected region
        raise RuntimeError(f"state {state} cannot reach the goal of grid {policy.grid.grid_id}")
    return int(distance)


def per_episode_scheduling(backend: object) -> bool:
    """Whether ``backend`` answers single conversations concurrently (``session()`` and
    ``acomplete()``), so that :func:`run_rollouts` schedules it per episode."""
    return callable(getattr(backend, "session", None)) and callable(
        getattr(backend, "acomplete", None)
    )


def _chat_format_of(backend) -> dict | None:
    """The header's chat format: a backend's ``chat_format`` when it has one other than
    harmony (files without one are harmony, as every file written before formats existed)."""
    fmt = getattr(backend, "chat_format", None)
    return None if fmt is None or fmt.name == "harmony" else fmt.describe()


def run_rollouts(
    grids: Iterable[Grid],
    backend: Backend,
    config: RolloutConfig,
    out_path: str | Path,
    progress: bool = True,
    *,
    backend_description: dict[str, Any] | None = None,
    max_failed_rounds: int = 3,
) -> RolloutReport:
    """Run ``config.episodes_per_grid`` episodes on every grid and append them to ``out_path``.

    Resumes when ``out_path`` (trajectory JSONL) already holds episodes of the same run (same
    config identity and backend description): those are skipped. Episodes run in the order of
    ``grids`` (solvable, each with a non-empty unique ``grid_id``), then episode index.
    ``backend_description``: JSON facts identifying the backend, recorded in the header and part
    of the run id (None: :func:`describe_backend`); ``progress``: a tqdm bar on stderr.

    Raises:
        ValueError: an empty or repeated ``grid_id``, or an unsolvable grid.
        TrajectoryFormatError: ``out_path`` belongs to another run or is corrupt.
        RolloutStopped: more than ``max_failed_rounds`` consecutive failed rounds (or requests
            of one episode); rerun to resume.
    """
    if max_failed_rounds < 0:
        raise ValueError(f"max_failed_rounds must be >= 0, got {max_failed_rounds}")
    run = _Run(list(grids), backend, config, Path(out_path), backend_description)
    run.max_failed_rounds = max_failed_rounds
    run.open(progress)
    try:
        if run.scheduling == "per_episode":
            run_sync(run.per_episode())
        else:
            run.lockstep()
    finally:
        run.bar.close()
    return run.report()


def _solved(grids: list[Grid]) -> list[OptimalPolicy]:
    """The optimal policy of every grid, after checking the grid ids are non-empty and unique
    and every grid is solvable."""
    seen: set[str] = set()
    for i, grid in enumerate(grids):
        if not grid.grid_id:
            raise ValueError(f"grid {i} has an empty grid_id; trajectories join on it")
        if grid.grid_id in seen:
            raise ValueError(f"grid_id {grid.grid_id!r} repeats")
        seen.add(grid.grid_id)
    policies = [solve(grid) for grid in grids]
    for grid, policy in zip(grids, policies, strict=True):
        if not policy.is_solvable:
            raise ValueError(f"grid {grid.grid_id!r}: the goal cannot be reached from the start")
    return policies


class _Run:
    """One call of :func:`run_rollouts`: the episodes to run, the counters of its report and
    the two schedulers."""

    def __init__(
        self,
        grids: list[Grid],
        backend: Backend,
        config: RolloutConfig,
        out_path: Path,
        backend_description: dict[str, Any] | None,
    ) -> None:
        self.started = time.perf_counter()
        self.backend, self.config, self.out_path, self.grids = backend, config, out_path, grids
        self.policies = _solved(grids)
        self.template = (
            PromptTemplate.from_dir(config.template_dir) if config.template_dir else None
        )
        self.description = backend_description or describe_backend(backend)
        self.run_id = run_id_for(config, self.description)
        self.scheduling = "per_episode" if per_episode_scheduling(backend) else "lockstep"
        self.max_failed_rounds = 3
        self.counts = dict.fromkeys(
            "generate_calls episodes_run successes steps invalid_steps retokenized_steps "
            "truncated_episodes failed_rounds failed_generations".split(),
            0,
        )
        """The counters of :class:`RolloutReport`, by its field names."""
        self.batch = HalvingBatch("generation", config.batch_size)
        """The generation batch of lockstep rounds, halved on an out-of-memory error."""

    def open(self, progress: bool) -> None:
        """Write or check the run header and queue the episodes not yet in the file."""
        from tqdm.auto import tqdm

        config = self.config
        header = RunHeader(
            run_id=self.run_id,
            config=asdict(config),
            backend=self.description,
            package_version=package_version(),
            chat_format=_chat_format_of(self.backend),
            prompt_coverage=rollout_coverage(
                self.backend, self.grids, self.policies, config, self.template
            ),
        )
        finished = open_for_resume(self.out_path, header)
        self.todo: deque[tuple[Grid, OptimalPolicy, int]] = deque(
            (grid, policy, index)
            for grid, policy in zip(self.grids, self.policies, strict=True)
            for index in range(config.episodes_per_grid)
            if (grid.grid_id, index) not in finished
        )
        self.total = len(self.grids) * config.episodes_per_grid
        self.skipped = self.total - len(self.todo)
        if self.skipped:
            log.info(
                "%s: resuming, %d of %d episodes finished", self.out_path, self.skipped, self.total
            )
        self.bar = tqdm(total=len(self.todo), unit="episode", disable=not progress, desc="rollout")

    def report(self) -> RolloutReport:
        """What the run did so far."""
        return RolloutReport(
            out_path=self.out_path,
            run_id=self.run_id,
            episodes_total=self.total,
            episodes_skipped=self.skipped,
            seconds=time.perf_counter() - self.started,
            scheduling=self.scheduling,
            batch=self.batch.to_dict() if self.scheduling == "lockstep" else None,
            **self.counts,
        )

    def stopped(self, what: str, err: BaseException) -> RolloutStopped:
        """The error that stops the run after too many failures."""
        return RolloutStopped(
            f"{what} (last: {err}); {self.skipped + self.counts['episodes_run']} of "
            f"{self.total} episodes finished and written; rerun the same command to resume",
            self.report(),
        )

    def new_episode(self, grid: Grid, policy: OptimalPolicy, index: int) -> _Episode:
        """The next episode to put in flight."""
        return _Episode(self.run_id, grid, policy, index, self.config, self.template)

    def finish(self, episode: _Episode) -> None:
        """Write a finished episode and count it."""
        summary = episode.summary()
        append_episode(self.out_path, episode.steps, summary)
        c = self.counts
        c["episodes_run"] += 1
        c["successes"] += summary.success
        c["steps"] += summary.length
        c["invalid_steps"] += summary.invalid_steps
        c["truncated_episodes"] += summary.end_reason == "truncated"
        c["retokenized_steps"] += sum(s.token_ids_source == "retokenized" for s in episode.steps)
        self.bar.update(1)
        self.bar.set_postfix(
            steps=c["steps"],
            invalid=c["invalid_steps"],
            truncated=c["truncated_episodes"],
            success=c["successes"],
            refresh=False,
        )

    async def per_episode(self) -> None:
        """Per-episode scheduling: ``batch_size`` workers, each running episodes one request
        at a time (a failed request is sent again with the same seed)."""
        stop: list[BaseException] = []
        server: Any = self.backend  # per_episode_scheduling: it has session() and acomplete()
        c = self.counts

        async def worker() -> None:
            while self.todo and not stop:
                episode = self.new_episode(*self.todo.popleft())
                failures = 0
                while not episode.done:
                    try:
                        c["generate_calls"] += 1
                        completion = await server.acomplete(
                            episode.messages(), self.config.sampling(None), episode.attempt_seed
                        )
                    except BatchGenerationError as err:
                        c["failed_rounds"] += 1
                        c["failed_generations"] += 1
                        failures += 1
                        if stop:
                            return
                        if failures > self.max_failed_rounds:
                            stop.append(err)
                            return
                        log.warning("episode %s: %s; sending it again", episode.key, err)
                        continue
                    if stop:
                        return
                    failures = 0
                    episode.consume(completion)
                self.finish(episode)

        async with server.session():
            tasks = [asyncio.ensure_future(worker()) for _ in range(self.config.batch_size)]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:  # a fatal error in one episode ends the others' requests
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        if stop:
            what = f"a request failed {self.max_failed_rounds + 1} times in a row"
            raise self.stopped(what, stop[0]) from stop[0]

    def lockstep(self) -> None:
        """Lockstep rounds: every episode in flight sends its conversation in one round, in
        generation batches that halve on an out-of-memory error; failed conversations stay at
        their step and go again next round."""
        active: list[_Episode] = []
        consecutive = 0
        c = self.counts
        while self.todo or active:
            while self.todo and len(active) < self.config.batch_size:
                active.append(self.new_episode(*self.todo.popleft()))
            completions, failure = self._round(active)
            for episode, completion in zip(active, completions, strict=True):
                if completion is not None:  # a failed conversation stays at its step
                    episode.consume(completion)
            for episode in active:
                if episode.done:
                    self.finish(episode)
            active = [episode for episode in active if not episode.done]
            if failure is None:
                consecutive = 0
                continue
            c["failed_rounds"] += 1
            c["failed_generations"] += sum(x is None for x in completions)
            consecutive += 1
            log.warning(
                "round %d: %s; the failed conversations go again", c["generate_calls"], failure
            )
            if consecutive > self.max_failed_rounds:
                raise self.stopped(f"{consecutive} consecutive rounds failed", failure) from failure

    def _round(
        self, active: list[_Episode]
    ) -> tuple[list[Completion | None], BatchGenerationError | None]:
        """One round's completions (None where a conversation failed) and its failure."""
        failures: list[BatchGenerationError] = []

        def call(chunk: Sequence[_Episode]) -> list[Completion | None]:
            self.counts["generate_calls"] += 1
            try:
                return list(_generate(self.backend, chunk, self.config))
            except BatchGenerationError as err:
                if len(err.completions) != len(chunk):
                    raise
                failures.append(err)
                return list(err.completions)

        completions = self.batch.run(active, call)
        return completions, (failures[-1] if failures else None)


def _generate(
    backend: Backend, active: Sequence[_Episode], config: RolloutConfig
) -> list[Completion]:
    batch = [episode.messages() for episode in active]
    seeds = [episode.attempt_seed for episode in active]
    # one seed per call: a single conversation keeps its own seed (as with per-row seeds)
    call_seed = seeds[0] if len(seeds) == 1 else derive_seed(*seeds)
    completions = generate_seeded(backend, batch, config.sampling(None), seeds, call_seed)
    if len(completions) != len(batch):
        raise RuntimeError(
            f"backend returned {len(completions)} completions for {len(batch)} conversations"
        )
    return list(completions)


def merge_trajectory_files(shards: Sequence[str | os.PathLike], out: str | os.PathLike) -> int:
    """Write the episodes of ``shards`` (one run's trajectory files) into ``out`` (written beside
    it and renamed into place when complete); returns the number of episodes written.

    Raises:
        TrajectoryFormatError: the files hold different runs, or an episode appears twice.
        ValueError: no shard given.
    """
    if not shards:
        raise ValueError("no trajectory files to merge")
    paths = [Path(s) for s in shards]
    headers = [read_run_header(p) for p in paths]
    for path, header in zip(paths, headers, strict=True):
        if header.run_id != headers[0].run_id:
            raise TrajectoryFormatError(
                f"{path} holds run {header.run_id!r}, {paths[0]} run {headers[0].run_id!r}: "
                "only the shards of one run merge"
            )
    episodes: dict[tuple[str, int], tuple[Path, Episode]] = {}
    for path in paths:
        for episode in read_trajectories(path):
            if episode.key in episodes:
                raise TrajectoryFormatError(
                    f"episode {episode.key} is in both {episodes[episode.key][0]} and {path}"
                )
            episodes[episode.key] = (path, episode)
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    open_for_resume(partial, headers[0])
    for key in sorted(episodes):
        episode = episodes[key][1]
        append_episode(partial, list(episode.steps), episode.summary)
    os.replace(partial, out)
    return len(episodes)
