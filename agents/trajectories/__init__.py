"""Trajectory JSONL: the versioned record of every rollout step, written by ``goalprobe rollout``
(schema ``goalprobe.trajectory/2``; lines, fields, resuming and truncation: docs/formats.md).

The schema string (:data:`SCHEMA`) is spelled here and nowhere else: one dataclass per line
kind, :func:`record_to_json` to write a line, :func:`parse_record` to check a decoded line and
build its record.

Writing: an episode is written as one block (its steps then its summary) with a single append,
flush and fsync once it ends. :func:`open_for_resume` cuts an incomplete tail off an existing
file (saying so) and reports the finished episodes so that the rollout skips them.

Reading whole files: a truncated final line (a killed writer) is reported with a
:class:`TruncatedLineWarning` and skipped; steps of an episode without its summary line are
ignored with a warning. Every line is validated by :func:`parse_record`.

Random access: :func:`index_trajectories` scans a file once: the run line and every summary line
are parsed and validated; step lines are only located (a prefix match on the schema and kind,
falling back to decoding the line). :func:`read_indexed_episode` then reads one episode's step
lines by their byte range and validates each. Only finished episodes (with a summary line) are
indexed; a truncated final line (an interrupted writer) is ignored.
"""

from __future__ import annotations

import json
import os
import re
import types
import typing
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
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


# --------------------------------------------------------------------------------------------
# Reading whole files
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    number: int  # 1-based
    end_offset: int  # byte offset just after the line
    record: Record


def _warn_truncated(message: str) -> None:
    warnings.warn(message, TruncatedLineWarning, stacklevel=4)


def _scan(path: Path, on_truncated: Callable[[str], None] = _warn_truncated) -> Iterator[_Line]:
    """Validated records of ``path``; a truncated final line is reported and skipped."""
    offset = 0
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            offset += len(raw)
            where = f"{path}:{number}"
            complete = raw.endswith(b"\n")
            if not raw.strip():
                if complete:
                    raise TrajectoryFormatError(f"{where}: empty line")
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                if not complete:
                    on_truncated(
                        f"{where}: final line is truncated ({len(raw)} bytes without a newline; "
                        "the writing run was probably interrupted); ignoring it"
                    )
                    return
                raise TrajectoryFormatError(f"{where}: not valid JSON ({err})") from err
            yield _Line(number, offset, parse_record(obj, where))


