"""The logit lens of each sampled step, chunk by chunk: what the ``decision`` stage writes for the
viewer's step view (the reasoning with each chunk coloured by the action the lens decodes there),
and how it is read back.

File ``RUN/decision/steps.jsonl`` (schema ``goalprobe.decision_steps`` version 1; its lines are
described in docs/formats.md, "The lens per step"): a header line, then one line per step read by
the lens, in the stage's sample order. The decoded action of a chunk at block ``l`` is the argmax
of ``probs[l]`` (:meth:`ChunkLens.decoded`). Torch-free; the caller passes paths.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from goalprobe.gridworld.core import Action
from goalprobe.probes.serialization import check_schema

DECISION_STEPS_SCHEMA = "goalprobe.decision_steps"
"""``schema`` of the header line."""
DECISION_STEPS_SCHEMA_VERSION = 1
"""Version of the per-step lens file."""


@dataclass(frozen=True, eq=False)
class ChunkLens:
    """One reasoning chunk of a step: the offset of its last token in the reasoning, ``(end +
    1) / reasoning length``, its text and ``probs (L, 4)`` the lens per block."""

    end: int
    fraction: float
    text: str
    probs: np.ndarray

    def decoded(self, layer: int = -1) -> Action:
        """The action the lens names at this chunk's end after block ``layer``."""
        return Action(int(np.argmax(self.probs[layer])))


@dataclass(frozen=True, eq=False)
class StepLensRecord:
    """The lens on one step along its reasoning; ``answer (L, 4)``: the lens at the position
    predicting the answer's action token."""

    grid_id: str
    episode: int
    step: int
    action: Action
    reasoning_tokens: int
    chunks: tuple[ChunkLens, ...]
    answer: np.ndarray

    @property
    def key(self) -> tuple[str, int, int]:
        """``(grid_id, episode, step)``."""
        return (self.grid_id, self.episode, self.step)


@dataclass(frozen=True)
class DecisionSteps:
    """A per-step lens file read back (``chunk``: reasoning tokens per chunk; ``layers``: blocks
    read; ``steps``: ``(grid_id, episode, step) -> record``)."""

    agent: str
    chunk: int
    layers: int
    steps: dict[tuple[str, int, int], StepLensRecord]


def chunk_texts(decode, reasoning_ids: Sequence[int], ends: Sequence[int]) -> list[str]:
    """The decoded text of each chunk ending at offsets ``ends`` (ascending) of
    ``reasoning_ids``: the growth of the ``decode``d prefix, so the texts concatenate to the
    whole (a character split between chunks goes to the chunk where it is complete)."""
    out, before = [], ""
    for i, end in enumerate(ends):
        text = decode(list(reasoning_ids[: end + 1]))
        if i < len(ends) - 1:
            # a chunk that ends inside a multi-byte character decodes it as U+FFFD: hold the
            # incomplete tail back for the next chunk
            text = text.rstrip("\ufffd")
        common = len(os.path.commonprefix([before, text]))
        out.append(text[common:])
        before = text
    return out


def step_record(
    key: tuple[str, int, int],
    action: Action,
    reasoning_tokens: int,
    ends: Sequence[int],
    fractions: Sequence[float],
    texts: Sequence[str],
    probs: np.ndarray,
) -> dict:
    """One step's line; ``probs (L, C + 1, 4)``: the lens at the chunk ends, then at the answer."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 3 or probs.shape[1] != len(ends) + 1 or probs.shape[2] != len(Action):
        raise ValueError(f"probs must be (L, {len(ends) + 1}, 4), got {probs.shape}")
    if not len(ends) == len(fractions) == len(texts):
        raise ValueError("ends, fractions and texts must have one entry per chunk")
    grid_id, episode, step = key
    return {
        "grid_id": str(grid_id),
        "episode": int(episode),
        "step": int(step),
        "action": Action(int(action)).name,
        "reasoning_tokens": int(reasoning_tokens),
        "chunks": [
            {
                "end": int(end),
                "fraction": round(float(fraction), 6),
                "text": str(text),
                "probs": np.round(probs[:, i], 4).tolist(),
            }
            for i, (end, fraction, text) in enumerate(zip(ends, fractions, texts, strict=True))
        ],
        "answer": np.round(probs[:, -1], 4).tolist(),
    }


def write_decision_steps(
    path: str | Path, records: Iterable[dict], *, agent: str, chunk: int, layers: int
) -> Path:
    """Write the header and the step lines (:func:`step_record`) to ``path`` (replaced whole:
    written beside it, then renamed, so a crash leaves no partial file under the name)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "schema": DECISION_STEPS_SCHEMA,
        "schema_version": DECISION_STEPS_SCHEMA_VERSION,
        "agent": str(agent),
        "chunk": int(chunk),
        "layers": int(layers),
        "actions": [a.name for a in Action],
    }
    part = out.with_name(out.name + ".part")
    with part.open("w", encoding="utf-8") as f:
        f.write(json.dumps(header, allow_nan=False) + "\n")
        for record in records:
            f.write(json.dumps(record, allow_nan=False) + "\n")
    part.replace(out)
    return out


def read_decision_steps(path: str | Path) -> DecisionSteps:
    """Read a file written by :func:`write_decision_steps` (ValueError on a bad schema or line)."""
    p = Path(path)
    lines = p.read_text(encoding="utf-8").splitlines()
    if not lines:
        raise ValueError(f"{p}: empty (no header line)")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as err:
        raise ValueError(f"{p}: header is not JSON ({err.msg})") from err
    header = header if isinstance(header, dict) else {}
    check_schema(header, DECISION_STEPS_SCHEMA, (DECISION_STEPS_SCHEMA_VERSION,), p)
    if header.get("actions") != [a.name for a in Action]:
        raise ValueError(
            f"{p}: action order {header.get('actions')!r} is not UP, DOWN, LEFT, RIGHT"
        )
    layers = int(header["layers"])
    steps: dict[tuple[str, int, int], StepLensRecord] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            chunks = tuple(
                ChunkLens(
                    end=int(c["end"]),
                    fraction=float(c["fraction"]),
                    text=str(c["text"]),
                    probs=_probs(c["probs"], layers),
                )
                for c in row["chunks"]
            )
            record = StepLensRecord(
                grid_id=str(row["grid_id"]),
                episode=int(row["episode"]),
                step=int(row["step"]),
                action=Action[row["action"]],
                reasoning_tokens=int(row["reasoning_tokens"]),
                chunks=chunks,
                answer=_probs(row["answer"], layers),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{p}:{number}: not a step line ({err})") from err
        steps[record.key] = record
    return DecisionSteps(str(header.get("agent", "")), int(header["chunk"]), layers, steps)


def _probs(value, layers: int) -> np.ndarray:
    probs = np.asarray(value, dtype=np.float32)
    if probs.shape != (layers, len(Action)):
        raise ValueError(f"probabilities of shape {probs.shape}, expected ({layers}, 4)")
    return probs
