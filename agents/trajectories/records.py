"""Records of a trajectory file (:mod:`goalprobe.agents.trajectories`) and their validation.

The schema string (:data:`SCHEMA`) is spelled here and nowhere else: one dataclass per line
kind, :func:`record_to_json` to write a line, :func:`parse_record` to check a decoded line and
build its record.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from goalprobe.gridworld.core import Action, RowCol, State

SCHEMA = "goalprobe.trajectory/2"
"""Schema string carried by every line of a trajectory file."""

TokenIdsSource = Literal["model", "retokenized"]


class TrajectoryFormatError(ValueError):
    """A trajectory file breaks the schema; the message names the file, line and field."""


class TruncatedLineWarning(UserWarning):
    """The final line of a trajectory file is cut off (the writing run was killed); ignored."""


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunHeader:
    """The first line of a trajectory file.

    Attributes:
        run_id: identifies the rollout configuration; a resume must present the same id.
        config: the rollout config as JSON (see ``goalprobe.agents.rollout.RolloutConfig``).
        backend: a JSON description of the backend (class, model, ...).
        package_version: the goalprobe version that wrote the file.
        chat_format: JSON description of the chat format the prompts and completions are in
            (:meth:`goalprobe.agents.chat_format.ChatFormat.describe`); None (absent from the
            line) in files written before formats were recorded, which are harmony.
    """

    run_id: str
    config: dict
    backend: dict
    package_version: str
    chat_format: dict | None = None
    prompt_coverage: dict | None = None


@dataclass(frozen=True)
class Attempt:
    """One rejected generation of a step (the agent's output named no valid action).

    Attributes:
        generated_token_ids: ``(n_generated,)`` ids of the generated text.
        token_ids_source: ``"model"`` (ids the model produced) or ``"retokenized"``.
        reasoning: the analysis-channel text, or None.
        final: the final-channel text, or None when the model produced none.
        finish_reason: why generation stopped (``"stop"``, ``"length"``, ...).
        parse_error: why no action could be parsed.
    """

    generated_token_ids: list[int]
    token_ids_source: TokenIdsSource
    reasoning: str | None
    final: str | None
    finish_reason: str
    parse_error: str


@dataclass(frozen=True)
class StepRecord:
    """One step ``t`` of an episode: the state shown, what the agent produced, what it did.

    Attributes:
        run_id: the run this step belongs to.
        grid_id: the grid the episode runs on.
        episode: the episode's index on its grid (0-based).
        step: the step index ``t`` (0-based).
        episode_seed: the seed the episode's sampling derives from.
        grid_size: side ``n`` of the grid.
        density: obstacle density of the grid (None when unknown).
        variant: grid variant name (``goalprobe.gridworld.core.Variant``).
        grid_text: the grid text shown to the agent in state ``s_t`` (on a false-belief grid
            the shown grid: the oracle belief).
        true_grid_text: the true grid's text in ``s_t`` when it differs from ``grid_text`` (a
            false-belief grid), else None.
        agent_row_col: the agent's cell in ``s_t``.
        goal_row_col: the goal cell.
        has_key: whether the agent holds the key in ``s_t``.
        door_open: whether the door is open in ``s_t`` (True when the grid has no door).
        key_row_col: the key cell, None when the grid has no key.
        door_row_col: the door cell, None when the grid has no door.
        optimal_actions: ``pi*(s_t)``, the optimal actions as sorted names.
        distance_to_goal: shortest path length from ``s_t`` to the goal.
        action: the executed action name, None when the step is invalid (agent stays put).
        valid: whether an action was parsed (after retries).
        next_agent_row_col: the agent's cell in ``s_{t+1}``.
        prompt_token_ids: ``(n_prompt,)`` ids of the full prompt, as the model saw it.
        generated_token_ids: ``(n_generated,)`` ids of the generated text of the used attempt.
        token_ids_source: ``"model"`` or ``"retokenized"`` (rebuilt from text returned by a
            server that does not return ids; replays are then approximate).
        reasoning: analysis-channel text of the used attempt, or None.
        final: final-channel text of the used attempt, or None.
        finish_reason: why the used attempt's generation stopped.
        parse_error: why the used attempt named no action (None when valid).
        parse_form: how the action was parsed (``"json"``, ``"relaxed_json"``, ``"key_value"``).
        attempts: number of generations for this step (1 + len(rejected_attempts); 0 for a
            prompt-only state, see :mod:`goalprobe.agents.prompt_states`).
        rejected_attempts: the earlier attempts whose output named no action, in order.
        flags: notes, e.g. ``"retried"``, ``"invalid"``, ``"retokenized"``,
            ``"max_tokens_reached"``, ``"relaxed_parse"``.
    """

    run_id: str
    grid_id: str
    episode: int
    step: int
    episode_seed: int
    grid_size: int
    density: float | None
    variant: str
    grid_text: str
    agent_row_col: RowCol
    goal_row_col: RowCol
    has_key: bool
    door_open: bool
    key_row_col: RowCol | None
    door_row_col: RowCol | None
    optimal_actions: list[str]
    distance_to_goal: int
    action: str | None
    valid: bool
    next_agent_row_col: RowCol
    prompt_token_ids: list[int]
    generated_token_ids: list[int]
    token_ids_source: TokenIdsSource
    reasoning: str | None
    final: str | None
    finish_reason: str
    parse_error: str | None
    parse_form: str | None
    attempts: int
    rejected_attempts: list[Attempt] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    true_grid_text: str | None = None

    @property
    def truncated(self) -> bool:
        """Whether the generation was cut off by the token limit (not the agent's choice)."""
        return "truncated" in self.flags

    @property
    def false_belief(self) -> bool:
        """Whether the prompt drew a grid other than the true one."""
        return self.true_grid_text is not None

    @property
    def state(self) -> State:
        """The state ``s_t`` the agent acted in."""
        return State(agent=self.agent_row_col, has_key=self.has_key, door_open=self.door_open)

    @property
    def action_enum(self) -> Action | None:
        """The executed action as an :class:`Action`, None for an invalid step."""
        return None if self.action is None else Action[self.action]

    @property
    def optimal_action_set(self) -> frozenset[Action]:
        """``pi*(s_t)`` as a set of :class:`Action`."""
        return frozenset(Action[a] for a in self.optimal_actions)


@dataclass(frozen=True)
class EpisodeSummary:
    """The last line of an episode.

    Attributes:
        run_id: the run this episode belongs to.
        grid_id: the grid it ran on.
        episode: its index on the grid (0-based).
        episode_seed: the seed its sampling derives from.
        grid_size: side ``n`` of the grid.
        density: obstacle density (None when unknown).
        variant: grid variant name.
        success: whether the agent reached the goal.
        end_reason: ``"goal"``, ``"horizon"``, ``"truncated"`` (the last step's generation
            was cut off by the token limit: behaviour metrics leave the episode out), or
            ``"prompt_only"`` (a state written without generation by
            :mod:`goalprobe.agents.prompt_states`; no behaviour).
        length: number of steps taken (valid, invalid and truncated).
        invalid_steps: steps whose every attempt named no action (truncated steps excluded).
        optimal_steps: valid steps whose action was in ``pi*(s_t)``.
        total_attempts: generations over all steps (retries included).
        horizon: the step budget ``T``.
        shortest_path_length: ``L``, shortest path length from the start state.
        start_row_col: the agent's start cell.
        goal_row_col: the goal cell.
        final_agent_row_col: the agent's cell after the last step.
        final_has_key: whether the agent held the key at the end.
        final_door_open: whether the door was open at the end.
    """

    run_id: str
    grid_id: str
    episode: int
    episode_seed: int
    grid_size: int
    density: float | None
    variant: str
    success: bool
    end_reason: Literal["goal", "horizon", "truncated", "prompt_only"]
    length: int
    invalid_steps: int
    optimal_steps: int
    total_attempts: int
    horizon: int
    shortest_path_length: int
    start_row_col: RowCol
    goal_row_col: RowCol
    final_agent_row_col: RowCol
    final_has_key: bool
    final_door_open: bool

    @property
    def key(self) -> tuple[str, int]:
        """``(grid_id, episode)``, the episode's identity within its run."""
        return (self.grid_id, self.episode)

    @property
    def truncated(self) -> bool:
        """Whether the episode ended on a generation cut off by the token limit."""
        return self.end_reason == "truncated"

    @property
    def final_state(self) -> State:
        """The state after the last step."""
        return State(
            agent=self.final_agent_row_col,
            has_key=self.final_has_key,
            door_open=self.final_door_open,
        )


@dataclass(frozen=True)
class Episode:
    """A finished episode: its steps in order and its summary."""

    steps: tuple[StepRecord, ...]
    summary: EpisodeSummary

    @property
    def key(self) -> tuple[str, int]:
        """``(grid_id, episode)``."""
        return self.summary.key

    @property
    def truncated(self) -> bool:
        """Whether the episode ended on a generation cut off by the token limit (behaviour
        metrics leave it out and count it apart)."""
        return self.summary.truncated

    def to_trajectory_data(self):
        """This episode as :class:`goalprobe.gridworld.metrics.TrajectoryData` (states
        ``s_0 .. s_T``, actions with None for invalid steps, optimal sets, success)."""
        from goalprobe.gridworld.metrics import TrajectoryData

        states = tuple(s.state for s in self.steps) + (self.summary.final_state,)
        return TrajectoryData(
            grid_id=self.summary.grid_id,
            states=states,
            actions=tuple(s.action_enum for s in self.steps),
            optimal_sets=tuple(s.optimal_action_set for s in self.steps),
            success=self.summary.success,
        )


Record = RunHeader | StepRecord | EpisodeSummary
_KIND_OF: dict[type, str] = {RunHeader: "run", StepRecord: "step", EpisodeSummary: "episode"}


# --------------------------------------------------------------------------------------------
# Serialisation and validation
# --------------------------------------------------------------------------------------------


def record_to_json(record: Record) -> str:
    """One JSONL line (with trailing newline) for ``record``."""
    payload = {"schema": SCHEMA, "kind": _KIND_OF[type(record)], **asdict(record)}
    if isinstance(record, RunHeader) and record.chat_format is None:
        del payload["chat_format"]  # files without it are harmony, as before formats existed
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n"


_ROW_COL = "row_col"
_TOKEN_ID = "token_id"


def _check(value: Any, spec: Any, where: str) -> Any:
    """Validate ``value`` against ``spec`` and convert it (row/col lists to tuples)."""
    if spec == _ROW_COL:
        if (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            return (value[0], value[1])
        raise TrajectoryFormatError(f"{where}: expected [row, col] integers, got {value!r}")
    if spec == _TOKEN_ID:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise TrajectoryFormatError(
            f"{where}: expected a token id (integer >= 0), got {_clip(value)}"
        )
    if isinstance(spec, tuple) and spec[0] == "optional":
        return None if value is None else _check(value, spec[1], where)
    if isinstance(spec, tuple) and spec[0] == "list":
        if not isinstance(value, list):
            raise TrajectoryFormatError(f"{where}: expected a list, got {type(value).__name__}")
        return [_check(v, spec[1], f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(spec, tuple) and spec[0] == "enum":
        if value not in spec[1]:
            raise TrajectoryFormatError(f"{where}: expected one of {spec[1]}, got {value!r}")
        return value
    if spec is Attempt:
        return _from_dict(Attempt, value, where)
    if spec is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif spec is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, spec):
        return value
    raise TrajectoryFormatError(
        f"{where}: expected {getattr(spec, '__name__', spec)}, got {type(value).__name__} "
        f"{_clip(value)}"
    )


_ACTION_NAMES = tuple(a.name for a in Action)
_SOURCES = ("model", "retokenized")

_SPECS: dict[type, dict[str, Any]] = {
    RunHeader: {
        "run_id": str,
        "config": dict,
        "backend": dict,
        "package_version": str,
        "chat_format": ("optional", dict),
        "prompt_coverage": ("optional", dict),
    },
    Attempt: {
        "generated_token_ids": ("list", _TOKEN_ID),
        "token_ids_source": ("enum", _SOURCES),
        "reasoning": ("optional", str),
        "final": ("optional", str),
        "finish_reason": str,
        "parse_error": str,
    },
    StepRecord: {
        "run_id": str,
        "grid_id": str,
        "episode": int,
        "step": int,
        "episode_seed": int,
        "grid_size": int,
        "density": ("optional", float),
        "variant": str,
        "grid_text": str,
        "agent_row_col": _ROW_COL,
        "goal_row_col": _ROW_COL,
        "has_key": bool,
        "door_open": bool,
        "key_row_col": ("optional", _ROW_COL),
        "door_row_col": ("optional", _ROW_COL),
        "optimal_actions": ("list", ("enum", _ACTION_NAMES)),
        "distance_to_goal": int,
        "action": ("optional", ("enum", _ACTION_NAMES)),
        "valid": bool,
        "next_agent_row_col": _ROW_COL,
        "prompt_token_ids": ("list", _TOKEN_ID),
        "generated_token_ids": ("list", _TOKEN_ID),
        "token_ids_source": ("enum", _SOURCES),
        "reasoning": ("optional", str),
        "final": ("optional", str),
        "finish_reason": str,
        "parse_error": ("optional", str),
        "parse_form": ("optional", ("enum", ("json", "relaxed_json", "key_value"))),
        "attempts": int,
        "rejected_attempts": ("list", Attempt),
        "flags": ("list", str),
        "true_grid_text": ("optional", str),
    },
    EpisodeSummary: {
        "run_id": str,
        "grid_id": str,
        "episode": int,
        "episode_seed": int,
        "grid_size": int,
        "density": ("optional", float),
        "variant": str,
        "success": bool,
        "end_reason": ("enum", ("goal", "horizon", "truncated", "prompt_only")),
        "length": int,
        "invalid_steps": int,
        "optimal_steps": int,
        "total_attempts": int,
        "horizon": int,
        "shortest_path_length": int,
        "start_row_col": _ROW_COL,
        "goal_row_col": _ROW_COL,
        "final_agent_row_col": _ROW_COL,
        "final_has_key": bool,
        "final_door_open": bool,
    },
}


def _from_dict(cls: type, obj: Any, where: str) -> Any:
    if not isinstance(obj, dict):
        raise TrajectoryFormatError(f"{where}: expected an object, got {type(obj).__name__}")
    spec = _SPECS[cls]
    may_lack = _MAY_BE_ABSENT.get(cls, ())
    missing = [name for name in spec if name not in obj and name not in may_lack]
    if missing:
        raise TrajectoryFormatError(f"{where}: missing field(s) {', '.join(missing)}")
    values = {
        name: _check(obj[name], s, f"{where}: field {name!r}")
        for name, s in spec.items()
        if name in obj
    }
    return cls(**values)


_MAY_BE_ABSENT: dict[type, tuple[str, ...]] = {RunHeader: ("chat_format", "prompt_coverage")}
"""Fields later versions added, absent from older lines (their dataclass default applies)."""


def parse_record(obj: Any, where: str) -> Record:
    """Validate one decoded line and build its record; ``where`` prefixes error messages."""
    if not isinstance(obj, dict):
        raise TrajectoryFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    schema = obj.get("schema")
    if schema != SCHEMA:
        raise TrajectoryFormatError(
            f"{where}: schema {schema!r} is not {SCHEMA!r} (not a goalprobe trajectory file, "
            "or written by another version)"
        )
    kind = obj.get("kind")
    for cls, name in _KIND_OF.items():
        if kind == name:
            body = {k: v for k, v in obj.items() if k not in ("schema", "kind")}
            record = _from_dict(cls, body, where)
            _check_consistency(record, where)
            return record
    raise TrajectoryFormatError(f"{where}: field 'kind' is {kind!r}, not run/step/episode")


def _check_consistency(record: Record, where: str) -> None:
    if isinstance(record, StepRecord):
        if record.valid != (record.action is not None):
            raise TrajectoryFormatError(f"{where}: 'valid' disagrees with 'action'")
        if record.finish_reason == "prompt_only":
            if record.attempts or record.generated_token_ids or record.rejected_attempts:
                raise TrajectoryFormatError(
                    f"{where}: a prompt-only step has no attempts and no generated tokens"
                )
        elif record.attempts != len(record.rejected_attempts) + 1:
            raise TrajectoryFormatError(
                f"{where}: 'attempts' is {record.attempts} but there are "
                f"{len(record.rejected_attempts)} rejected attempts (expected attempts - 1)"
            )
    if isinstance(record, EpisodeSummary) and record.success != (record.end_reason == "goal"):
        raise TrajectoryFormatError(f"{where}: 'success' disagrees with 'end_reason'")


def _clip(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
