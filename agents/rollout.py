"""Run an agent in the grid world: many episodes at once, every step recorded.

An episode starts in the settled initial state of its grid and, at every step ``t``, shows the
agent the current grid (a fresh conversation: instructions + grid, see
:mod:`goalprobe.agents.prompts`), parses the final answer into an action
(:mod:`goalprobe.agents.parser`) and executes it (:mod:`goalprobe.gridworld.dynamics`). It
ends on success (the agent stands on the goal) or when ``T`` steps have been taken.

**Invalid output.** When an answer names no action, the step is retried up to
``RolloutConfig.retries`` times (each rejected attempt is recorded in the step); if every
attempt fails the step is *invalid*: the agent stays in place, the step counts towards the
horizon, and the step line has ``action: null, valid: false``. No episode is ever dropped.

**Scheduling.** Up to ``batch_size`` episodes are in flight. A backend that answers one
conversation at a time concurrently (a server: it has ``session()`` and ``acomplete()``) is
scheduled *per episode*: each episode sends its next request as soon as its previous answer
came back, and a finished episode's slot goes at once to the next one, so the server's batch
stays full and no episode waits for the longest reasoning trace of a round. Other backends (a
local model, which batches on its own device) run in *lockstep rounds*: each round sends the
current conversation of every episode in flight to ``backend.generate`` in one call (a retry is
simply the same episode's next round). With per-conversation seeds both give the same
episodes; only the order they are written in differs.

**Truncated output.** A generation cut off by the token limit (``finish_reason == "length"``)
is not the agent's choice, even when part of its answer would parse: it is not retried at the
same budget, the step is recorded with ``action: null`` and the flag ``"truncated"``, and the
episode ends there with ``end_reason: "truncated"`` (``success: false``). Behaviour metrics
leave truncated episodes out and report how many there were
(:attr:`goalprobe.agents.trajectories.Episode.truncated`); a budget that cuts more than a few
percent of steps is refused before the run by the pre-flight
(:mod:`goalprobe.agents.preflight`).

**Seeds.** Episode ``e`` on grid ``g`` samples with ``episode_seed = H(seed, g, e)`` and the
attempt ``k`` of its step ``t`` with ``H(episode_seed, t, k)`` (H: SHA-256 folded to 31 bits).
When the backend's ``generate`` accepts ``seeds=`` (one per conversation) these are passed per
conversation and an episode's rollout does not depend on which episodes share its batch. A
backend without it gets one seed per call: the conversation's own seed when the call holds one
conversation (``batch_size=1``: rollouts are then independent of scheduling and resumable
bit for bit), else a seed derived from the seeds of the conversations in it (reproducible for
the same config and schedule only).

**Failed requests.** Per episode: a request that failed after the backend's own retries is
sent again with the same seed; an episode whose request fails more than ``max_failed_rounds``
times in a row stops the run (:class:`RolloutStopped`). In lockstep rounds: a backend raises
:class:`~goalprobe.agents.backend.BatchGenerationError` when some of a round's conversations
failed after the backend's own retries: the answered ones are used, the failed ones stay at
their step and are sent again next round with the same seed, so the trajectories equal those
of a run without failures. After ``max_failed_rounds`` consecutive rounds with failures the run
stops with :class:`RolloutStopped`; every episode finished so far is on disk, and rerunning
resumes. No episode is dropped or written twice.

**Resume.** Each episode is written as one block (steps then summary) when it ends
(:func:`goalprobe.agents.trajectories.append_episode`); rerunning with the same config and
output resumes: finished episodes are skipped and the interrupted tail is cut off, so an
interrupted run loses only the episodes in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, cast

from goalprobe.agents.backend import (
    Backend,
    BatchGenerationError,
    Completion,
    SamplingConfig,
    SeededBackend,
)
from goalprobe.agents.coverage import backend_coverage
from goalprobe.agents.harmony import REASONING_EFFORTS, Message, ReasoningEffort
from goalprobe.agents.parser import parse_completion
from goalprobe.agents.prompts import PromptTemplate, build_messages
from goalprobe.agents.trajectories import (
    Attempt,
    EpisodeSummary,
    RunHeader,
    StepRecord,
    append_episode,
    open_for_resume,
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
    """Add the instruction to avoid the flower beds to the prompt of harm grids (MACHIAVELLI's
    moral conditioning; :func:`goalprobe.agents.prompts.build_instructions`). Other grids'
    prompts are unaffected."""

    def __post_init__(self) -> None:
        if self.episodes_per_grid < 1:
            raise ValueError(f"episodes_per_grid must be >= 1, got {self.episodes_per_grid}")
        if not (math.isfinite(self.horizon_factor) and self.horizon_factor > 0):
            raise ValueError(f"horizon_factor must be > 0, got {self.horizon_factor}")
        if self.horizon_steps is not None and self.horizon_steps < 1:
            raise ValueError(f"horizon_steps must be >= 1 or None, got {self.horizon_steps}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(
                f"reasoning_effort must be one of {REASONING_EFFORTS}, got "
                f"{self.reasoning_effort!r}"
            )
        self.sampling(0)  # validates temperature, top_p, max_new_tokens

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
    """What :func:`run_rollouts` did.

    Attributes:
        out_path: the trajectory file.
        run_id: the run's identity (see :func:`run_id_for`).
        episodes_total: episodes the grids and config call for.
        episodes_skipped: episodes already finished in the file (resume).
        episodes_run: episodes run now.
        successes: successful episodes among those run now.
        steps: steps taken now.
        invalid_steps: invalid steps among them (answers naming no action; truncated steps
            not included).
        generate_calls: ``backend.generate`` calls made now.
        seconds: wall time.
        failed_rounds: rounds in which some conversations failed (and were sent again);
            per-episode scheduling: failed requests (each sent again).
        failed_generations: conversations that failed in those rounds.
        retokenized_steps: steps among those taken now whose token ids were rebuilt from the
            server's text (not the ids the model read; see
            :mod:`goalprobe.agents.server_backend`).
        scheduling: ``"per_episode"`` or ``"lockstep"``.
    """

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

    @property
    def steps_per_second(self) -> float:
        """Steps taken per wall-clock second (nan when nothing ran)."""
        return self.steps / self.seconds if self.seconds > 0 and self.steps else math.nan


class RolloutStopped(RuntimeError):
    """The backend kept failing; the run stopped in a resumable state.

    Attributes:
        report: what the run did before it stopped (finished episodes are on disk).
    """

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
    """:func:`~goalprobe.agents.coverage.backend_coverage` of every grid's first prompt."""
    firsts = [
        _Episode(run_id="", grid=g, policy=p, index=0, config=config, template=template)
        for g, p in zip(grids, policies, strict=True)
    ]
    shown = [(e.messages(), e) for e in firsts]  # messages() draws the grid text
    return backend_coverage(backend, [(e._grid_text, m) for m, e in shown], config.reasoning_effort)


def run_id_for(config: RolloutConfig, backend_description: dict[str, Any]) -> str:
    """The run id: 16 hex digits of the SHA-256 of the config identity and the backend."""
    import json

    payload = json.dumps(
        {"config": config.identity(), "backend": backend_description},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class _Episode:
    """The mutable state of one episode in flight."""

    def __init__(
        self,
        *,
        run_id: str,
        grid: Grid,
        policy: OptimalPolicy,
        index: int,
        config: RolloutConfig,
        template: PromptTemplate | None,
    ) -> None:
        self.run_id = run_id
        self.grid = grid
        self.policy = policy
        self.index = index
        self.config = config
        self.template = template
        self.seed = derive_seed(config.seed, grid.grid_id, index)
        self.shortest_path_length = policy.shortest_path_length
        self.horizon = config.horizon(self.shortest_path_length)
        self.start = initial_state(grid)
        self.state = self.start
        self.steps: list[StepRecord] = []
        self.rejected: list[Attempt] = []
        self.truncated = False
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
        if not parsed.ok and not parsed.truncated and len(self.rejected) < self.config.retries:
            self.rejected.append(
                Attempt(
                    generated_token_ids=[int(i) for i in completion.generated_token_ids],
                    token_ids_source=completion.token_ids_source,
                    reasoning=completion.reasoning,
                    final=completion.final,
                    finish_reason=completion.finish_reason,
                    parse_error=str(parsed.error),
                )
            )
            return
        state = self.state
        next_state = step(self.grid, state, parsed.action) if parsed.action is not None else state
        flags = []
        if self.rejected:
            flags.append("retried")
        if parsed.truncated:
            flags.append("truncated")
            self.truncated = True
        elif not parsed.ok:
            flags.append("invalid")
        elif next_state.agent == state.agent:
            flags.append("blocked_move")
        if parsed.form in ("relaxed_json", "key_value"):
            flags.append("relaxed_parse")
        if completion.token_ids_source == "retokenized":
            flags.append("retokenized")
        if completion.finish_reason == "length":
            flags.append("max_tokens_reached")
        if not completion.well_formed:
            flags.append("malformed_harmony")
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
                generated_token_ids=[int(i) for i in completion.generated_token_ids],
                token_ids_source=completion.token_ids_source,
                reasoning=completion.reasoning,
                final=completion.final,
                finish_reason=completion.finish_reason,
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
            shortest_path_length=self.shortest_path_length,
            start_row_col=self.start.agent,
            goal_row_col=self.grid.goal,
            final_agent_row_col=self.state.agent,
            final_has_key=self.state.has_key,
            final_door_open=self.state.door_open,
        )


