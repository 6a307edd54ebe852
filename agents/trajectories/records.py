"""Records of a trajectory file (:mod:`goalprobe.agents.trajectories`) and their validation.

The schema string (:data:`SCHEMA`) is spelled here and nowhere else: one dataclass per line
kind, :func:`record_to_json` to write a line, :func:`parse_record` to check a decoded line and
build its record.
"""

from __future__ import annotations

import json
import types
import typing
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
    """The first line of a trajectory file (fields: docs/formats.md); ``chat_format`` None
    (absent) means harmony."""

    run_id: str
    config: dict
    backend: dict
    package_version: str
    chat_format: dict | None = None
    prompt_coverage: dict | None = None


@dataclass(frozen=True)
class Attempt:
    """One rejected generation of a step (its answer named no valid action)."""

    generated_token_ids: list[int]
    token_ids_source: TokenIdsSource
    reasoning: str | None
    final: str | None
    finish_reason: str
    parse_error: str


@dataclass(frozen=True)
class StepRecord:
    """One step ``t`` of an episode: the state shown, what the agent produced, what it did.

    Fields: docs/formats.md (``step`` lines). ``grid_text`` is the grid the prompt drew (on a
    false-belief grid the shown one), ``true_grid_text`` the true grid's text where it differs;
    ``action`` is None for an invalid step; ``attempts`` is 0 for a prompt-only state
    (:mod:`goalprobe.agents.prompt_states`).
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
    def key(self) -> tuple[str, int]:
        """``(grid_id, episode)``, the identity of its episode within its run."""
        return (self.grid_id, self.episode)

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
    """The last line of an episode (fields: docs/formats.md). ``end_reason``: ``"goal"``,
    ``"horizon"``, ``"truncated"`` (left out of behaviour metrics) or ``"prompt_only"``;
    ``invalid_steps`` excludes truncated steps."""

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

_OVERRIDES: dict[str, Any] = {
    "optimal_actions": ("list", ("enum", _ACTION_NAMES)),
    "action": ("optional", ("enum", _ACTION_NAMES)),
    "parse_form": ("optional", ("enum", ("json", "relaxed_json", "key_value"))),
}
"""Fields whose annotation says less than the schema (the action names, the parse forms)."""


def _spec(hint: Any) -> Any:
    """The :func:`_check` spec of a field's type annotation (``list[int]``: token ids)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint == RowCol:
        return _ROW_COL
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        return ("optional", _spec(next(a for a in args if a is not type(None))))
    if origin is list:
        return ("list", _TOKEN_ID if args[0] is int else _spec(args[0]))
    if origin is Literal:
        return ("enum", args)
    return hint


_SPECS: dict[type, dict[str, Any]] = {
    cls: {
        name: _OVERRIDES.get(name) or _spec(hint)
        for name, hint in typing.get_type_hints(cls).items()
    }
    for cls in (RunHeader, Attempt, StepRecord, EpisodeSummary)
}
"""Per record type, the spec of each field (from its annotation), in field order."""


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
