"""Where a run's numbers come from: the commit, the command and the environment (no I/O beyond
asking git and the installed distributions).

``goalprobe demo`` writes :func:`demo_provenance` to ``RUN/provenance.json`` (schema
``goalprobe.provenance/1``), and every stage record carries :func:`stage_environment` (the
commit and thread count it was computed with), so a results page generated from a run can name
the commit, command line, thread counts and library versions that produced each number, and
say whether the code was committed (``dirty``: tracked files differed from the commit).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

from goalprobe.version import installed_version

SCHEMA = "goalprobe.provenance/1"
"""Schema tag of ``provenance.json``."""

LIBRARIES: tuple[str, ...] = (
    "goalprobe",
    "torch",
    "numpy",
    "scipy",
    "scikit-learn",
    "transformers",
    "safetensors",
    "h5py",
)
"""Distributions whose versions are recorded."""

SOURCE = Path(__file__).resolve().parents[1]
"""The checkout the running code was imported from (the repository root of an editable
install)."""


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(SOURCE), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


@lru_cache(maxsize=1)
def source_commit() -> dict:
    """``{commit, dirty}``: the commit of the checkout the code runs from (None when it is not a
    git checkout) and whether tracked files differ from it (None when unknown)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def library_versions() -> dict[str, str | None]:
    """Installed version of each of :data:`LIBRARIES` (None: not installed)."""
    return {name: installed_version(name) for name in LIBRARIES}


def thread_counts() -> dict:
    """The thread settings numbers can depend on: torch intra-/inter-op threads, the OpenMP
    and MKL environment, and the CPU count."""
    import torch

    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
        "cpu_count": os.cpu_count(),
    }


def stage_environment() -> dict:
    """What a stage record carries: the commit and the threads it ran with."""
    return {**source_commit(), "torch_threads": thread_counts()["torch_threads"]}


def demo_provenance(*, jobs: int, threads_per_worker: int, argv: list[str] | None = None) -> dict:
    """The body of ``provenance.json`` for one ``goalprobe demo`` call."""
    argv = list(sys.argv if argv is None else argv)
    return {
        "schema": SCHEMA,
        **source_commit(),
        "command": shlex.join([Path(argv[0]).name, *argv[1:]]) if argv else None,
        "argv": argv,
        "jobs": jobs,
        "threads_per_worker": threads_per_worker,
        "threads": thread_counts(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "libraries": library_versions(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
