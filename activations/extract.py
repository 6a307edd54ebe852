"""``goalprobe extract``: replay recorded steps through a model and store residual activations.

Every step of every finished episode is replayed teacher-forced on its recorded ids, cut after
the last position read, and the chosen blocks' outputs are stored at the chat format's anchor
tokens (optionally at every grid-cell token). Rows are computed in parts of ``rows_per_part``
steps, each a complete store in ``<output>.parts/`` beside a ``manifest.json`` of the
extraction's identity: a rerun reuses the parts there, so a kill loses at most one part."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.activations.compute import batching_record, compute_identity
from goalprobe.activations.store.merge import concatenate_stores
from goalprobe.activations.store.reader import ActivationStore
from goalprobe.activations.store.schema import (
    ANCHOR_STAGES,
    CHAT_FORMAT_ATTR,
    COMPRESSIONS,
    GRID_CELLS,
    LABEL_FIELDS,
    Shard,
    StoreFormatError,
    episode_labels,
    label_array,
    stage_tokens,
)
from goalprobe.activations.store.writer import (
    ReasoningRows,
    RowBatch,
    StoreLayout,
    StoreWriter,
    fsync_dir,
    temp_path,
    to_float16,
)
from goalprobe.agents.chat_format import ChatFormat, HarmonyFormat, chat_format_for
from goalprobe.agents.harmony import reasoning_offsets
from goalprobe.agents.oom import OutOfMemoryAtOneError, free_cached_memory, is_out_of_memory
from goalprobe.agents.trajectories import Episode, read_trajectories
from goalprobe.gridworld.core import LABEL_CANVAS

MANIFEST_SCHEMA = "goalprobe.extract_parts/1"
"""``schema`` field of a parts directory's ``manifest.json``."""

_IDENTITY_ATTRS: tuple[str, ...] = (
    "config",
    "model_id",
    "model_revision",
    "backend",
    "trajectory_sha256",
    "d_model",
    "attention",
    "compute",
)
BATCHING = ("batch_size", "max_batch_tokens")
"""Config fields left out of the identity: they depend on the device, not on what is computed."""
BATCHING_FILE = "batching.json"
"""In the parts directory: the batches an out-of-memory error halved this extraction to."""


@dataclass(frozen=True)
class ExtractConfig:
    """What to extract and how (stored as JSON in the store's ``config`` attribute)."""

    layers: tuple[int, ...] = ()
    """Decoder blocks whose output is stored (0-based); empty: the caller sets
    :func:`default_layers` once the model's depth is known."""

    stages: tuple[str, ...] = ANCHOR_STAGES
    """Anchor stages to store: ``pre_reasoning`` and/or ``post_reasoning``."""

    grid_cells: bool = False
    """Also store the token of every grid cell (stage ``grid_cells``, 225 tokens per row)."""

    batch_size: int = 8
    """Sequences per forward pass (sorted by length within a part to limit padding)."""

    max_batch_tokens: int = 0
    """Most padded tokens per forward pass (at least one sequence); 0: only ``batch_size``
    limits (:mod:`goalprobe.activations.plan` picks it)."""

    rows_per_part: int = 256
    """Steps per crash-safe part: the most work a kill can lose."""

    compression: str = "none"
    """HDF5 filter of the activation datasets: ``none``, ``lzf`` or ``gzip``."""

    shard: str = "0/1"
    """``i/N``: extract the grids whose id hashes to shard ``i`` of ``N``."""

    reasoning_every: int = 0
    """Also store ragged reasoning rows: every ``k``-th token of each step's analysis message and
    its last token (:func:`goalprobe.agents.harmony.reasoning_offsets`); 0: none."""

    def __post_init__(self) -> None:
        layers = tuple(sorted({int(x) for x in self.layers}))
        if layers and layers[0] < 0:
            raise ValueError(f"layers must be non-negative block indices, got {self.layers}")
        object.__setattr__(self, "layers", layers)
        stages = tuple(self.stages)
        unknown = [s for s in stages if s not in ANCHOR_STAGES]
        if unknown or not stages or len(set(stages)) != len(stages):
            raise ValueError(f"stages must be distinct names from {ANCHOR_STAGES}, got {stages}")
        object.__setattr__(self, "stages", tuple(s for s in ANCHOR_STAGES if s in stages))
        if self.batch_size < 1 or self.rows_per_part < 1:
            raise ValueError("batch_size and rows_per_part must be >= 1")
        if self.max_batch_tokens < 0:
            raise ValueError(f"max_batch_tokens must be >= 0, got {self.max_batch_tokens}")
        if isinstance(self.reasoning_every, bool) or int(self.reasoning_every) < 0:
            raise ValueError(
                f"reasoning_every must be an integer >= 0 (0: no reasoning rows), got "
                f"{self.reasoning_every!r}"
            )
        object.__setattr__(self, "reasoning_every", int(self.reasoning_every))
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression}")
        Shard.parse(self.shard)

    @property
    def all_stages(self) -> tuple[str, ...]:
        """Stored stages: the anchor stages, then ``grid_cells`` when asked for."""
        return (*self.stages, GRID_CELLS) if self.grid_cells else self.stages

    def to_json(self) -> dict[str, Any]:
        """The config as a JSON-ready dict (``max_batch_tokens`` and ``reasoning_every`` only
        when set, so that stores extracted before they existed keep their identity)."""
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        for optional in ("max_batch_tokens", "reasoning_every"):
            if not out[optional]:
                out.pop(optional)
        return out