class _EpisodeAssembler:
    """Groups step lines into episodes and checks that every episode is well formed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: RunHeader | None = None
        self.pending: list[StepRecord] = []
        self.pending_first_line = 0
        self.seen: set[tuple[str, int]] = set()

    def feed(self, line: _Line) -> Episode | None:
        record, where = line.record, f"{self.path}:{line.number}"
        if isinstance(record, RunHeader):
            if line.number != 1:
                raise TrajectoryFormatError(f"{where}: a 'run' line may only be the first line")
            self.header = record
            return None
        if self.header is None:
            raise TrajectoryFormatError(f"{where}: the file does not start with a 'run' line")
        if record.run_id != self.header.run_id:
            raise TrajectoryFormatError(
                f"{where}: run_id {record.run_id!r} differs from the header's "
                f"{self.header.run_id!r}"
            )
        if isinstance(record, StepRecord):
            if self.pending and record.key != self.pending[0].key:
                raise TrajectoryFormatError(
                    f"{where}: step of episode {record.key} starts before episode "
                    f"{self.pending[0].key} (line {self.pending_first_line}) has its summary line"
                )
            if record.step != len(self.pending):
                raise TrajectoryFormatError(
                    f"{where}: field 'step' is {record.step}, expected {len(self.pending)}"
                )
            if not self.pending:
                self.pending_first_line = line.number
            self.pending.append(record)
            return None
        key = record.key
        if key in self.seen:
            raise TrajectoryFormatError(f"{where}: episode {key} appears twice")
        steps = tuple(self.pending)
        if any(s.key != key for s in steps):
            raise TrajectoryFormatError(
                f"{where}: summary of {key} follows another episode's steps"
            )
        if len(steps) != record.length:
            raise TrajectoryFormatError(
                f"{where}: field 'length' is {record.length} but {len(steps)} step lines precede it"
            )
        if sum(not s.valid and not s.truncated for s in steps) != record.invalid_steps:
            raise TrajectoryFormatError(
                f"{where}: field 'invalid_steps' disagrees with the step lines"
            )
        self.seen.add(key)
        self.pending = []
        return Episode(steps, record)


def read_run_header(path: str | os.PathLike) -> RunHeader:
    """The ``run`` line of a trajectory file."""
    path = Path(path)
    first = next(_scan(path), None)
    if first is not None and isinstance(first.record, RunHeader):
        return first.record
    raise TrajectoryFormatError(f"{path}:1: the file does not start with a 'run' line")


def read_trajectories(path: str | os.PathLike) -> Iterator[Episode]:
    """The finished episodes of a trajectory file, in file order, validated.

    Steps of an episode without a summary line (an interrupted run) are reported with a warning
    and ignored; so is a truncated final line.
    """
    path = Path(path)
    assembler = _EpisodeAssembler(path)
    for line in _scan(path):
        episode = assembler.feed(line)
        if episode is not None:
            yield episode
    if assembler.pending:
        warnings.warn(
            f"{path}:{assembler.pending_first_line}: episode {assembler.pending[0].key} "
            f"has {len(assembler.pending)} step line(s) but no summary line (interrupted run); "
            "ignoring it",
            TruncatedLineWarning,
            stacklevel=2,
        )


def read_steps(path: str | os.PathLike) -> Iterator[StepRecord]:
    """The step records of every finished episode (see :func:`read_trajectories`)."""
    for episode in read_trajectories(path):
        yield from episode.steps


@dataclass(frozen=True)
class TrajectoryStats:
    """What a whole pass over a trajectory file found (finished episodes only): the largest
    token id of their prompts and generations (-1 when none) and where it is
    (``file:line: step t of episode e on grid g``)."""

    path: Path
    run_id: str
    episodes: int
    steps: int
    max_token_id: int
    max_token_at: str

    def check_nonempty(self) -> None:
        """Raise :class:`TrajectoryFormatError` when the file holds no finished episode."""
        if not self.episodes:
            raise TrajectoryFormatError(
                f"{self.path}: holds no finished episode (empty, header only, or every episode "
                "interrupted); nothing to read"
            )

    def check_vocabulary(self, vocab_size: int) -> None:
        """Raise :class:`TrajectoryFormatError` (naming file, line and step) when a token id
        is outside a vocabulary of ``vocab_size`` ids (the file was written for another
        model)."""
        if self.max_token_id >= vocab_size:
            raise TrajectoryFormatError(
                f"{self.max_token_at}: token id {self.max_token_id} is outside the model's "
                f"vocabulary of {vocab_size} ids (the file was written with another tokenizer)"
            )


def trajectory_stats(path: str | os.PathLike) -> TrajectoryStats:
    """Validate a whole trajectory file and count its finished episodes and steps
    (``TrajectoryFormatError`` also for a file without a 'run' line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trajectory file")
    if path.stat().st_size == 0:
        raise TrajectoryFormatError(f"{path}: the file is empty (no 'run' line, no episodes)")
    assembler = _EpisodeAssembler(path)
    episodes = steps = 0
    best, best_at = -1, ""
    for line in _scan(path, on_truncated=lambda message: None):
        episode = assembler.feed(line)
        if episode is None:
            continue
        episodes += 1
        steps += len(episode.steps)
        first_line = line.number - len(episode.steps)
        for i, step in enumerate(episode.steps):
            ids = [*step.prompt_token_ids, *step.generated_token_ids]
            ids += [i for attempt in step.rejected_attempts for i in attempt.generated_token_ids]
            if max(ids, default=-1) > best:
                best = max(ids)
                best_at = (
                    f"{path}:{first_line + i}: step {step.step} of episode {step.episode} on "
                    f"grid {step.grid_id!r}"
                )
    if assembler.header is None:
        raise TrajectoryFormatError(f"{path}:1: the file does not start with a 'run' line")
    return TrajectoryStats(path, assembler.header.run_id, episodes, steps, best, best_at)


# --------------------------------------------------------------------------------------------
# Writing and resuming
# --------------------------------------------------------------------------------------------


def open_for_resume(path: str | os.PathLike, header: RunHeader) -> set[tuple[str, int]]:
    """Prepare ``path`` for appending the episodes of the run described by ``header``.

    A missing or empty file gets the header line. An existing file must hold the same
    ``run_id``; a tail after its last complete episode (steps of an interrupted episode, a
    truncated line) is cut off with a warning saying how many bytes were dropped. Returns the
    ``(grid_id, episode)`` keys of the episodes already finished in the file;
    ``TrajectoryFormatError`` when it belongs to another run or is corrupt before its tail.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        _append(path, record_to_json(header))
        return set()
    assembler = _EpisodeAssembler(path)
    good_end = 0
    finished: set[tuple[str, int]] = set()
    notes: list[str] = []
    for line in _scan(path, on_truncated=notes.append):
        if isinstance(line.record, RunHeader) and line.record.run_id != header.run_id:
            raise TrajectoryFormatError(
                f"{path}:{line.number}: the file holds run {line.record.run_id!r}, not "
                f"{header.run_id!r} (its rollout config differs); choose another output "
                "path or delete the file"
            )
        episode = assembler.feed(line)
        if isinstance(line.record, RunHeader) or episode is not None:
            good_end = line.end_offset
        if episode is not None:
            finished.add(episode.key)
    if assembler.pending:
        notes.append(
            f"episode {assembler.pending[0].key} has {len(assembler.pending)} step line(s) "
            f"from line {assembler.pending_first_line} but no summary"
        )
    size = path.stat().st_size
    if good_end < size:
        reasons = "; ".join(notes)
        warnings.warn(
            f"{path}: dropping {size - good_end} bytes after the last finished episode "
            f"(episodes in flight when the previous run stopped){': ' + reasons if reasons else ''}",
            TruncatedLineWarning,
            stacklevel=2,
        )
        with path.open("r+b") as fh:
            fh.truncate(good_end)
            fh.flush()
            os.fsync(fh.fileno())
    return finished


def append_episode(
    path: str | os.PathLike, steps: list[StepRecord], summary: EpisodeSummary
) -> None:
    """Append one finished episode (its steps, then its summary) as one durable write."""
    block = "".join(record_to_json(s) for s in steps) + record_to_json(summary)
    _append(Path(path), block)


def _append(path: Path, text: str) -> None:
    with path.open("ab") as fh:
        fh.write(text.encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


# --------------------------------------------------------------------------------------------
# Random access by byte offset
# --------------------------------------------------------------------------------------------


_KIND_RE = re.compile(
    rb'^\{"schema":"' + re.escape(SCHEMA.encode()) + rb'","kind":"(run|step|episode)"'
)
"""The start of a line as :func:`record_to_json` writes it: tells a step line from the others
without decoding it."""


@dataclass(frozen=True)
class EpisodeSpan:
    """Where one finished episode lies in its trajectory file: its validated summary, the
    1-based line of its first step line, and the byte range of its step and summary lines."""

    summary: EpisodeSummary
    first_line: int
    start: int
    end: int


@dataclass(frozen=True)
class TrajectoryIndex:
    """The run line and the finished episodes (one span each) of a trajectory file, in file
    order."""

    path: Path
    header: RunHeader
    episodes: tuple[EpisodeSpan, ...]


def index_trajectories(path: str | os.PathLike) -> TrajectoryIndex:
    """Byte ranges of every finished episode of a trajectory file; summaries are validated.

    Raises:
        TrajectoryFormatError: a run or summary line breaks the schema, a line is not JSON,
            the first line is not the run line, or an episode repeats (file and line named).
    """
    path = Path(path)
    header: RunHeader | None = None
    spans: list[EpisodeSpan] = []
    seen: set[tuple[str, int]] = set()
    block_start, block_line, offset = 0, 1, 0
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            offset += len(raw)
            if not raw.endswith(b"\n"):
                break  # a truncated final line: an interrupted writer; ignored
            match = _KIND_RE.match(raw)
            kind = match.group(1).decode() if match else None
            if kind is None:
                try:
                    kind = json.loads(raw).get("kind")
                except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
                    raise TrajectoryFormatError(f"{path}:{number}: not valid JSON") from err
            if kind == "step":
                continue
            record = parse_record(json.loads(raw), f"{path}:{number}")
            if isinstance(record, RunHeader):
                if number != 1:
                    raise TrajectoryFormatError(f"{path}:{number}: a 'run' line must be first")
                header = record
            elif isinstance(record, EpisodeSummary):
                if record.key in seen:
                    raise TrajectoryFormatError(
                        f"{path}:{number}: episode {record.grid_id}:{record.episode} repeats"
                    )
                seen.add(record.key)
                spans.append(EpisodeSpan(record, block_line, block_start, offset))
            block_start, block_line = offset, number + 1
    if header is None:
        raise TrajectoryFormatError(f"{path}:1: the file does not start with a 'run' line")
    return TrajectoryIndex(path, header, tuple(spans))


def read_indexed_episode(path: str | os.PathLike, span: EpisodeSpan) -> Episode:
    """One episode of an indexed file: its step lines read by byte range and validated.

    Raises:
        TrajectoryFormatError: a step line breaks the schema or does not continue the episode,
            or the number of step lines disagrees with the summary (file and line named).
    """
    path = Path(path)
    summary = span.summary
    name = f"{summary.grid_id}:{summary.episode}"
    with path.open("rb") as fh:
        fh.seek(span.start)
        block = fh.read(span.end - span.start)
    steps = []
    for i, raw in enumerate(block.splitlines()[:-1]):
        where = f"{path}:{span.first_line + i}"
        try:
            record = parse_record(json.loads(raw), where)
        except json.JSONDecodeError as err:
            raise TrajectoryFormatError(f"{where}: not valid JSON ({err})") from err
        if not isinstance(record, StepRecord):
            raise TrajectoryFormatError(f"{where}: expected a step line of episode {name}")
        if (record.grid_id, record.episode, record.step) != (summary.grid_id, summary.episode, i):
            raise TrajectoryFormatError(
                f"{where}: step line ({record.grid_id}, {record.episode}, step {record.step}) "
                f"does not continue episode {name} at step {i}"
            )
        steps.append(record)
    if len(steps) != summary.length:
        raise TrajectoryFormatError(
            f"{path}:{span.first_line}: episode {name} has {len(steps)} step lines, its summary "
            f"says {summary.length}"
        )
    return Episode(tuple(steps), summary)
