"""The tests of the bundled agents' training import it from ``scripts/agent_training/`` (it is
not part of the library): put ``scripts/`` on ``sys.path``, as running a script there does."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = str(Path(__file__).resolve().parents[2] / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