@dataclass(frozen=True)
class ExtractReport:
    """What an extraction call did (``trajectory_steps``: of all shards)."""

    output: Path
    rows: int
    trajectory_steps: int
    parts_computed: int
    parts_reused: int
    seconds: float
    already_complete: bool = False


def default_layers(n_layers: int) -> tuple[int, ...]:
    """The study's spread: the last block of each third, ``ceil(k * n / 3) - 1`` for k = 1, 2, 3
    (GPT-OSS-20B: ``(7, 15, 23)``; the 4-block bundled agent: ``(1, 2, 3)``)."""
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    return tuple(sorted({max(0, math.ceil(k * n_layers / 3) - 1) for k in (1, 2, 3)}))


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


@dataclass
class ReplayRow:
    """One step to replay: its cut ids, each stage's positions and presence, its labels and its
    reasoning rows."""

    token_ids: np.ndarray
    positions: dict[str, np.ndarray]
    present: dict[str, bool]
    labels: dict[str, Any] = field(default_factory=dict)
    retokenized: bool = False
    reasoning: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    reasoning_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    reasoning_length: int = 0


class GridCellLocator:
    """Maps each grid cell of a prompt to the token holding its symbol, from per-id decoded pieces;
    refuses pieces that do not concatenate to the prompt, and two cells sharing a token."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}

    def _piece_list(self, ids: Sequence[int]) -> list[str]:
        new = sorted({int(i) for i in ids} - self._pieces.keys())
        if new:
            texts = self.tokenizer.batch_decode(
                [[i] for i in new], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            self._pieces.update(zip(new, texts, strict=True))
        return [self._pieces[int(i)] for i in ids]

    def positions(self, prompt_ids: Sequence[int], grid_text: str, where: str) -> np.ndarray:
        """``(15 * 15,)`` int32 token position of every canvas cell (row-major), 0 outside;
        ``where`` prefixes error messages."""
        pieces = self._piece_list(prompt_ids)
        text = "".join(pieces)
        full = self.tokenizer.decode(
            list(prompt_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if text != full:
            raise ValueError(
                f"{where}: decoding tokens one by one does not reproduce the prompt, so grid "
                "cells cannot be mapped to tokens with this tokenizer"
            )
        start = text.rfind(grid_text)
        if start < 0:
            raise ValueError(f"{where}: the step's grid_text does not occur in its prompt")
        ends = np.cumsum([len(p) for p in pieces])
        out = np.zeros(LABEL_CANVAS * LABEL_CANVAS, dtype=np.int32)
        offset = start
        lines = grid_text.split("\n")
        seen: dict[int, tuple[int, int]] = {}
        for row, line in enumerate(lines[1:]):
            offset += len(lines[row]) + 1
            columns = [
                i for i, ch in enumerate(line) if ch != " " and (i == 0 or line[i - 1] == " ")
            ]
            for col, char_index in enumerate(columns[1:]):
                token = int(np.searchsorted(ends, offset + char_index, side="right"))
                if token in seen:
                    raise ValueError(
                        f"{where}: cells {seen[token]} and {(row, col)} share token {token}; "
                        "grid-cell activations need one token per cell"
                    )
                seen[token] = (row, col)
                out[row * LABEL_CANVAS + col] = token
        return out


def episode_rows(
    episode: Episode,
    first_step_index: int,
    chat_format: ChatFormat,
    config: ExtractConfig,
    where: str,
    locator: GridCellLocator | None = None,
    vocab_size: int | None = None,
) -> list[ReplayRow]:
    """The replay rows of every step of a finished ``episode`` (ValueError naming the step for a
    token id at or above ``vocab_size``)."""
    labels = episode_labels(episode, first_step_index)
    rows = []
    for t, step in enumerate(episode.steps):
        step_where = f"{where}: step {step.step} of episode {step.episode} on grid {step.grid_id!r}"
        ids = np.asarray([*step.prompt_token_ids, *step.generated_token_ids], dtype=np.int64)
        if vocab_size is not None and ids.size and int(ids.max()) >= vocab_size:
            raise ValueError(
                f"{step_where}: token id {int(ids.max())} is outside the model's vocabulary of "
                f"{vocab_size} ids (the file was written with another tokenizer)"
            )
        try:
            pre_anchor = chat_format.find_anchors(step.prompt_token_ids).pre_reasoning
        except ValueError as err:
            raise ValueError(f"{step_where}: {err}") from err
        post_anchor = None
        generated = step.generated_token_ids
        if generated and chat_format.opens_reasoning(generated):
            anchors = chat_format.find_anchors(ids.tolist())
            if anchors.pre_reasoning != pre_anchor:
                raise ValueError(f"{step_where}: the prompt's anchor moved in the full sequence")
            post_anchor = anchors.post_reasoning
        positions: dict[str, np.ndarray] = {}
        present: dict[str, bool] = {}
        pre = np.asarray(pre_anchor, dtype=np.int64)
        for stage in config.stages:
            found = pre_anchor if stage == "pre_reasoning" else post_anchor
            present[stage] = found is not None
            positions[stage] = pre if found is None else np.asarray(found, dtype=np.int64)
        if config.grid_cells:
            if locator is None:
                raise ValueError("grid_cells needs a GridCellLocator")
            positions[GRID_CELLS] = locator.positions(
                step.prompt_token_ids, step.grid_text, step_where
            ).astype(np.int64)
            present[GRID_CELLS] = True
        offsets: tuple[int, ...] = ()
        length = first_token = 0
        if config.reasoning_every and post_anchor is not None:
            span = chat_format.reasoning_span(ids.tolist())
            if span is not None:
                length, first_token = span.length, span.start
                offsets = reasoning_offsets(length, config.reasoning_every)
        reasoning = np.asarray(offsets, dtype=np.int64) + first_token
        last = (
            max(int(positions[s].max()) for s in positions if present[s])
            if any(present.values())
            else int(pre.max())
        )
        if offsets:
            last = max(last, int(reasoning[-1]))
        cut = ids[: last + 1]
        row_labels = {name: labels[name][t] for name in labels}
        row_labels["seq_len"] = np.int32(len(cut))
        rows.append(
            ReplayRow(
                token_ids=cut,
                positions=positions,
                present=present,
                labels=row_labels,
                retokenized=step.token_ids_source == "retokenized",
                reasoning=reasoning,
                reasoning_tokens=np.asarray(offsets, dtype=np.int64),
                reasoning_length=length if offsets else 0,
            )
        )
    return rows


def compute_rows(
    rows: Sequence[ReplayRow],
    capture,
    config: ExtractConfig,
    pad_id: int,
) -> RowBatch:
    """Replay ``rows`` through ``capture`` in batches of decreasing length into a
    :class:`RowBatch` (activations float16)."""
    from goalprobe.activations.capture.base import TokenBatch

    stages = config.all_stages
    n, d = len(rows), capture.d_model
    sizes = [stage_tokens(s) for s in stages]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    acts = {
        s: {x: np.zeros((n, k, d), dtype=np.float16) for x in config.layers}
        for s, k in zip(stages, sizes, strict=True)
    }
    counts = np.asarray([len(r.reasoning) for r in rows], dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(counts)])
    reasoning = {x: np.zeros((int(first[-1]), d), dtype=np.float16) for x in config.layers}
    order = sorted(range(n), key=lambda i: (-len(rows[i].token_ids), i))
    lengths = [len(rows[i].token_ids) for i in order]
    starts = batch_bounds(lengths, config.batch_size, config.max_batch_tokens)
    for start, stop in zip(starts, [*starts[1:], n], strict=True):
        chunk = order[start:stop]
        width = int(max(counts[i] for i in chunk))
        read = []
        for i in chunk:  # anchors, then the reasoning rows padded by repeating a position
            extra = rows[i].reasoning.tolist()
            pad = [int(rows[i].positions[stages[0]][0])] * (width - len(extra))
            read.append([*np.concatenate([rows[i].positions[s] for s in stages]), *extra, *pad])
        batch = TokenBatch.from_sequences(
            [rows[i].token_ids.tolist() for i in chunk], read, pad_id=pad_id
        )
        captured = capture.capture(batch, config.layers)
        for layer in config.layers:
            values = captured[layer].float().numpy()
            for j, stage in enumerate(stages):
                part = values[:, offsets[j] : offsets[j + 1]]
                acts[stage][layer][chunk] = to_float16(part, f"block {layer}, {stage}")
            for b, i in enumerate(chunk):
                got = values[b, offsets[-1] : offsets[-1] + counts[i]]
                reasoning[layer][first[i] : first[i + 1]] = to_float16(
                    got, f"block {layer}, reasoning"
                )
    return RowBatch(
        acts=acts,
        positions={s: np.stack([r.positions[s] for r in rows]).astype(np.int32) for s in stages},
        present={s: np.asarray([r.present[s] for r in rows], dtype=bool) for s in stages},
        labels={name: label_array(name, [r.labels[name] for r in rows]) for name in LABEL_FIELDS},
        reasoning=ReasoningRows(
            counts=counts,
            length=np.asarray([r.reasoning_length for r in rows], dtype=np.int32),
            positions=_cat([r.reasoning for r in rows]).astype(np.int32),
            tokens=_cat([r.reasoning_tokens for r in rows]).astype(np.int32),
            fraction=_cat(
                [(r.reasoning_tokens + 1) / max(r.reasoning_length, 1) for r in rows]
            ).astype(np.float32),
            acts=reasoning,
        ),
    )


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0)


def batch_bounds(lengths: Sequence[int], batch_size: int, max_batch_tokens: int = 0) -> list[int]:
    """Where batches start in ``lengths`` (decreasing): at most ``batch_size`` sequences and, when
    set, ``max_batch_tokens`` padded tokens (first length times size; at least one sequence)."""
    starts, start = [], 0
    while start < len(lengths):
        starts.append(start)
        size = batch_size
        if max_batch_tokens:
            size = max(1, min(size, max_batch_tokens // max(1, int(lengths[start]))))
        start += size
    return starts


def halving_batches(compute: Callable[[Any], Any], config: Any, longest: int, record: Path):
    """``compute(config)`` for a config with ``batch_size`` and ``max_batch_tokens`` (an
    extraction's), both halved on each out-of-memory error and written to ``record`` (JSON, at
    once: a rerun starts from them); ``longest``: the longest sequence ``compute`` runs.
    Returns ``(result, the config it ran with)``."""
    while True:
        try:
            return compute(config), config
        except RuntimeError as err:
            if not is_out_of_memory(err):
                raise
            free_cached_memory()
            ran = config.batch_size
            if config.max_batch_tokens:
                ran = min(ran, max(1, config.max_batch_tokens // max(1, longest)))
            if ran <= 1:
                raise OutOfMemoryAtOneError(
                    f"one sequence of {longest:,} tokens ran out of memory: {err}"
                ) from err
            halved = {"batch_size": ran // 2, "max_batch_tokens": config.max_batch_tokens // 2}
            tmp = record.with_name(f".{record.name}.tmp")
            tmp.write_text(json.dumps(halved), encoding="utf-8")
            os.replace(tmp, record)
            config = replace(config, **halved)


def _identity_diff(a: dict, b: dict) -> list[str]:
    return [k for k in _IDENTITY_ATTRS if _identity_value(a, k) != _identity_value(b, k)]


def _identity_value(attrs: dict, key: str) -> Any:
    """``attrs[key]`` as the identity compares it: the config without :data:`BATCHING`."""
    value = attrs.get(key)
    if key == "config" and value is not None:
        value = json.loads(value) if isinstance(value, str) else dict(value)
        value = {k: v for k, v in value.items() if k not in BATCHING}
    return value


def extract(
    trajectories: str | os.PathLike,
    output: str | os.PathLike,
    capture,
    tokenizer,
    config: ExtractConfig,
    *,
    model_id: str,
    model_revision: str = "",
    work_dir: str | os.PathLike | None = None,
    keep_parts: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    on_part: Callable[[int, bool], None] | None = None,
) -> ExtractReport:
    """Extract the activations of every step of ``trajectories`` (one shard) into ``output``
    through ``capture``; ``work_dir`` holds the parts (default ``<output>.parts``, deleted
    unless ``keep_parts``); ``on_part(part_index, computed)`` runs after each part.
    ``ValueError``: bad config, a step without an anchor, or another extraction's files."""
    started = time.perf_counter()
    trajectories, output = Path(trajectories), Path(output)
    if not trajectories.is_file():
        raise FileNotFoundError(f"{trajectories}: no such trajectory file")
    if not config.layers:
        raise ValueError("ExtractConfig.layers is empty: name the blocks (default_layers)")
    if tuple(capture.check_layers(config.layers)) != config.layers:
        raise ValueError(f"layers {config.layers} are not valid for this model")
    identity, attrs = _identity_and_attrs(
        trajectories, capture, tokenizer, config, model_id, model_revision
    )
    parts_dir = Path(work_dir) if work_dir is not None else output.with_name(f"{output.name}.parts")
    if output.exists():
        found = _read_identity(output)
        if found is not None and not _identity_diff(found, identity):
            if parts_dir.exists():
                shutil.rmtree(parts_dir)
            with ActivationStore(output) as store:
                steps = int(store.attrs["trajectory_steps"])
                seconds = time.perf_counter() - started
                return ExtractReport(output, len(store), steps, 0, 0, seconds, True)
        if not overwrite:
            raise ValueError(
                f"{output} already holds another extraction or is not a complete store; pass "
                "overwrite=True (--overwrite) to replace it"
            )
    config = _open_parts(parts_dir, identity, config)
    parts = _Parts(parts_dir, capture, tokenizer, config, identity, attrs, on_part)
    parts.write(trajectories, progress)
    final_attrs = {**attrs, "trajectory_steps": parts.steps}
    final_attrs["retokenized_steps"] = parts.retokenized
    final_attrs["part_batching"] = parts.batching
    if parts.paths:
        concatenate_stores(parts.paths, output, final_attrs, compression=config.compression)
    else:
        with StoreWriter(output, parts.layout, final_attrs, compression=config.compression):
            pass
    if not keep_parts:
        shutil.rmtree(parts_dir)
    with ActivationStore(output) as store:
        rows_written = len(store)
    seconds = time.perf_counter() - started
    return ExtractReport(output, rows_written, parts.steps, parts.computed, parts.reused, seconds)


