"""Deterministic sharding of trajectory steps by grid (``--shard i/N``): a grid's shard is a hash
of its id, so shards of one file never overlap whatever its order."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count`` (``0 <= index < count``)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard must satisfy 0 <= i < N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse ``"i/N"`` (e.g. ``"3/8"``)."""
        parts = str(text).split("/")
        try:
            index, count = (int(p) for p in parts)
        except ValueError as err:
            raise ValueError(f"shard {text!r} is not of the form i/N (e.g. 0/4)") from err
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, grid_id: str) -> bool:
        """Whether the steps of ``grid_id`` belong to this shard."""
        return shard_of(grid_id, self.count) == self.index


def shard_of(grid_id: str, count: int) -> int:
    """The shard (``0 .. count-1``) of a grid: first 8 bytes of sha256(grid_id) mod ``count``."""
    digest = hashlib.sha256(str(grid_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % int(count)
