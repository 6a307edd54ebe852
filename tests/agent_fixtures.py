"""Shared agent fixtures of the rollout and server tests: short templates, a tiny random GPT-OSS."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import threading
import time

import uvicorn
from goalprobe.agents.backend import Completion
from goalprobe.agents.harmony import CHANNEL, MESSAGE, RETURN, render_completion, render_prompt
from goalprobe.agents.oracle_backend import grid_text_of
from goalprobe.agents.reasoning import final_text, reasoning_text
from goalprobe.agents.trajectories import StepRecord
from goalprobe.gridworld.core import Action, Grid, State
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import parse, render


def load_script(name: str):
    """``scripts/<name>.py`` as a module (scripts are not a package)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHORT_TEMPLATES = {  # short prompts keep the tiny model fast on a loaded 2-core CPU
    "instructions_plain.txt": "Reach G.",
    "instructions_key.txt": "Reach G; K opens D.",
    "user_plain.txt": "{{grid}}",
    "user_key.txt": "{{grid}}\n{{key_status}}",
    "key_status_carrying.txt": "You carry K.",
    "key_status_not_carrying.txt": "You do not carry K.",
}


def tiny_gpt_oss(
    tokenizer,
    *,
    layers: int = 2,
    hidden: int = 32,
    heads: int = 2,
    kv_heads: int = 1,
    head_dim: int = 16,
    experts: int = 2,
    experts_per_token: int = 1,
    sliding_window: int = 64,
    max_positions: int = 2048,
    seed: int | None = 0,
    **extra,
):
    """A seeded random GptOssForCausalLM over ``tokenizer``'s vocabulary: the real architecture
    (mixture of experts, attention sinks, sliding and full attention alternating), tiny widths.
    ``extra`` goes to ``GptOssConfig``."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    config = GptOssConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_local_experts=experts,
        num_experts_per_tok=experts_per_token,
        sliding_window=sliding_window,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )
    return GptOssForCausalLM(config)


def tiny_training_model(tokenizer, heads: int = 4):
    """A seeded random 2-layer GptOssForCausalLM (sliding + full attention) for training tests."""
    return tiny_gpt_oss(tokenizer, heads=heads, head_dim=8)


def build_tiny_backend():
    """A LocalBackend over a random 2-layer GptOssForCausalLM with the bundled tokenizer."""
    from goalprobe.agents.local_backend import LocalBackend
    from goalprobe.agents.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = tiny_gpt_oss(
        tokenizer,
        hidden=16,
        head_dim=8,
        sliding_window=8,
        max_positions=512,
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|return|>")],
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LocalBackend(model, tokenizer)


@contextlib.contextmanager
def serving(app):
    """Run ``app`` under uvicorn in a thread on a free 127.0.0.1 port; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


class OracleBackend:
    """A scripted agent: reasons and answers like the bundled agent's training texts (the test
    twin of the library's oracle engine, :class:`goalprobe.agents.oracle_backend.OracleBackend`,
    which the demo runs with a seeded epsilon; this one scripts every branch by call count).

    Deterministic variations exercise every branch: some answers take a non-optimal move, some
    name no action (invalid steps) and some skip the reasoning channel (no post-reasoning
    anchor). ``chat_format`` (default harmony) renders prompts and completions;
    ``variations=False`` answers every step with an optimal move after its reasoning (the
    optimal-policy writer).
    """

    def __init__(self, tokenizer, chat_format=None, *, variations: bool = True):
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.variations = variations
        self.calls = 0

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, batch, sampling):
        out = []
        for messages in batch:
            self.calls += 1
            grid, state = parse(grid_text_of(messages[-1].content))
            best = sorted(solve(grid).optimal_actions(state))
            action = best[0]
            vary = self.variations
            if vary and self.calls % 4 == 1:
                action = next(a for a in Action if a not in best)
            reasoning = reasoning_text(grid, state, [action], key_variant=False)
            final = final_text(action) if not vary or self.calls % 7 != 3 else "I am not sure."
            fmt = self.chat_format
            if vary and self.calls % 5 == 2:
                reasoning = ""
                text = f"{CHANNEL}final{MESSAGE}{final}{RETURN}" if fmt is None else final
            elif fmt is None:
                text = render_completion(reasoning, final)
            else:
                text = fmt.render_completion(reasoning, final)
            if fmt is None:
                prompt = render_prompt(messages, sampling.reasoning_effort)
            else:
                prompt = fmt.render_prompt(messages, sampling.reasoning_effort)
            out.append(
                Completion(
                    prompt_token_ids=self._ids(prompt),
                    generated_token_ids=self._ids(text),
                    text=text,
                    reasoning=reasoning,
                    final=final,
                    token_ids_source="model",
                    finish_reason="stop",
                )
            )
        return out


def step_record(grid: Grid, state: State, **overrides) -> StepRecord:
    fields = dict(
        run_id="run",
        grid_id=grid.grid_id,
        episode=0,
        step=2,
        episode_seed=0,
        grid_size=grid.size,
        density=0.5,
        variant=grid.variant,
        grid_text=render(grid, state),
        agent_row_col=state.agent,
        goal_row_col=grid.goal,
        has_key=state.has_key,
        door_open=state.door_open,
        key_row_col=grid.key,
        door_row_col=grid.door,
        optimal_actions=sorted(a.name for a in solve(grid).optimal_actions(state)),
        distance_to_goal=int(solve(grid).distance(state)),
        action="UP",
        valid=True,
        next_agent_row_col=state.agent,
        prompt_token_ids=[1, 2, 3],
        generated_token_ids=[4, 5],
        token_ids_source="model",
        reasoning="",
        final="",
        finish_reason="stop",
        parse_error=None,
        parse_form="json",
        attempts=1,
    )
    fields.update(overrides)
    return StepRecord(**fields)


def replay_model(tokenizer):
    """A seeded random 3-block GPT-OSS (mixture of experts, sinks, a 16-token window)."""
    return tiny_gpt_oss(
        tokenizer, layers=3, heads=4, kv_heads=2, head_dim=8, experts=4, experts_per_token=2,
        sliding_window=16, max_positions=1024,
    )  # fmt: skip
