"""What every stage function is handed besides its config: the run layout, the agents, output."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from goalprobe.agents.agent_config import Agent, AgentConfig
from goalprobe.run_layout import RunLayout, write_atomic
from goalprobe.stats import json_ready


@dataclass
class StageContext:
    """The run a stage belongs to: its ``layout``, whether stages show ``progress`` bars, and
    ``say``, a line logger that keeps progress bars intact (None: quiet)."""

    layout: RunLayout
    progress: bool = False
    say: Callable[[str], None] | None = None
    _agents: dict[AgentConfig, Agent] = field(default_factory=dict)

    def agent(self, config: AgentConfig) -> Agent:
        """The agent of ``config``, loaded at most once per run."""
        if config not in self._agents:
            self._agents[config] = Agent(config)
        return self._agents[config]


def write_json(path: Path, payload: Any) -> Path:
    """Write strict JSON (NaN/inf as null) atomically: a temporary file, then a rename."""
    text = json.dumps(json_ready(payload), indent=1, allow_nan=False, default=_default)
    return write_atomic(path, text + "\n")


def _default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")
