"""The installed goalprobe version: a leaf module every room may import (it imports nothing ours)."""

from __future__ import annotations

from importlib import metadata


def installed_version(name: str) -> str | None:
    """The installed version of the distribution ``name`` (None: not installed)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_version() -> str:
    """The installed goalprobe version (``"unknown"`` when not installed as a distribution)."""
    return installed_version("goalprobe") or "unknown"


PROVENANCE_PACKAGES: tuple[str, ...] = (
    "torch",
    "transformers",
    "nnsight",
    "h5py",
    "vllm",
    "triton",
    "kernels",
    "accelerate",
    "openai-harmony",
)
"""The packages whose versions :func:`software_versions` records (a missing one is left out)."""


def software_versions() -> dict[str, str]:
    """The versions that produced a result: goalprobe, Python and the installed
    :data:`PROVENANCE_PACKAGES` (read from their metadata; nothing is imported)."""
    import platform

    versions = {"goalprobe": package_version(), "python": platform.python_version()}
    found = {name: installed_version(name) for name in PROVENANCE_PACKAGES}
    return versions | {name: version for name, version in found.items() if version is not None}
