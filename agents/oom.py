"""Batches that halve on an out-of-memory error (every GPU stage: generation, extraction, patching).

A memory plan (:mod:`goalprobe.activations.plan`) is a model, not a measurement: an allocator's
fragmentation, another process on the card or a kernel the model did not foresee can still run
a planned batch out of memory. :class:`HalvingBatch` runs items in batches and, on
``torch.OutOfMemoryError``, frees the cache, halves the batch and runs the same items again
(nothing of the failed batch was kept), so a stage finishes at the batch the device allows and
records it (:meth:`HalvingBatch.to_dict`). A batch of one that runs out of memory raises
:class:`OutOfMemoryAtOneError` with the figures.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is PyTorch's out-of-memory error (CUDA's or another accelerator's)."""
    import torch

    return isinstance(err, torch.OutOfMemoryError)


def free_cached_memory() -> None:
    """Collect garbage and return the CUDA allocator's cached blocks (after an OOM)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class OutOfMemoryAtOneError(RuntimeError):
    """A batch of one item ran out of memory: halving cannot help."""


@dataclass
class HalvingBatch:
    """The batch of one kind of forward pass (``name``), halved on an out-of-memory error.

    Attributes:
        name: what runs in these batches (e.g. ``"teacher_forced"``), for messages.
        planned: the batch the plan (or the config) asked for.
        size: the batch in force now (``planned`` until an OOM halves it).
        largest: the largest batch that ran to the end.
        halvings: ``{"from", "to"}`` per OOM, in order.
        on_halve: called with this object after each halving (e.g. to record the batch on disk,
            so that a rerun starts from it).
    """

    name: str
    planned: int
    size: int = 0
    largest: int = 0
    halvings: list[dict] = field(default_factory=list)
    on_halve: Callable[[HalvingBatch], None] | None = None

    def __post_init__(self) -> None:
        if self.planned < 1:
            raise ValueError(f"{self.name}: the planned batch must be >= 1, got {self.planned}")
        self.size = min(self.size or self.planned, self.planned)

    def run(
        self,
        items: Sequence[Any],
        call: Callable[[Sequence[Any]], list],
        *,
        cap: int | None = None,
    ) -> list:
        """``call`` on consecutive batches of ``items`` (at most :attr:`size`, and ``cap`` when
        given: e.g. what the memory model allows at these items' length); the results
        concatenated in order. ``call`` must keep nothing of a batch that raises."""
        out: list = []
        start = 0
        while start < len(items):
            size = max(1, min(self.size, cap or self.size))
            chunk = items[start : start + size]
            try:
                got = call(chunk)
            except RuntimeError as err:
                if not is_out_of_memory(err):
                    raise
                self._halve(len(chunk), err)
                continue
            out.extend(got)
            self.largest = max(self.largest, len(chunk))
            start += len(chunk)
        return out

    def _halve(self, ran: int, err: BaseException) -> None:
        free_cached_memory()
        if ran <= 1:
            raise OutOfMemoryAtOneError(
                f"{self.name}: one item at a time ran out of memory (planned batch "
                f"{self.planned}, halved {len(self.halvings)} times): {err}"
            ) from err
        new = max(1, ran // 2)
        self.halvings.append({"from": ran, "to": new})
        self.size = new
        if self.on_halve is not None:
            self.on_halve(self)

    def to_dict(self) -> dict:
        """JSON-ready: the planned batch, the one in force at the end, the largest that ran,
        and the halvings."""
        return {
            "planned": self.planned,
            "batch": self.size,
            "largest_run": self.largest,
            "halvings": list(self.halvings),
        }
