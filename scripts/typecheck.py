"""Type-check the library rooms with mypy, under their import names (``goalprobe.*``).

The repository keeps a top-level folder per room and setuptools maps each onto the one import
namespace (``gridworld/`` -> ``goalprobe.gridworld``, pyproject.toml's
``[tool.setuptools.package-dir]``). mypy does not read that mapping: run on the folders, it
would name the modules ``gridworld.core`` and find no ``goalprobe.gridworld`` at all, so every
import across rooms would silently become ``Any``. This script builds the installed layout as a
tree of symbolic links under ``build/typecheck/`` (rebuilt on every run; ``build/`` is ignored
by git), runs ``mypy -p goalprobe`` there with the settings of ``[tool.mypy]``, and prints the
messages with repository paths (``gridworld/core.py``, not ``goalprobe/gridworld/core.py``)::

    python3 scripts/typecheck.py            # what .ci/run runs; exit status is mypy's
    python3 scripts/typecheck.py --no-incremental   # extra arguments go to mypy

The cache lives in ``.mypy_cache/`` at the repository root (ignored by git).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"
PACKAGE = "goalprobe"


def package_dirs(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """``{import name: repository folder}`` from ``[tool.setuptools.package-dir]``."""
    with pyproject.open("rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"]["package-dir"])


def build_tree(mapping: dict[str, str], tree: Path = TREE) -> dict[str, str]:
    """Link every mapped folder into ``tree`` at its import path; returns ``{tree-relative
    prefix: repository prefix}`` for rewriting paths (longest prefix first)."""
    if tree.exists():
        shutil.rmtree(tree)
    top = tree / PACKAGE
    top.mkdir(parents=True)
    nested = {name: folder for name, folder in mapping.items() if name != PACKAGE}
    top_folder = ROOT / mapping.get(PACKAGE, PACKAGE)
    for entry in sorted(top_folder.iterdir()):
        if entry.name not in {n.split(".", 1)[1] for n in nested} and entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    prefixes = {f"{PACKAGE}/": f"{mapping.get(PACKAGE, PACKAGE)}/"}
    for name, folder in sorted(nested.items()):
        if name.count(".") != 1 or not name.startswith(f"{PACKAGE}."):
            raise SystemExit(f"typecheck: cannot map {name!r} (only goalprobe.<room> is supported)")
        (top / name.split(".", 1)[1]).symlink_to(ROOT / folder, target_is_directory=True)
        prefixes[f"{name.replace('.', '/')}/"] = f"{folder}/"
    return dict(sorted(prefixes.items(), key=lambda kv: -len(kv[0])))


def repository_path(line: str, prefixes: dict[str, str]) -> str:
    """``line`` with a leading tree path turned into the repository path."""
    for tree_prefix, repo_prefix in prefixes.items():
        if line.startswith(tree_prefix):
            return repo_prefix + line[len(tree_prefix) :]
    return line


def main(argv: list[str]) -> int:
    prefixes = build_tree(package_dirs())
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(ROOT / ".mypy_cache"),
        "-p",
        PACKAGE,
        *argv,
    ]
    env = {**os.environ, "MYPYPATH": ""}
    proc = subprocess.run(command, cwd=TREE, env=env, capture_output=True, text=True)
    for line in (proc.stdout + proc.stderr).splitlines():
        print(re.sub(r"\s+$", "", repository_path(line, prefixes)))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
