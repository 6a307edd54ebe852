"""The ``goalprobe`` command line: one verb per study stage.

Each verb lives in ``goalprobe/commands/<verb>.py`` as a function ``command`` with typer
annotations; heavy libraries (torch, transformers, h5py) are imported inside that function so
that ``goalprobe --help`` stays fast.

Errors: every verb runs under :class:`OneLineErrors`, the one place that turns a usage error or
one of the project's errors (a bad file, a bad value, a missing input) into the single line
``error: <what, where>`` on stderr and exit code 2. A bug (any other exception) still shows its
traceback; ``GOALPROBE_TRACEBACK=1`` shows the traceback of the project's errors too.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from goalprobe.agents.models import HubUnavailableError

EXIT_USER_ERROR = 2
"""Exit code of every usage error and every error in the user's input (click's own code)."""

USER_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, HubUnavailableError)
"""Errors in the user's input: bad files (the project's format errors subclass ``ValueError``),
bad values, and a model not available offline (a server's failure too: :func:`is_server_error`)."""


def is_server_error(err: BaseException) -> bool:
    """Whether ``err`` is a :class:`~goalprobe.agents.server_backend.ServerError` (the
    environment, not a bug); the module is looked up only once imported (a light ``--help``)."""
    module = sys.modules.get("goalprobe.agents.server_backend")
    return module is not None and isinstance(err, module.ServerError)


class OneLineErrors(TyperGroup):
    """The ``goalprobe`` command group, whose errors are one line and exit code 2."""

    def main(self, *args: Any, **extra: Any) -> Any:
        try:  # not standalone: the errors come here, to be printed as one line
            code = super().main(*args, **{**extra, "standalone_mode": False})
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(130)
        except typer.TyperException as err:  # click's usage errors (typer vendors click)
            self._fail(err.format_message(), err)
        except USER_ERRORS as err:
            self._fail(str(err) or type(err).__name__, err)
        except RuntimeError as err:
            if not is_server_error(err):
                raise
            self._fail(f"server: {err}", err)
        # click returns an Exit's code (and a verb's return value, always None here)
        sys.exit(code if isinstance(code, int) else 0)

    @staticmethod
    def _fail(message: str, err: BaseException) -> None:
        if os.environ.get("GOALPROBE_TRACEBACK"):
            raise err
        if not message.strip():  # e.g. no arguments at all: the help was already printed
            sys.exit(EXIT_USER_ERROR)
        typer.echo(f"error: {' '.join(message.split())}", err=True)  # on one line
        sys.exit(EXIT_USER_ERROR)


app = typer.Typer(
    name="goalprobe",
    cls=OneLineErrors,
    help="Measure the goal-directedness of LLM agents: grid-world behaviour, residual-stream "
    "probes, activation patching and MEG.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# in study order for --help; each verb's module under goalprobe.commands (dashes as underscores)
VERBS: tuple[str, ...] = (
    "grids",
    "rollout",
    "states",
    "serve",
    "extract",
    "merge",
    "train-probe",
    "train-plan-decoder",
    "patch",
    "attribute",
    "score",
    "view",
    "demo",
)


def _print_version(value: bool) -> None:
    if value:
        from goalprobe.version import package_version

        typer.echo(f"goalprobe {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        help="Print the installed goalprobe version and exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    """Measure the goal-directedness of LLM agents."""


def prose(doc: str | None) -> str:
    """A docstring as ``--help`` prose: each paragraph on one line, so that the terminal wraps
    it; a paragraph whose lines start with a list marker keeps its line breaks."""

    def listed(paragraph: str) -> bool:
        return any(line.lstrip().startswith(("- ", "* ", "\b")) for line in paragraph.splitlines())

    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(p if listed(p) else " ".join(p.split()) for p in paragraphs)


def _register() -> None:
    for verb in VERBS:
        module = importlib.import_module(f"goalprobe.commands.{verb.replace('-', '_')}")
        app.command(name=verb, help=prose(module.command.__doc__))(module.command)


_register()


def main() -> None:
    """Console-script entry point; sets ``OMP_WAIT_POLICY=PASSIVE`` (unless set) before torch
    loads: OpenMP's busy-waiting threads collapse on a shared or loaded CPU."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    app()
