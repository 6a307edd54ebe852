"""``goalprobe states``: prompts at sampled grid states, for pre-reasoning extraction without
rollouts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer import Argument, Option

from goalprobe.commands.common import OverwriteOption, check_directory, check_new_output


def command(
    grids: Annotated[Path, Argument(help="Grid-set JSONL written by `goalprobe grids`.")],
    out: Annotated[Path, Option("--out", "-o", help="Prompt-only trajectory JSONL.")],
    model: Annotated[
        str, Option(help="Whose tokenizer: 'bundled', a local directory or a hub id.")
    ] = "bundled",
    per_grid: Annotated[
        int,
        Option("--per-grid", min=1, max=10_000, help="States per grid (the start state first)."),
    ] = 8,
    reasoning_effort: Annotated[
        str, Option(help="Reasoning effort named in the system message.")
    ] = "low",
    template_dir: Annotated[
        Path | None, Option(help="Prompt template directory (default: packaged).")
    ] = None,
    seed: Annotated[int, Option(help="Seed of the state draw.")] = 0,
    served_prompts: Annotated[
        Path | None,
        Option(
            help="Trajectory JSONL of rollouts on a chat endpoint (vLLM): render the prompts as "
            "that server did (its date line, its developer message), read off a served prompt."
        ),
    ] = None,
    resume: Annotated[bool, Option(help="Continue an interrupted file of the same run.")] = False,
    overwrite: OverwriteOption = False,
) -> None:
    """Write the agent's prompt at sampled states of every grid, without generating.

    Pre-reasoning activations depend on the prompt alone: `goalprobe extract OUT --stages
    pre_reasoning` then stores a probing set (agent position, goal, cell types) for as many
    grids as wanted at the cost of one prompt forward per state. The file is a trajectory file
    whose states are one-step episodes with no generated tokens (marked prompt_only); it holds
    no behaviour.
    """
    from goalprobe.agents.chat_format import ChatFormatError, chat_format_for
    from goalprobe.agents.models import check_model_name, describe_local_model, load_tokenizer
    from goalprobe.agents.prompt_states import PromptStatesConfig, write_prompt_states
    from goalprobe.gridworld.io import read_grid_set

    check_directory(template_dir, "--template-dir")
    if not resume:
        check_new_output(out, overwrite, "--out")
        if overwrite and out.exists():
            out.unlink()
    config = PromptStatesConfig(
        states_per_grid=per_grid,
        reasoning_effort=reasoning_effort,
        template_dir=str(template_dir) if template_dir is not None else None,
        seed=seed,
    )
    grid_set = read_grid_set(grids)
    if not grid_set:
        raise typer.BadParameter(f"{grids} holds no grids", param_hint="GRIDS")
    check_model_name(model)
    tokenizer = load_tokenizer(model)
    try:
        chat_format = chat_format_for(tokenizer)
    except ChatFormatError as err:
        raise typer.BadParameter(f"{model}: {err}", param_hint="--model") from err
    encode, description = chat_format.encode_prompt, describe_local_model(model)
    if served_prompts is not None:
        served = _served_rendering(served_prompts, tokenizer, chat_format.name)
        encode, description = served.encode_prompt, {**description, "rendering": served.describe()}
    report = write_prompt_states(
        grid_set,
        encode,
        config,
        out,
        backend_description={**description, "prompt_only": True},
        chat_format=chat_format.describe(),
    )
    typer.echo(
        f"{out}: run {report.run_id}; {report.states_written} state(s) written, "
        f"{report.states_skipped} already there, {report.states_total} over {report.grids} grids"
    )


def _served_rendering(path: Path, tokenizer, format_name: str):
    """The rendering of the first served prompt (``token_ids_source == "model"``) in ``path``."""
    from goalprobe.agents.harmony import served_harmony_in
    from goalprobe.agents.trajectories import TrajectoryFormatError

    hint = "--served-prompts"
    if not path.is_file():
        raise typer.BadParameter(f"{path} is not a file", param_hint=hint)
    if format_name != "harmony":
        raise typer.BadParameter(
            f"{path}: only a harmony model's served rendering differs from goalprobe's "
            f"(this tokenizer's format is {format_name})",
            param_hint=hint,
        )
    try:
        served = served_harmony_in(tokenizer, path)
    except (TrajectoryFormatError, ValueError) as err:
        raise typer.BadParameter(f"{path}: {err}", param_hint=hint) from err
    if served is None:
        raise typer.BadParameter(
            f"{path} holds no served prompt (prompt-only states, or no step with the served "
            "prompt ids)",
            param_hint=hint,
        )
    return served
