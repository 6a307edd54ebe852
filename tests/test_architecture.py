"""The architecture as tests: import direction, a torch-free grid world, a thin application layer.

Every import statement of the four packages is parsed with ``ast``, function-local ones
included, so a lazy import cannot hide a reversed dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("activations", "probes", "viewer", "goalprobe")
"""Packages in import order: a module may import only from its own package or those before."""

APPLICATION_MAX_LINES = 400


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = module or _module_name(path)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the module's package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def test_imports_flow_one_way():
    wrong = []
    for rank, package in enumerate(LAYERS):
        allowed = set(LAYERS[: rank + 1])
        for path in _modules(package):
            for line, name in _imports(path):
                top = name.split(".")[0]
                if top in LAYERS and top not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert wrong == [], "imports against activations <- probes <- viewer <- goalprobe:\n" + (
        "\n".join(wrong)
    )


def test_the_parser_sees_function_local_imports(tmp_path):
    # the check above would be toothless if it missed lazy imports
    source = tmp_path / "mod.py"
    source.write_text(
        "def f():\n    from goalprobe.cli import app\n    import viewer.data\n"
        "    from .figures import x\n"
    )
    names = [name for _, name in _imports(source, "viewer.mod")]
    assert names == ["goalprobe.cli", "viewer.data", "viewer.figures"]


def test_application_code_does_not_import_the_cli():
    wrong = []
    for path in _modules("goalprobe"):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "goalprobe/cli.py" or relative.startswith("goalprobe/commands/"):
            continue
        for line, name in _imports(path):
            if name == "goalprobe.cli" or name.startswith("goalprobe.commands"):
                wrong.append(f"{relative}:{line} imports {name}")
    assert wrong == []


def test_the_grid_world_imports_no_torch():
    modules = [_module_name(p) for p in _modules("activations/gridworld")]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(len(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "0", "importing activations.gridworld loads torch"


@pytest.mark.parametrize(
    "path", _modules("goalprobe"), ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_application_modules_are_small(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= APPLICATION_MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines"


def test_run_paths_are_named_in_one_place():
    """No module outside the run layout spells a run-directory file path."""
    needles = (
        '"rollouts/trajectories.jsonl"',
        '"activations/activations.h5"',
        '"probes/decoded"',
        '"scoring/belief.json"',
        '"patching/patch_results.json"',
    )
    wrong = [
        f"{path.relative_to(ROOT)}: {needle}"
        for package in LAYERS
        for path in _modules(package)
        if path.name != "run_layout.py"
        for needle in needles
        if needle in path.read_text(encoding="utf-8")
    ]
    assert wrong == []
