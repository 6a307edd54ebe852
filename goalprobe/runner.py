"""Cached pipeline stages: a stage runs once per resolved config and records what it produced.

Each finished stage writes ``<run_dir>/stages/<name>.json`` holding its resolved config, the
config's hash, its outputs (paths relative to the run directory), timing and the package version.
A rerun skips a stage whose record exists, whose config hash matches and whose outputs are all
present; ``force`` redoes it. The record is written last and atomically, so an interrupted stage
is simply run again.

Provenance: ``goalprobe demo`` writes :func:`demo_provenance` to ``RUN/provenance.json`` (schema
``goalprobe.provenance/1``) and every stage record carries :func:`stage_environment` (the commit
and thread count it was computed with) and :func:`provenance` (software versions, the model's
commit), so a results page can name the commit, command line, thread counts and library
versions behind each number, and whether the code was committed (``dirty``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from goalprobe.run_layout import RunLayout, write_atomic
from goalprobe.version import installed_version, package_version

STAGE_RECORD_SCHEMA = "goalprobe.stage/1"


def config_to_dict(config: Any) -> dict:
    """A JSON-ready dict of a (possibly nested) frozen dataclass config; a nested object with an
    ``identity()`` method (an agent) is recorded by it, so the key changes when the weights do."""
    if not (dataclasses.is_dataclass(config) or isinstance(config, (dict, SimpleNamespace))):
        raise TypeError(f"stage configs must be dataclasses or dicts, got {type(config).__name__}")
    return json.loads(json.dumps(_view(config), default=_json_default))


def _view(obj: Any) -> Any:
    identity = getattr(obj, "identity", None)
    if callable(identity) and dataclasses.is_dataclass(obj):
        return identity()
    if dataclasses.is_dataclass(obj):
        return {f.name: _view(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _view(v) for k, v in obj.items()}
    if isinstance(obj, SimpleNamespace):  # the named values a stage receives
        return {k: _view(v) for k, v in vars(obj).items()}
    if isinstance(obj, (list, tuple)):
        return [_view(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} in a stage config")


def config_hash(config: Any) -> str:
    """A stable sha256 of the config's canonical JSON."""
    payload = json.dumps(config_to_dict(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class StageResult:
    """What a stage run (or skip) produced: its absolute ``outputs`` by name, whether it was
    ``skipped`` (cached), the ``seconds`` of the run that produced them and its JSON ``summary``."""

    name: str
    outputs: dict[str, Path]
    skipped: bool
    seconds: float
    summary: dict


class StageRunner:
    """Runs stages in a run directory, skipping those whose cached outputs are still valid."""

    def __init__(self, run_dir: Path, force: set[str] | None = None) -> None:
        self.layout = RunLayout(Path(run_dir))
        self.force = set(force or ())
        self.layout.stages_dir.mkdir(parents=True, exist_ok=True)

    def remove_outputs(self, name: str) -> None:
        """Delete the outputs the stage's previous record lists, so that a forced stage starts
        over rather than resumes.

        Raises:
            ValueError: the record names an output outside the run directory.
        """
        path = self.layout.stage_record(name)
        if not path.is_file():
            return
        record = json.loads(path.read_text())
        root = self.layout.root.resolve()
        for relative in record.get("outputs", {}).values():
            target = (root / relative).resolve()
            if not target.is_relative_to(root) or target == root:
                raise ValueError(f"stage record {path} names an output outside the run: {relative}")
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)

    def cached(self, name: str, config: Any) -> StageResult | None:
        """The cached result of ``name`` if its record matches ``config`` and outputs exist."""
        path = self.layout.stage_record(name)
        if name in self.force or not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"stage record {path} is corrupt ({err}); delete it to rerun") from err
        expected = (STAGE_RECORD_SCHEMA, config_hash(config))
        if (record.get("schema"), record.get("config_hash")) != expected:
            return None
        outputs = {k: self.layout.root / v for k, v in record["outputs"].items()}
        if not all(p.exists() for p in outputs.values()):
            return None
        return StageResult(name, outputs, True, record["seconds"], record.get("summary", {}))

    def run(
        self,
        name: str,
        config: Any,
        fn: Callable[[Path], tuple[dict[str, Path], dict]],
    ) -> StageResult:
        """Run ``fn(stage_dir)`` unless cached; ``fn`` returns (outputs, summary)."""
        hit = self.cached(name, config)
        if hit is not None:
            return hit
        stage_dir = self.layout.stage_dir(name)
        stage_dir.mkdir(parents=True, exist_ok=True)
        (stage_dir / "config.json").write_text(json.dumps(config_to_dict(config), indent=2))
        start = time.perf_counter()
        outputs, summary = fn(stage_dir)
        seconds = time.perf_counter() - start
        record = {
            "schema": STAGE_RECORD_SCHEMA,
            "name": name,
            "config": config_to_dict(config),
            "config_hash": config_hash(config),
            "outputs": {k: self.layout.relative(v) for k, v in outputs.items()},
            "seconds": seconds,
            "summary": summary,
            "package_version": package_version(),
            "provenance": provenance(config),
            "environment": stage_environment(),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        write_atomic(
            self.layout.stage_record(name), json.dumps(record, indent=2, default=_json_default)
        )
        return StageResult(name, {k: Path(v) for k, v in outputs.items()}, False, seconds, summary)


def provenance(config: Any) -> dict:
    """What produced a stage's outputs beyond its config: the software versions and, when the
    stage runs an agent (a field ``agent`` of its config, possibly under ``config["config"]``),
    the model and its resolved commit ('' when unknown); a stage that generated on a server
    also records the server's ``GET /version`` (``software["server"]``, None when unsaid)."""
    from goalprobe.agents.agent_config import AgentConfig
    from goalprobe.agents.models import model_commit
    from goalprobe.agents.server_backend import ServerBackend
    from goalprobe.version import software_versions

    record: dict = {"software": software_versions()}
    received = config.get("config") if isinstance(config, dict) else config
    agent = getattr(received, "agent", None)
    if isinstance(agent, AgentConfig):
        record["model"] = agent.model
        record["model_commit"] = model_commit(agent.model)
        if agent.backend == "server":
            record["server"] = agent.base_url
            if not agent.local_weights:  # it generated on the server
                versions = ServerBackend(agent.server_config()).server_versions()
                record["software"]["server"] = next(iter(versions.values()))
    return record


def fingerprint(paths: Iterable[Path], root: Path) -> str:
    """sha256 over the relative names and contents of ``paths`` (directories walked, sorted)."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for path in paths:
        path = Path(path)
        files.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
    for file in sorted(set(files)):
        digest.update(file.resolve().relative_to(root.resolve()).as_posix().encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


PROVENANCE_SCHEMA = "goalprobe.provenance/1"
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
"""Distributions whose versions ``provenance.json`` records (None: not installed)."""

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
        "schema": PROVENANCE_SCHEMA,
        **source_commit(),
        "command": shlex.join([Path(argv[0]).name, *argv[1:]]) if argv else None,
        "argv": argv,
        "jobs": jobs,
        "threads_per_worker": threads_per_worker,
        "threads": thread_counts(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "libraries": {name: installed_version(name) for name in LIBRARIES},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
