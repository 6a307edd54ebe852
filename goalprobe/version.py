"""The installed goalprobe version: a leaf module every room may import (it imports nothing ours)."""

from __future__ import annotations

from importlib import metadata


def package_version() -> str:
    """The installed goalprobe version (``"unknown"`` when not installed as a distribution)."""
    try:
        return metadata.version("goalprobe")
    except metadata.PackageNotFoundError:
        return "unknown"
