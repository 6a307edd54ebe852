"""``goalprobe serve``: an OpenAI-compatible chat-completions server over a local model."""

from __future__ import annotations

from typing import Annotated

from typer import Option


def command(
    model: Annotated[
        str, Option(help="'bundled', a local model directory or a Hugging Face id.")
    ] = "bundled",
    revision: Annotated[str, Option(help="Hub revision of the model.")] = "",
    device: Annotated[str, Option(help="cpu, cuda, cuda:1, ...")] = "cpu",
    dtype: Annotated[str, Option(help="auto, bfloat16, float16 or float32.")] = "auto",
    host: Annotated[
        str, Option(help="Interface to listen on (loopback only by default).")
    ] = "127.0.0.1",
    port: Annotated[int, Option(min=0, max=65535, help="TCP port.")] = 8000,
    model_name: Annotated[
        str | None,
        Option(help="Model id the server answers to (default: the --model value)."),
    ] = None,
    api_key_env: Annotated[
        str | None,
        Option(
            help="Require 'Authorization: Bearer <key>' with the key held in this environment "
            "variable (default: no key required)."
        ),
    ] = None,
    max_batch_size: Annotated[
        int, Option(min=1, help="Most concurrent requests generated together.")
    ] = 16,
    batch_window: Annotated[
        float, Option(min=0.0, help="Seconds to wait for more requests to batch.")
    ] = 0.01,
    default_max_tokens: Annotated[
        int, Option(min=1, help="max_tokens of requests that give none.")
    ] = 10_000,
    seed: Annotated[
        int,
        Option(
            help="Seed of the server's generator, which draws the seed of every sampled "
            "request that gives none (the same seed answers the same requests the same way)."
        ),
    ] = 0,
    max_queue: Annotated[
        int, Option(min=1, help="Most requests waiting at once; more get 503.")
    ] = 256,
    max_body_bytes: Annotated[
        int, Option(min=1, help="Largest request body in bytes; larger ones get 413.")
    ] = 1 << 20,
    log_level: Annotated[str, Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve a local model as an OpenAI-compatible endpoint (/v1/chat/completions, /v1/models,
    /health): final answer as message.content, reasoning as message.reasoning_content, token
    ids in prompt_token_ids and choices[].token_ids. Prompts beyond the model's context are
    refused (400) and max_tokens is clamped to the context left."""
    import os

    # before torch loads OpenMP: idle threads sleep rather than spin (unless the env says so)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import uvicorn
    from rich.console import Console

    from goalprobe.agents.agent_config import local_backend
    from goalprobe.agents.models import HubUnavailableError
    from goalprobe.agents.server_app import ServeConfig, create_app
    from goalprobe.commands.common import check_host, user_error

    console = Console(stderr=True)
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise user_error(f"--api-key-env: environment variable {api_key_env} is unset or empty")
    if not check_host(host) and api_key is None:
        console.print(
            f"[yellow]warning:[/yellow] listening on {host} without an API key; anyone who can "
            "reach this port can use the model (set --api-key-env)"
        )
    try:
        config = ServeConfig(
            model_name=model_name or model,
            api_key=api_key,
            default_max_tokens=default_max_tokens,
            max_batch_size=max_batch_size,
            batch_window_s=batch_window,
            seed=seed,
            max_queue=max_queue,
            max_body_bytes=max_body_bytes,
        )
    except ValueError as err:
        raise user_error(str(err)) from err
    try:
        backend, _ = local_backend(model, revision=revision, device=device, dtype=dtype)
    except (OSError, ValueError, HubUnavailableError) as err:
        raise user_error(f"--model {model}: cannot load it ({type(err).__name__}: {err})") from err
    console.print(f"serving {config.model_name!r} on http://{host}:{port}/v1")
    uvicorn.run(create_app(backend, config), host=host, port=port, log_level=log_level)
