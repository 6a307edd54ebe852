"""One import namespace: the wheel installs only ``goalprobe``, and a user's own ``probes/``
and ``viewer/`` packages never shadow ours."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def source_copy(dest: Path) -> Path:
    """The repository's tracked files under ``dest`` (a build writes ``build/`` and
    ``*.egg-info`` beside the sources: not in the working tree)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode == 0 and listed.stdout:
        for name in filter(None, listed.stdout.split("\0")):
            if (ROOT / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, dest / name)
    else:  # not a git checkout: everything but caches and build outputs
        ignore = shutil.ignore_patterns(
            ".git", "__pycache__", "*.egg-info", "build", "dist", "runs", "test-artifacts"
        )
        shutil.copytree(ROOT, dest, ignore=ignore, dirs_exist_ok=True)
    return dest


@pytest.mark.slow  # builds the wheel (~30 s on 2 cores)
def test_the_wheel_installs_one_top_level_package(tmp_path):
    source = source_copy(tmp_path / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("goalprobe-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["goalprobe"]
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"goalprobe"}
    for room in ("gridworld", "agents", "activations", "probes", "viewer"):
        assert f"goalprobe/{room}/__init__.py" in names, room
    assert "goalprobe/agents/bundled/model.safetensors" in names  # package data travels


def test_a_users_own_probes_and_viewer_packages_do_not_shadow_ours(tmp_path):
    for name in ("probes", "viewer"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MARKER = 'theirs: {name}'\n")
    code = (
        "import goalprobe.probes, goalprobe.viewer, probes, viewer; "
        "print(goalprobe.probes.__file__); print(goalprobe.viewer.__file__); "
        "print(probes.MARKER); print(viewer.MARKER); "
        "print(hasattr(goalprobe.probes, 'MARKER') or hasattr(goalprobe.viewer, 'MARKER'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path
    ).stdout.splitlines()
    assert Path(out[0]).resolve() == (ROOT / "probes" / "__init__.py").resolve()
    assert Path(out[1]).resolve() == (ROOT / "viewer" / "__init__.py").resolve()
    assert out[2:] == ["theirs: probes", "theirs: viewer", "False"]
