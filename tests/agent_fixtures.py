"""Shared agent fixtures of the rollout and server tests: short templates, a tiny random GPT-OSS."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn

SHORT_TEMPLATES = {  # short prompts keep the tiny model fast on a loaded 2-core CPU
    "instructions_plain.txt": "Reach G.",
    "instructions_key.txt": "Reach G; K opens D.",
    "user_plain.txt": "{{grid}}",
    "user_key.txt": "{{grid}}\n{{key_status}}",
    "key_status_carrying.txt": "You carry K.",
    "key_status_not_carrying.txt": "You do not carry K.",
}


def tiny_training_model(tokenizer, heads: int = 4):
    """A seeded random 2-layer GptOssForCausalLM (sliding + full attention) for training tests."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    config = GptOssConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=1, head_dim=8, num_local_experts=2,
        num_experts_per_tok=1, sliding_window=64, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return GptOssForCausalLM(config)


def build_tiny_backend():
    """A LocalBackend over a random 2-layer GptOssForCausalLM with the bundled tokenizer."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from activations.agent.local_backend import LocalBackend
    from activations.agent.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    config = GptOssConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|return|>")],
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LocalBackend(GptOssForCausalLM(config), tokenizer)


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
