"""A model directory built once per test session, shared by the pytest-xdist workers.

The tiny GPT-OSS and Qwen3 fixtures convert a real vocabulary into a fast tokenizer (several CPU
seconds each); with one worker per core every worker built its own. Under xdist the first worker
to ask builds the directory in the session's shared temporary folder (under a file lock) and
the others load the tokenizer from it and construct the same seeded model, as a user's process
loads a saved model directory. Without xdist the fixture builds in its own folder, as before.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def built_once(
    tmp_path_factory, name: str, build: Callable[[Path], T], load: Callable[[Path], T]
) -> T:
    """``build(directory)`` in the first worker of the session, ``load(directory)`` in the
    others (after the build finished); a build that failed is redone by the next worker."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent  # one folder per session, shared by workers
    directory, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if done.is_file():
            return load(directory)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        built = build(directory)
        done.touch()
        return built