def _identity_and_attrs(
    trajectories: Path, capture, tokenizer, config: ExtractConfig, model_id: str, revision: str
) -> tuple[dict, dict]:
    """The identity a resumed part or finished store must match, and every part's attributes."""
    shard = Shard.parse(config.shard)
    chat_format = chat_format_for(tokenizer)
    identity = {
        "config": config.to_json(),
        "model_id": model_id,
        "model_revision": revision,
        "backend": capture.name,
        "trajectory_sha256": sha256_file(trajectories),
        "d_model": capture.d_model,
        "attention": capture.attention,
        "compute": compute_identity(capture.model) if hasattr(capture, "model") else {},
    }
    attrs = {**identity}
    if isinstance(chat_format, HarmonyFormat):
        attrs["anchor_token_ids"] = asdict(chat_format.special)
    attrs |= {
        CHAT_FORMAT_ATTR: chat_format.describe(),
        "trajectory_file": trajectories.name,
        "shard_index": shard.index,
        "shard_count": shard.count,
        "n_model_layers": capture.n_layers,
    }
    return identity, attrs


def _open_parts(parts_dir: Path, identity: dict, config: ExtractConfig) -> ExtractConfig:
    """Create or check the manifest, clear leftovers, and return ``config`` with the batches an
    earlier out-of-memory error halved to."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = parts_dir / "manifest.json"
    if manifest_path.exists():
        previous = json.loads(manifest_path.read_text(encoding="utf-8"))
        diff = _identity_diff(previous, identity)
        if previous.get("schema") != MANIFEST_SCHEMA or diff:
            raise ValueError(
                f"{parts_dir} holds parts of another extraction (differs in: "
                f"{', '.join(diff) or 'schema'}); delete it, or extract into another output"
            )
    else:
        tmp = temp_path(manifest_path)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"schema": MANIFEST_SCHEMA, **identity}, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, manifest_path)
        fsync_dir(parts_dir)
    for leftover in parts_dir.glob(".*.tmp"):
        leftover.unlink()
    batching_path = parts_dir / BATCHING_FILE
    if not batching_path.exists():
        return config
    halved = json.loads(batching_path.read_text(encoding="utf-8"))
    budgets = [b for b in (config.max_batch_tokens, halved["max_batch_tokens"]) if b]
    return replace(
        config,
        batch_size=min(config.batch_size, halved["batch_size"]),
        max_batch_tokens=min(budgets, default=0),
    )


class _Parts:
    """The parts of one extraction, written (or reused) ``rows_per_part`` rows at a time."""

    def __init__(self, parts_dir, capture, tokenizer, config, identity, attrs, on_part) -> None:
        self.parts_dir, self.capture, self.config = parts_dir, capture, config
        self.identity, self.attrs, self.on_part = identity, attrs, on_part
        self.chat_format = chat_format_for(tokenizer)
        self.locator = GridCellLocator(tokenizer) if config.grid_cells else None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.layout = StoreLayout(
            config.all_stages, config.layers, capture.d_model, config.reasoning_every
        )
        self.paths: list[Path] = []
        self.batching: list[dict] = []  # each part's ``batching`` attribute
        self.steps = 0
        self.computed = self.reused = self.retokenized = 0
        self.buffer: list[ReplayRow] = []
        self.bar = None

    def write(self, trajectories: Path, progress: bool) -> None:
        """Replay rows of every step of this shard, flushing a part every ``rows_per_part``."""
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc=f"extract {self.config.shard}", unit="step")
        shard = Shard.parse(self.config.shard)
        vocab_size = getattr(self.capture, "vocab_size", None)
        try:
            for episode in read_trajectories(trajectories):
                first = self.steps  # every step counts, in the shard or not
                self.steps += len(episode.steps)
                if not shard.holds(episode.summary.grid_id):
                    continue
                where = str(trajectories)
                rows = episode_rows(
                    episode, first, self.chat_format, self.config, where, self.locator, vocab_size
                )
                self.retokenized += sum(r.retokenized for r in rows)
                for row in rows:
                    self.buffer.append(row)
                    if len(self.buffer) == self.config.rows_per_part:
                        self.flush()
            if self.buffer:
                self.flush()
        finally:
            if self.bar is not None:
                self.bar.close()

    def flush(self) -> None:
        """Write the buffered rows as the next part (or check the one there), halving on OOM."""
        buffer, index = self.buffer, len(self.paths)
        path = self.parts_dir / f"part_{index:06d}.h5"
        expected = np.asarray([int(r.labels["step_index"]) for r in buffer], dtype=np.int64)
        done = not path.exists()
        if not done:
            self.batching.append(_check_part(path, expected, self.identity))
            self.reused += 1
        else:
            rows, self.config = halving_batches(
                lambda c: compute_rows(buffer, self.capture, c, self.pad_id),
                self.config,
                max(len(r.token_ids) for r in buffer),
                self.parts_dir / BATCHING_FILE,
            )
            batching = batching_record(self.config, self.capture)
            self.batching.append(batching)
            part_attrs = {**self.attrs, "part_index": index, "batching": batching}
            compression = self.config.compression
            with StoreWriter(path, self.layout, part_attrs, compression=compression) as writer:
                writer.append(rows)
            self.computed += 1
        self.paths.append(path)
        if self.bar is not None:
            self.bar.update(len(buffer))
        if self.on_part is not None:
            self.on_part(index, done)
        buffer.clear()


def holds_other_extraction(
    output: str | os.PathLike,
    trajectories: str | os.PathLike,
    config: ExtractConfig,
    *,
    compare_layers: bool = True,
) -> bool:
    """Whether an existing ``output`` can *not* be this extraction's store, judged without the
    model (layers compared only when ``compare_layers``)."""
    found = _read_identity(Path(output))
    if found is None or found.get("trajectory_sha256") != sha256_file(trajectories):
        return True
    ours = _identity_value({"config": config.to_json()}, "config")
    theirs = _identity_value(found, "config") or {}
    if not compare_layers:
        ours.pop("layers")
        theirs.pop("layers", None)
    return ours != theirs


def _read_identity(path: Path) -> dict | None:
    """The identity attributes of a complete store, or None when it is not one."""
    try:
        with ActivationStore(path) as store:
            return {k: store.attrs.get(k) for k in _IDENTITY_ATTRS}
    except (StoreFormatError, OSError):
        return None


def _check_part(path: Path, expected_steps: np.ndarray, identity: dict) -> dict:
    """Check a reused part; returns its ``batching`` attribute ({} for a part without one)."""
    with ActivationStore(path) as part:
        diff = _identity_diff(part.attrs, identity)
        if diff:
            raise ValueError(f"{path}: part of another extraction (differs in {', '.join(diff)})")
        steps = part.labels(["step_index"])["step_index"].astype(np.int64)
        batching = dict(part.attrs.get("batching") or {})
    if not np.array_equal(steps, expected_steps):
        raise ValueError(
            f"{path}: holds steps {steps[:3].tolist()}... but this extraction expects "
            f"{expected_steps[:3].tolist()}... at this part; delete {path.parent} to start over"
        )
    return batching
