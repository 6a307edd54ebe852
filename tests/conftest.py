"""Shared test fixtures.

Fixture modules live beside the tests (``tests/*_fixtures.py``) and are registered here, so
every test sees the same session-scoped models, runs and servers.
"""

from __future__ import annotations

pytest_plugins: list[str] = ["gptoss_fixtures"]
