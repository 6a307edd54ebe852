"""An extraction's batch and token budget, halved on an out-of-memory error (the halving itself:
:mod:`goalprobe.agents.oom`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from goalprobe.agents.oom import OutOfMemoryAtOneError, free_cached_memory, is_out_of_memory


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
