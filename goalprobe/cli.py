"""The ``goalprobe`` command line: one verb per study stage.

Each verb lives in ``goalprobe/commands/<verb>.py`` as a function ``command`` with typer
annotations; heavy libraries (torch, transformers, h5py) are imported inside that function so
that ``goalprobe --help`` stays fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="goalprobe",
    help="Measure the goal-directedness of LLM agents: grid-world behaviour, residual-stream "
    "probes, activation patching and MEG.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# verb -> module under goalprobe.commands (kept in study order for --help)
VERBS: dict[str, str] = {
    "grids": "grids",
    "rollout": "rollout",
    "serve": "serve",
    "extract": "extract",
    "merge": "merge",
    "train-probe": "train_probe",
    "train-plan-decoder": "train_plan_decoder",
    "patch": "patch",
    "score": "score",
    "view": "view",
    "demo": "demo",
}


@app.callback()
def _root() -> None:
    """Measure the goal-directedness of LLM agents."""


def _register() -> None:
    for verb, module_name in VERBS.items():
        module = importlib.import_module(f"goalprobe.commands.{module_name}")
        app.command(name=verb, help=module.command.__doc__)(module.command)


_register()


def main() -> None:
    """Console-script entry point."""
    app()
