"""The installed goalprobe version: a leaf module every room may import (it imports nothing ours)."""

from __future__ import annotations

from importlib import metadata


def package_version() -> str:
    """The installed goalprobe version (``"unknown"`` when not installed as a distribution)."""
    try:
        return metadata.version("goalprobe")
    except metadata.PackageNotFoundError:
        return "unknown"


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
    for name in PROVENANCE_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions
