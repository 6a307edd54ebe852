"""``goalprobe rollout``: run the agent on a grid set and record every step as trajectory JSONL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer import Argument, Option

from goalprobe.commands.common import (
    check_device,
    check_directory,
    choice,
    model_format,
    user_error,
)

if TYPE_CHECKING:
    from goalprobe.agents.backend import Backend


_Out = Annotated[Path, Option("--out", "-o", help="Trajectory JSONL to write (or resume).")]
_Model = Annotated[
    str,
    Option(
        help="'bundled', a local model directory or a Hugging Face id; with --server, the "
        "model name sent to the server."
    ),
]
_Dtype = Annotated[str, Option(help="auto, bfloat16, float16 or float32 (local models).")]
_Server = Annotated[
    list[str] | None,
    Option(
        help="Base URL of an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1) "
        "to use instead of a local model; repeat it for several servers of the same model "
        "(each request goes to the least loaded)."
    ),
]
_ApiKeyEnv = Annotated[str, Option(help="Environment variable holding the server's API key.")]
_Tokenizer = Annotated[
    str | None,
    Option(
        help="The model's tokenizer ('bundled', directory or hub id): reads the channels "
        "from returned ids and, when a server returns none, re-tokenises its text (such "
        "steps are counted and warned about: vLLM renders prompts differently)."
    ),
]
_ServerTokenIds = Annotated[
    bool,
    Option(
        help="Ask the server for the prompt and generated token ids (vLLM >= 0.10.2: "
        "return_token_ids), so that extraction replays what the model read."
    ),
]
_RequireTokenIds = Annotated[
    bool,
    Option(
        help="Stop (error, exit 2) at the first answer without token ids instead of "
        "re-tokenising it."
    ),
]
_DeveloperRole = Annotated[
    str, Option(help="Role the instructions are sent as: developer or system.")
]
_Concurrency = Annotated[
    int,
    Option(
        min=1,
        help="Server requests in flight per server (vLLM batches up to its --max-num-seqs, "
        "256 by default).",
    ),
]
_RequestRetries = Annotated[
    int,
    Option(
        min=0,
        help="Retries of a failed server request (429/5xx, timeouts, truncated or "
        "malformed answers), with exponential backoff.",
    ),
]
_RetryBackoff = Annotated[
    float, Option(min=0.0, help="First retry delay, seconds (doubles each retry).")
]
_RetryBackoffMax = Annotated[float, Option(min=0.0, help="Longest retry delay, seconds.")]
_MaxFailedRounds = Annotated[
    int,
    Option(
        min=0,
        help="Consecutive failures of one episode's server request tolerated (it is sent "
        "again); one more stops the run, resumable by rerunning the command.",
    ),
]
_HorizonFactor = Annotated[float, Option(help="Horizon T = ceil(factor * L), L the shortest path.")]
_Horizon = Annotated[
    int | None, Option(min=1, help="Fixed horizon T (overrides --horizon-factor).")
]
_Retries = Annotated[int, Option(min=0, help="Extra attempts when an answer names no action.")]
_BatchSize = Annotated[
    int | None,
    Option(
        min=1,
        max=4096,
        help="Episodes in flight (default: 16 for a local model; for servers, --concurrency "
        "times the number of servers, each episode scheduled on its own).",
    ),
]
_Shard = Annotated[
    str,
    Option(
        help="i/N: run only the grids of shard i of N (by grid id, as `extract --shard`); "
        "`goalprobe merge` joins the N trajectory files into the unsharded run's episodes."
    ),
]
_MaxNewTokens = Annotated[int, Option(min=1, help="Most tokens per attempt (reasoning + answer).")]
_TemplateDir = Annotated[
    Path | None, Option(help="Directory of prompt templates (default: packaged).")
]
_PreflightSteps = Annotated[
    int,
    Option(
        min=0,
        help="Steps sampled before a fresh run of a model other than the bundled ones "
        "(truncation rate, tokens per step, projected tokens and hours); 0 skips it.",
    ),
]
_AllowTruncation = Annotated[
    bool,
    Option(
        "--allow-truncation",
        help="Run even when the pre-flight finds more than 5% of steps cut off by "
        "--max-new-tokens (truncated steps are still recorded and reported apart).",
    ),
]


def command(
    grids: Annotated[Path, Argument(help="Grid-set JSONL written by `goalprobe grids`.")],
    out: _Out,
    model: _Model = "bundled",
    revision: Annotated[str, Option(help="Hub revision of a local-run model.")] = "",
    device: Annotated[str, Option(help="cpu, cuda, cuda:1, ... (local models).")] = "cpu",
    dtype: _Dtype = "auto",
    server: _Server = None,
    api_key_env: _ApiKeyEnv = "OPENAI_API_KEY",
    tokenizer: _Tokenizer = None,
    server_token_ids: _ServerTokenIds = False,
    require_token_ids: _RequireTokenIds = False,
    developer_role: _DeveloperRole = "developer",
    concurrency: _Concurrency = 128,
    request_timeout: Annotated[float, Option(help="Per-request timeout, seconds.")] = 600.0,
    request_retries: _RequestRetries = 5,
    retry_backoff: _RetryBackoff = 1.0,
    retry_backoff_max: _RetryBackoffMax = 60.0,
    max_failed_rounds: _MaxFailedRounds = 3,
    episodes: Annotated[int, Option(min=1, max=100_000, help="Episodes per grid.")] = 10,
    horizon_factor: _HorizonFactor = 1.5,
    horizon: _Horizon = None,
    retries: _Retries = 2,
    batch_size: _BatchSize = None,
    shard: _Shard = "0/1",
    temperature: Annotated[float, Option(help="Sampling temperature.")] = 0.7,
    top_p: Annotated[float, Option(help="Nucleus-sampling mass.")] = 0.95,
    max_new_tokens: _MaxNewTokens = 10_000,
    reasoning_effort: Annotated[str, Option(help="low, medium or high.")] = "low",
    seed: Annotated[int, Option(help="Base seed of all sampling.")] = 0,
    template_dir: _TemplateDir = None,
    progress: Annotated[bool, Option(help="Show a progress bar.")] = True,
    preflight_steps: _PreflightSteps = 16,
    allow_truncation: _AllowTruncation = False,
) -> None:
    """Run the agent on every grid and write one JSONL line per step plus one per episode.

    Resumable: rerun the same command after an interruption and finished episodes are skipped.
    """
    from rich.console import Console

    from goalprobe.activations.store.schema import Shard
    from goalprobe.agents.agent_config import local_backend
    from goalprobe.agents.bundled import is_bundled
    from goalprobe.agents.models import load_tokenizer
    from goalprobe.agents.rollout import RolloutConfig, RolloutStopped, run_rollouts
    from goalprobe.agents.server_backend import ServerBackend, ServerConfig, ServerTokenIdsError
    from goalprobe.agents.trajectories import read_run_header
    from goalprobe.gridworld.io import read_grid_set

    console = Console(stderr=True)
    try:
        chosen_shard = Shard.parse(shard)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--shard") from err
    if batch_size is None:
        batch_size = concurrency * len(server) if server else 16
    check_device(device)
    check_directory(template_dir, "--template-dir")
    choice(developer_role, ("developer", "system"), "--developer-role")
    try:
        config = RolloutConfig(
            episodes_per_grid=episodes,
            horizon_factor=horizon_factor,
            horizon_steps=horizon,
            retries=retries,
            batch_size=batch_size,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            reasoning_effort=reasoning_effort,
            seed=seed,
            template_dir=str(template_dir) if template_dir is not None else None,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    grid_set = read_grid_set(grids)
    if not grid_set:
        raise typer.BadParameter(f"{grids} holds no grids", param_hint="GRIDS")
    grid_set = [grid for grid in grid_set if chosen_shard.holds(grid.grid_id)]
    if out.is_dir():
        raise typer.BadParameter(f"{out} is a directory; give a file path", param_hint="--out")
    if out.exists() and out.stat().st_size:
        read_run_header(out)  # resuming: a file that is no trajectory file is refused here
    # before any weights load (None: no tokenizer given to a server run, which is then harmony
    # as the server renders it)
    named, option = (tokenizer, "--tokenizer") if server else (model, "--model")
    chat_format = None if named is None else model_format(named, option)
    backend: Backend
    if server:
        try:
            server_config = ServerConfig(
                base_url=server[0],
                more_base_urls=tuple(server[1:]),
                model=model,
                api_key_env=api_key_env,
                max_concurrency=concurrency,
                timeout_s=request_timeout,
                max_retries=request_retries,
                backoff_s=retry_backoff,
                backoff_max_s=retry_backoff_max,
                request_token_ids=server_token_ids,
                require_token_ids=require_token_ids,
                developer_role=developer_role,
            )
        except ValueError as err:  # a bad setting: error, exit 2
            raise user_error(f"--server: {err}") from err
        served_tokenizer = load_tokenizer(tokenizer) if tokenizer is not None else None
        served = ServerBackend(server_config, served_tokenizer, chat_format=chat_format)
        backend, description = served, served.describe()
    else:
        backend, description = local_backend(
            model, revision=revision, device=device, dtype=dtype, chat_format=chat_format
        )
    if not is_bundled(model) and preflight_steps and not (out.exists() and out.stat().st_size):
        _preflight(
            grids, out, grid_set, backend, config, preflight_steps, allow_truncation, console
        )
    try:
        report = run_rollouts(
            grid_set,
            backend,
            config,
            out,
            progress=progress,
            backend_description=description,
            max_failed_rounds=max_failed_rounds,
        )
    except RolloutStopped as err:
        raise user_error(f"{out}: {err}{_request_summary(backend)}") from err
    except ServerTokenIdsError as err:
        raise user_error(f"{out}: {err}; finished episodes are kept (rerun resumes)") from err
    _print_report(console, out, report, backend)


def _preflight(grids, out, grid_set, backend, config, steps, allow_truncation, console) -> None:
    """Sample a few steps before a fresh run and refuse (error, exit 2) a run that would be cut
    off by the token limit too often or whose requests fail."""
    from goalprobe.agents.backend import BatchGenerationError
    from goalprobe.agents.preflight import PreflightConfig, PreflightRefused, run_preflight
    from goalprobe.agents.server_backend import ServerTokenIdsError

    preflight = PreflightConfig(steps=steps, allow_truncation=allow_truncation)
    try:
        checked = run_preflight(grid_set, backend, config, preflight)
    except ServerTokenIdsError as err:
        raise user_error(f"{out}: {err}") from err
    except BatchGenerationError as err:
        raise user_error(f"{out}: the pre-flight's requests failed: {err}") from err
    console.print(checked.describe(), soft_wrap=True)
    try:
        checked.check(preflight)
    except PreflightRefused as err:
        raise user_error(f"{grids}: {err}") from err


def _print_report(console, out: Path, report, backend) -> None:
    """One line of what the rollout ran, and a warning about re-tokenised steps."""
    console.print(
        f"{out}: run {report.run_id}; {report.episodes_run} episode(s) run, "
        f"{report.episodes_skipped} already finished, {report.episodes_total} in all; "
        f"{report.successes} successful; {report.steps} steps ({report.invalid_steps} invalid, "
        f"{report.truncated_episodes} episode(s) cut off by the token limit) "
        f"in {report.seconds:.1f} s ({report.steps_per_second:.2f} steps/s, "
        f"{report.generate_calls} generate calls)"
        + (
            f"; {report.failed_rounds} round(s) with failed requests "
            f"({report.failed_generations} resent)"
            if report.failed_rounds
            else ""
        )
        + _request_summary(backend),
        soft_wrap=True,
    )
    if report.retokenized_steps:
        console.print(
            f"warning: {report.retokenized_steps} of {report.steps} steps were re-tokenised from "
            "the server's text (it returned no token ids): their prompt ids are goalprobe's "
            "rendering, not necessarily what the model read; use --server-token-ids with "
            "vLLM >= 0.10.2",
            soft_wrap=True,
        )


def _request_summary(backend: object) -> str:
    """``"; server: ... requests, ... retries, ... failed"`` for a server backend, else ``""``."""
    from goalprobe.agents.server_backend import ServerBackend

    if not isinstance(backend, ServerBackend):
        return ""
    stats = backend.stats
    kinds = ", ".join(f"{kind} x{n}" for kind, n in sorted(stats.problems.items()))
    return (
        f"; server: {stats.requests} request(s) answered, {stats.retries} retried, "
        f"{stats.failures} given up" + (f" ({kinds})" if kinds else "")
    )
