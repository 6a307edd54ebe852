"""Argument helpers every verb shares: comma-separated lists, choices, and the one rule for
existing outputs (never overwritten unless ``--overwrite`` asks).

Each raises ``typer.BadParameter`` naming the option, which the CLI prints as one
``error: ...`` line with exit code 2 (:class:`goalprobe.cli.OneLineErrors`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from typer import Option

T = TypeVar("T")

OutDirOption = Annotated[Path, Option("--out", "-o", help="Output directory.")]
"""``--out``: the output directory of a verb that writes several files (patch, attribute)."""

BaseTrajectoriesOption = Annotated[
    Path | None,
    Option(help="Trajectory JSONL (`goalprobe rollout`): its steps are the bases."),
]
"""``--trajectories``: the bases of base/counterfactual pairs, from recorded steps."""

BaseGridsOption = Annotated[
    Path | None,
    Option(help="Grid-set JSONL (`goalprobe grids`): start states are the bases."),
]
"""``--grids``: the bases of base/counterfactual pairs, from grids' start states."""

ModelOption = Annotated[
    str, Option(help="'bundled', a local model directory, or a Hugging Face id.")
]
"""``--model``: the agent whose residual stream a verb reads."""

OverwriteOption = Annotated[
    bool,
    Option(
        "--overwrite",
        help="Replace an existing output (without it, an existing output is an error).",
    ),
]
"""``--overwrite``: every verb's flag to replace an existing output."""


def user_error(message: str) -> typer.Exit:
    """Print ``error: <message>`` on stderr and return the exit (code 2) to raise: for errors
    found once the work has begun, after the arguments were checked."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def parse_list(
    text: str, kind: Callable[[str], T], option: str, *, empty_ok: bool = False
) -> tuple[T, ...]:
    """The comma-separated values of ``text`` converted by ``kind`` (blank parts skipped); a value
    ``kind`` rejects, or an empty list unless ``empty_ok``, is ``typer.BadParameter``."""
    try:
        values = tuple(kind(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as err:
        raise typer.BadParameter(
            f"{text!r} is not a comma-separated list: {err}", param_hint=option
        ) from err
    if not values and not empty_ok:
        raise typer.BadParameter("needs at least one value", param_hint=option)
    return values


def choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    """``value`` if it is one of ``allowed``, else ``typer.BadParameter``."""
    if value not in allowed:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}", param_hint=option)
    return value


def check_new_output(path: Path, overwrite: bool, option: str, *, directory: bool = False) -> None:
    """Refuse an output ``path`` (a file, or a directory when ``directory``) named by ``option``
    that exists (unless ``overwrite``) or has the wrong kind."""
    if directory:
        if path.exists() and not path.is_dir():
            raise typer.BadParameter(f"{path} exists and is not a directory", param_hint=option)
        if path.is_dir() and any(path.iterdir()) and not overwrite:
            raise typer.BadParameter(
                f"{path} exists and is not empty; pass --overwrite to replace its outputs",
                param_hint=option,
            )
        return
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a directory; give a file path", param_hint=option)
    if path.exists() and not overwrite:
        raise typer.BadParameter(
            f"{path} exists; pass --overwrite to replace it", param_hint=option
        )


def model_format(model: str, option: str = "--model"):
    """The chat format of ``model`` (:func:`goalprobe.agents.chat_format.model_chat_format`),
    read from its tokenizer files before any weights load; a missing model or one whose template
    has no reasoning delimiters is one error naming ``option``."""
    from goalprobe.agents.chat_format import ChatFormatError, model_chat_format
    from goalprobe.agents.models import HubUnavailableError, check_model_available

    try:
        check_model_available(model)
        return model_chat_format(model)
    except ChatFormatError as err:
        raise typer.BadParameter(f"{model}: {err}", param_hint=option) from err
    except (FileNotFoundError, HubUnavailableError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint=option) from err


def check_device(device: str, option: str = "--device") -> str:
    """``device`` if it is ``auto`` or a device torch can name (``cpu``, ``cuda``, ``cuda:1``,
    ...), else ``typer.BadParameter``; checked before any model loads (availability is checked
    when it loads)."""
    if device == "auto":
        return device
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise typer.BadParameter(
            f"{device!r} is not a device (auto, cpu, cuda, cuda:N, ...)", param_hint=option
        ) from err
    return device


def check_host(host: str, option: str = "--host") -> bool:
    """Whether ``host``, an interface a server can bind (an IP address, ``localhost``, or a name
    this machine resolves), is loopback-only; anything else is ``typer.BadParameter``."""
    import ipaddress
    import socket

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise typer.BadParameter(
            f"{host!r} is neither an IP address nor a host name this machine resolves ({err})",
            param_hint=option,
        ) from err
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def check_stored(asked: tuple[T, ...], held, what: str, option: str) -> tuple[T, ...]:
    """``asked`` (the stages or layers an option names), refused unless the store holds each
    and at least one is named."""
    missing = [x for x in asked if x not in held]
    if not asked or missing:
        raise typer.BadParameter(
            f"{what} {missing or list(asked)} not in the store (it holds {list(held)})",
            param_hint=option,
        )
    return asked


def check_directory(path: Path | None, option: str) -> None:
    """Refuse an input directory option that names no directory."""
    if path is not None and not path.is_dir():
        raise typer.BadParameter(f"{path} is not a directory", param_hint=option)


@contextmanager
def removed_on_error(path: Path) -> Iterator[None]:
    """Remove ``path`` (a file or a directory tree) when the block fails and ``path`` did not
    exist before it, so that a failed verb leaves no partial output that looks complete."""
    existed = path.exists()
    try:
        yield
    except BaseException:
        if not existed and path.exists():
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        raise
