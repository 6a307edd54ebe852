"""The public API (``import goalprobe``): lazy, complete, and the installed version."""

from __future__ import annotations

import json
import subprocess
import sys

import goalprobe
from goalprobe.version import package_version


def test_import_goalprobe_loads_no_room_and_no_torch():
    """``import goalprobe`` imports nothing but the package itself: no torch, no room."""
    code = (
        "import json, sys, goalprobe; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m == 'torch' or m.startswith(('torch.', 'transformers', 'goalprobe')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out) == ["goalprobe"]


def test_every_exported_name_resolves_and_is_listed_by_dir():
    for name in goalprobe.__all__:
        assert getattr(goalprobe, name) is not None, name
    assert set(goalprobe.__all__) <= set(dir(goalprobe))
    assert goalprobe.__version__ == package_version()


def test_exports_are_the_library_objects_not_copies():
    from goalprobe.activations.store import ActivationStore
    from goalprobe.probes.plan_decoder import PlanDecoder

    from goalprobe.demo import run_demo

    assert goalprobe.ActivationStore is ActivationStore
    assert goalprobe.run_demo is run_demo
    assert goalprobe.PlanDecoder is PlanDecoder


def test_unknown_attribute_is_an_attribute_error():
    try:
        goalprobe.no_such_name  # noqa: B018
    except AttributeError as err:
        assert "no_such_name" in str(err)
    else:  # pragma: no cover
        raise AssertionError("goalprobe.no_such_name resolved")


def test_version_option(goalprobe_cli):
    result = goalprobe_cli("--version")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"goalprobe {package_version()}"