def state_fields(grid: Grid, policy: OptimalPolicy, state: State, grid_text: str) -> dict:
    """The :class:`StepRecord` fields that describe the state ``s_t`` shown to the agent (its
    grid, cells, key and door status, optimal actions and distance to the goal).

    Cells, optimal actions and distance are the true grid's; ``grid_text`` is what the prompt
    drew (the shown grid of a false-belief grid: the oracle belief; the fogged view of a fogged
    grid), and ``true_grid_text`` the
    true grid's text in ``s_t`` when the two differ (None otherwise)."""
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


def _accepts_seeds(backend: Backend) -> bool:
    try:
        return "seeds" in inspect.signature(backend.generate).parameters
    except (TypeError, ValueError):
        return False


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

    Resumes when ``out_path`` already holds episodes of the same run (same config identity and
    backend description): those are skipped. Episodes run in the order of ``grids``, then
    episode index; at most ``config.batch_size`` are in flight.

    Args:
        grids: the grids (each with a non-empty, unique ``grid_id``; solvable).
        backend: anything with ``generate(batch, sampling) -> list[Completion]``.
        config: the rollout config.
        out_path: the trajectory JSONL file (schema ``goalprobe.trajectory/2``).
        progress: show a progress bar (tqdm, on stderr).
        backend_description: JSON facts identifying the backend (model path, ...), recorded in
            the run header and part of the run id; None uses :func:`describe_backend`.
        max_failed_rounds: consecutive rounds with failed conversations tolerated (each failed
            conversation is sent again next round); one more stops the run.

    Returns:
        a :class:`RolloutReport` of this call.

    Raises:
        ValueError: a grid has an empty or repeated ``grid_id``, or cannot be solved.
        TrajectoryFormatError: ``out_path`` belongs to another run or is corrupt.
        RolloutStopped: more than ``max_failed_rounds`` consecutive rounds had failures; rerun
            to resume.
    """
    from tqdm.auto import tqdm

    if max_failed_rounds < 0:
        raise ValueError(f"max_failed_rounds must be >= 0, got {max_failed_rounds}")
    started = time.perf_counter()
    out_path = Path(out_path)
    grids = list(grids)
    seen: set[str] = set()
    for i, grid in enumerate(grids):
        if not grid.grid_id:
            raise ValueError(f"grid {i} has an empty grid_id; trajectories join on it")
        if grid.grid_id in seen:
            raise ValueError(f"grid_id {grid.grid_id!r} repeats")
        seen.add(grid.grid_id)
    template = PromptTemplate.from_dir(config.template_dir) if config.template_dir else None
    if backend_description is None:
        backend_description = describe_backend(backend)
    run_id = run_id_for(config, backend_description)
    policies = [solve(grid) for grid in grids]
    for grid, policy in zip(grids, policies, strict=True):
        if not policy.is_solvable:
            raise ValueError(f"grid {grid.grid_id!r}: the goal cannot be reached from the start")
    header = RunHeader(
        run_id=run_id,
        config=asdict(config),
        backend=backend_description,
        package_version=package_version(),
        chat_format=_chat_format_of(backend),
        prompt_coverage=rollout_coverage(backend, grids, policies, config, template),
    )
    finished = open_for_resume(out_path, header)

    todo: deque[tuple[Grid, OptimalPolicy, int]] = deque()
    total = 0
    for grid, policy in zip(grids, policies, strict=True):
        for index in range(config.episodes_per_grid):
            total += 1
            if (grid.grid_id, index) not in finished:
                todo.append((grid, policy, index))
    skipped = total - len(todo)
    if skipped:
        log.info("%s: resuming, %d of %d episodes already finished", out_path, skipped, total)

    per_row_seeds = _accepts_seeds(backend)
    active: list[_Episode] = []
    calls = episodes_run = successes = steps = invalid = retokenized = truncated = 0
    failed_rounds = failed_generations = consecutive_failures = 0
    scheduling = "per_episode" if per_episode_scheduling(backend) else "lockstep"

    def report() -> RolloutReport:
        return RolloutReport(
            out_path=out_path,
            run_id=run_id,
            episodes_total=total,
            episodes_skipped=skipped,
            episodes_run=episodes_run,
            successes=successes,
            steps=steps,
            invalid_steps=invalid,
            generate_calls=calls,
            seconds=time.perf_counter() - started,
            failed_rounds=failed_rounds,
            failed_generations=failed_generations,
            retokenized_steps=retokenized,
            scheduling=scheduling,
            truncated_episodes=truncated,
        )

    def new_episode(grid: Grid, policy: OptimalPolicy, index: int) -> _Episode:
        return _Episode(
            run_id=run_id, grid=grid, policy=policy, index=index, config=config, template=template
        )

    def finish(episode: _Episode) -> None:
        nonlocal episodes_run, successes, steps, invalid, retokenized, truncated
        summary = episode.summary()
        append_episode(out_path, episode.steps, summary)
        episodes_run += 1
        successes += summary.success
        steps += summary.length
        invalid += summary.invalid_steps
        truncated += summary.end_reason == "truncated"
        retokenized += sum(s.token_ids_source == "retokenized" for s in episode.steps)
        bar.update(1)
        bar.set_postfix(
            steps=steps, invalid=invalid, truncated=truncated, success=successes, refresh=False
        )

    async def per_episode() -> None:
        nonlocal calls, failed_rounds, failed_generations
        stop: list[BaseException] = []
        server: Any = backend  # per_episode_scheduling(backend): it has session() and acomplete()

        async def worker() -> None:
            nonlocal calls, failed_rounds, failed_generations
            while todo and not stop:
                episode = new_episode(*todo.popleft())
                failures = 0
                while not episode.done:
                    try:
                        calls += 1
                        completion = await server.acomplete(
                            episode.messages(), config.sampling(None), episode.attempt_seed
                        )
                    except BatchGenerationError as err:
                        failed_rounds += 1
                        failed_generations += 1
                        failures += 1
                        if stop:
                            return
                        if failures > max_failed_rounds:
                            stop.append(err)
                            return
                        log.warning("episode %s: %s; sending it again", episode.key, err)
                        continue
                    if stop:
                        return
                    failures = 0
                    episode.consume(completion)
                finish(episode)

        async with server.session():
            tasks = [asyncio.ensure_future(worker()) for _ in range(config.batch_size)]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:  # a fatal error in one episode ends the others' requests
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        if stop:
            raise RolloutStopped(
                f"a request failed {max_failed_rounds + 1} times in a row (last: {stop[0]}); "
                f"{skipped + episodes_run} of {total} episodes finished and written; rerun the "
                "same command to resume",
                report(),
            ) from stop[0]

    bar = tqdm(total=len(todo), unit="episode", disable=not progress, desc="rollout")
    try:
        if scheduling == "per_episode":
            _run_coroutine(per_episode())
            return report()
        while todo or active:
            while todo and len(active) < config.batch_size:
                active.append(new_episode(*todo.popleft()))
            try:
                completions: list[Completion | None] = list(
                    _generate(backend, active, config, per_row_seeds)
                )
                failure = None
            except BatchGenerationError as err:
                if len(err.completions) != len(active):
                    raise
                completions, failure = err.completions, err
            calls += 1
            for episode, completion in zip(active, completions, strict=True):
                if completion is not None:  # a failed conversation stays at its step
                    episode.consume(completion)
            still: list[_Episode] = []
            for episode in active:
                if not episode.done:
                    still.append(episode)
                    continue
                finish(episode)
            active = still
            if failure is None:
                consecutive_failures = 0
                continue
            failed_rounds += 1
            failed_generations += sum(c is None for c in completions)
            consecutive_failures += 1
            log.warning("round %d: %s; the failed conversations go again", calls, failure)
            if consecutive_failures > max_failed_rounds:
                raise RolloutStopped(
                    f"{consecutive_failures} consecutive rounds failed (last: {failure}); "
                    f"{skipped + episodes_run} of {total} episodes finished and written; rerun the same "
                    "command to resume",
                    report(),
                ) from failure
    finally:
        bar.close()
    return report()


def _run_coroutine(coroutine) -> Any:
    """Run ``coroutine`` to its end (on a worker thread when called inside an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _generate(
    backend: Backend, active: Sequence[_Episode], config: RolloutConfig, per_row_seeds: bool
) -> list[Completion]:
    batch = [episode.messages() for episode in active]
    seeds = [episode.attempt_seed for episode in active]
    if per_row_seeds:
        seeded = cast(SeededBackend, backend)  # checked by _accepts_seeds
        completions = seeded.generate(batch, config.sampling(None), seeds=seeds)
    else:
        # one seed per call: a single conversation keeps its own seed (as with per-row seeds)
        seed = seeds[0] if len(seeds) == 1 else derive_seed(*seeds)
        completions = backend.generate(batch, replace(config.sampling(None), seed=seed))
    if len(completions) != len(batch):
        raise RuntimeError(
            f"backend returned {len(completions)} completions for {len(batch)} conversations"
        )
    return list(completions)
