"""GPU check in one command: a GPT-OSS-20B-shaped model with random weights on the GPU, rollout
steps through the local backend and extraction at T = 500, 1,000, 2,000 and 4,000 replayed
tokens, with the measured peak memory beside the planner's estimate and tokens/s.

The model has GPT-OSS-20B's dimensions (:data:`GPT_OSS_20B_CONFIG`: width 2,880, 64 query and 8
KV heads of 64, 32 experts with 4 active, sliding-window and full layers alternating, vocabulary
201,088) and random weights, built on the ``meta`` device and materialised in place (no 40 GB
download, no initialisation in fp32). All 24 blocks are built when the card holds them (bf16
weights: 41.8 GB), else as many as fit (``--blocks`` forces a number); the report says how many.
Text goes through GPT-OSS's own tokenizer (o200k_harmony, built offline by
``scripts/gptoss_tokenizer.py``, or ``--tokenizer DIR``). MXFP4: when the installed transformers
keeps MXFP4 weights (:func:`goalprobe.activations.plan.mxfp4_status`; ``pip install -e '.[gpu]'``)
a model of ``--mxfp4-blocks`` blocks is saved and reloaded with transformers' MXFP4 quantizer and
its weights and extraction peak are measured too; otherwise the report says why not.

Issue 43's measurements come after the rollout steps: the kernels against eager attention on one
random batch (worst block output difference and the MoE routing flip rate: the share of
(block, token) whose top-4 experts differ from eager's), patching's planned vs measured memory
(``patched_logits`` at ``--patching-lengths``, the batch from
:class:`goalprobe.probes.patching.experiment.PatchingBudget`), and extraction tokens/s with the
fp32-LSE flex kernel (agents/attention.py) at ``--kernel-lengths`` (T = 500 to 16,000). The
weights are counted as loaded (MXFP4's Triton tensors included).

Extraction runs the toolkit's own path on synthetic trajectories (a scripted agent whose
reasoning fills each step to the target length, so every row is replayed at ``T``): the planner
(:mod:`goalprobe.activations.plan`) picks the batch, :func:`goalprobe.activations.extract.extract`
runs it, and the peak (``torch.cuda.max_memory_allocated``) is printed beside the plan's
estimate. It takes under 8 minutes on one H100 and prints a Markdown block for
docs/benchmarks.md. It never runs in CI; ``--device cpu --blocks 1 --tiny`` is a smoke mode on a
tiny config (tests/activations/test_gpu_check.py).

Usage::

    python scripts/gpu_check.py                       # one CUDA GPU, everything
    python scripts/gpu_check.py --lengths 500,1000 --steps 4 --out gpu_check.md
    python scripts/gpu_check.py --device cpu --blocks 1 --tiny --tokenizer DIR   # smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent

GPT_OSS_20B_CONFIG: dict[str, Any] = dict(
    vocab_size=201_088,
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=24,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=32,
    num_experts_per_tok=4,
    sliding_window=128,
    max_position_embeddings=131_072,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150_000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    tie_word_embeddings=False,
)
"""GPT-OSS-20B's ``config.json`` (its dimensions; ``layer_types`` follow the block count)."""

TINY_CONFIG: dict[str, Any] = dict(
    GPT_OSS_20B_CONFIG,
    hidden_size=16,
    intermediate_size=16,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    num_local_experts=2,
    num_experts_per_tok=1,
    sliding_window=16,
    max_position_embeddings=8192,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
)
"""``--tiny``: the same layout at a few thousand parameters per block (CPU smoke mode)."""


PRIME_BLOCK = 1_048_573
"""Length of the normal block tiled into large CPU weights (a prime, so no row repeats)."""


def layer_types(blocks: int) -> list[str]:
    """GPT-OSS's alternation: sliding-window attention first, then full attention."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(blocks)]


def build_model(tokenizer, blocks: int, *, tiny: bool, dtype, device: str, seed: int = 0):
    """A random ``GptOssForCausalLM`` of ``blocks`` blocks with GPT-OSS-20B's (or the tiny)
    dimensions, built on ``meta`` and materialised on ``device`` in ``dtype`` (normal(0, 0.02)
    weights, on a CPU tiled from a normal block of prime length; zero biases, unit norms; the
    rotary frequencies recomputed), in eval mode."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    base = TINY_CONFIG if tiny else GPT_OSS_20B_CONFIG
    config = GptOssConfig(
        **{**base, "num_hidden_layers": blocks, "layer_types": layer_types(blocks)},
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")],
    )
    with torch.device("meta"):
        model = GptOssForCausalLM(config).to(dtype)
    model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    # on a CPU, drawing billions of normals takes minutes: tile a normal block of prime length
    # (rows of a matrix then start at different offsets of it); on a GPU draw every value
    block = torch.empty(PRIME_BLOCK, dtype=dtype, device=device)
    block.normal_(0.0, 0.02, generator=generator)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            elif device.startswith("cpu") and param.numel() > PRIME_BLOCK:
                flat = param.view(-1)
                for start in range(0, flat.numel(), PRIME_BLOCK):
                    piece = flat[start : start + PRIME_BLOCK]
                    piece.copy_(block[: piece.numel()])
            else:
                param.normal_(0.0, 0.02, generator=generator)
        model.model.rotary_emb = GptOssRotaryEmbedding(config).to(device)
    return model.eval()


def load_o200k(directory: str | None):
    """GPT-OSS's tokenizer from ``directory`` (a saved one), else built offline into a
    temporary directory by ``scripts/gptoss_tokenizer.py`` (needs the ``test`` extras)."""
    from transformers import AutoTokenizer

    if directory:
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
    spec = importlib.util.spec_from_file_location(
        "gptoss_tokenizer", SCRIPTS / "gptoss_tokenizer.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tiktoken_file = module.write_tiktoken_file(Path(tempfile.mkdtemp()) / "tiktoken")
    return module.build_fast_tokenizer(tiktoken_file)


# ---------------------------------------------------------------------------------------------
# Synthetic trajectories at a replayed length
# ---------------------------------------------------------------------------------------------


class FilledReasoning:
    """A scripted agent whose every step is replayed at ``target`` tokens: its analysis message
    is filler tokens up to ``target`` minus the prompt and the closing anchor, then a final
    answer (so the post-reasoning anchor sits at position ``target - 1``)."""

    def __init__(self, tokenizer, target: int) -> None:
        self.tokenizer, self.target = tokenizer, target

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, batch, sampling):
        from goalprobe.agents.backend import Completion
        from goalprobe.agents.harmony import render_prompt

        out = []
        for messages in batch:
            prompt = self._ids(render_prompt(messages, sampling.reasoning_effort))
            head = self._ids("<|channel|>analysis<|message|>")
            tail = self._ids("<|end|><|start|>assistant")
            answer = self._ids('<|channel|>final<|message|>{"action": "UP"}<|return|>')
            room = max(0, self.target - len(prompt) - len(head) - len(tail))
            filler = (self._ids(" step") * room)[:room]
            ids = head + filler + tail + answer
            out.append(
                Completion(
                    prompt_token_ids=prompt,
                    generated_token_ids=ids,
                    text=self.tokenizer.decode(ids),
                    reasoning=" step" * room,
                    final='{"action": "UP"}',
                    token_ids_source="model",
                    finish_reason="stop",
                )
            )
        return out


def synthetic_trajectories(tokenizer, target: int, steps: int, out: Path) -> Path:
    """``steps`` one-step episodes on 7 x 7 grids, each replayed at ``target`` tokens."""
    import numpy as np
    from goalprobe.agents.rollout import RolloutConfig, run_rollouts
    from goalprobe.gridworld.generator import generate_grid

    grids = [
        generate_grid(7, 0.3, np.random.default_rng(i), grid_id=f"t{target}-{i}", min_distance=2)
        for i in range(steps)
    ]
    config = RolloutConfig(episodes_per_grid=1, horizon_steps=1, retries=0, batch_size=steps)
    run_rollouts(grids, FilledReasoning(tokenizer, target), config, out, progress=False)
    return out


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


@dataclass
class Report:
    """What the check measured (everything the Markdown block shows)."""

    device: str
    dtype: str
    blocks: int
    blocks_wanted: int
    weights_gb: float
    versions: dict[str, str]
    mxfp4: str
    attention: str = "eager"
    agreement: dict[str, Any] = field(default_factory=dict)
    kernel: str = ""
    kernel_extraction: list[dict[str, float]] = field(default_factory=list)
    patching: list[dict[str, float]] = field(default_factory=list)
    rollout: dict[str, float] = field(default_factory=dict)
    extraction: list[dict[str, float]] = field(default_factory=list)
    mxfp4_extraction: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


def markdown(report: Report) -> str:
    """The Markdown block for docs/benchmarks.md."""
    v = report.versions
    lines = [
        f"### GPU check ({report.device}, {time.strftime('%Y-%m-%d')})",
        "",
        f"`python scripts/gpu_check.py`: GPT-OSS-20B-shaped model with random weights, "
        f"{report.blocks} of {report.blocks_wanted} blocks, {report.dtype} weights "
        f"{report.weights_gb:.1f} GB; torch {v.get('torch', '?')}, transformers "
        f"{v.get('transformers', '?')}, nnsight {v.get('nnsight', '?')}; MXFP4: {report.mxfp4}; "
        f"{report.seconds / 60:.1f} min in all.",
        "",
    ]
    if report.rollout:
        r = report.rollout
        lines += [
            f"Rollout steps (local backend, greedy): {r['conversations']:.0f} conversations x "
            f"{r['new_tokens']:.0f} new tokens in {r['seconds']:.1f} s: "
            f"{r['tokens_per_s']:.0f} generated tokens/s, peak {r['peak_gb']:.1f} GB.",
            "",
        ]
    if report.agreement:
        a = report.agreement
        lines += [
            f"Kernels vs eager attention on one random batch ({a['batch']:.0f} x "
            f"{a['tokens']:,.0f} tokens; eager batched vs one sequence at a time, the dtype's "
            f"own noise: {a['floor']:.3g}):",
            "",
        ]
        lines += [
            f"- {k}: worst block ||eager - k|| / ||eager|| = {v['worst']:.3g}; top-k routing "
            f"differs for {v['flips']:.2%} of (block, token), {v['flips_block0']:.2%} at block 0"
            for k, v in a.items()
            if isinstance(v, dict)
        ]
        lines.append("")
    tables = (
        ("bf16", report.attention, report.extraction),
        ("MXFP4", report.attention, report.mxfp4_extraction),
        (report.dtype, report.kernel, report.kernel_extraction),
    )
    for title, attention, rows in tables:
        if not rows:
            continue
        lines += [
            f"Extraction ({title} weights, {attention} attention), synthetic "
            "trajectories replayed at T tokens:",
            "",
            "| T | steps | batch | tokens/s | peak GB (measured) | peak GB (planned) |",
            "|---|---|---|---|---|---|",
        ]
        for row in rows:
            if not row.get("fits", 1.0):
                lines.append(
                    f"| {row['tokens']:,.0f} | {row['steps']:.0f} | - | not run: one sequence "
                    f"does not fit | - | {row['planned_gb']:.2f} |"
                )
                continue
            lines.append(
                f"| {row['tokens']:,.0f} | {row['steps']:.0f} | {row['batch']:.0f} | "
                f"{row['tokens_per_s']:,.0f} | {row['peak_gb']:.2f} | {row['planned_gb']:.2f} |"
            )
        lines.append("")
    if report.patching:
        lines += [
            "Patching (patched_logits, copies patched from the middle on), planned vs measured:",
            "",
            "| T | copies | peak GB (measured) | peak GB (planned) | measured / planned |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['tokens']:,.0f} | {r['batch']:.0f} | {r['peak_gb']:.2f} | "
            f"{r['planned_gb']:.2f} | {r['peak_gb'] / r['planned_gb']:.2f} |"
            for r in report.patching
        ]
        lines.append("")
    return "\n".join(lines)


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 1e9
    return float("nan")  # CPU: the smoke mode measures nothing


def rollout_steps(model, tokenizer, device: str, conversations: int, new_tokens: int) -> dict:
    """Greedy rollout steps through :class:`~goalprobe.agents.local_backend.LocalBackend`."""
    import numpy as np
    from goalprobe.agents.backend import SamplingConfig
    from goalprobe.agents.local_backend import LocalBackend
    from goalprobe.agents.prompts import build_messages
    from goalprobe.gridworld.generator import generate_grid
    from goalprobe.gridworld.text import render

    backend = LocalBackend(model, tokenizer)
    batch = [
        build_messages(
            render(generate_grid(9, 0.3, np.random.default_rng(i))), variant="plain", has_key=False
        )
        for i in range(conversations)
    ]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=new_tokens, seed=0)
    _reset_peak(device)
    started = time.perf_counter()
    completions = backend.generate(batch, sampling)
    seconds = time.perf_counter() - started
    generated = sum(len(c.generated_token_ids) for c in completions)
    return {
        "conversations": conversations,
        "new_tokens": new_tokens,
        "seconds": seconds,
        "tokens_per_s": generated / seconds,
        "peak_gb": _peak_gb(device),
    }


def extraction_at(
    model, tokenizer, device: str, target: int, steps: int, work: Path, attention: str = "eager"
) -> dict:
    """Extract ``steps`` synthetic steps replayed at ``target`` tokens, batched by the planner
    for the ``attention`` implementation the model runs; the measured peak beside the plan's
    estimate. A plan that does not fit one sequence at a time is recorded as such, not run."""
    from goalprobe.activations.capture import make_backend
    from goalprobe.activations.extract import ExtractConfig, default_layers, extract
    from goalprobe.activations.plan import (
        ModelShape,
        activation_bytes,
        device_memory_bytes,
        loaded_weights_bytes,
        plan_extraction,
        planned_attention,
        replay_lengths,
    )

    traj = synthetic_trajectories(tokenizer, target, steps, work / f"traj_{target}.jsonl")
    capture = make_backend("nnsight", model, tokenizer)
    config = ExtractConfig(layers=default_layers(capture.n_layers), batch_size=64)
    lengths = replay_lengths(traj, tokenizer, config)
    weights = loaded_weights_bytes(model, device)  # MXFP4 Triton tensors included
    dtype_bytes = next(model.parameters()).element_size()
    plan_shape = ModelShape.from_config(model.config)
    attention = planned_attention(attention, device)
    plan = plan_extraction(
        lengths,
        plan_shape,
        memory_bytes=device_memory_bytes(device),
        weights_bytes=weights,
        dtype_bytes=dtype_bytes,
        attention=attention,
    )
    if not plan.fits:
        return {
            "tokens": float(plan.longest),
            "steps": float(len(lengths)),
            "batch": 0.0,
            "tokens_per_s": float("nan"),
            "peak_gb": float("nan"),
            "planned_gb": (weights / 1e9) + plan.one_gb,
            "fits": 0.0,
        }
    config = ExtractConfig(
        layers=config.layers, batch_size=plan.batch_size, max_batch_tokens=plan.max_batch_tokens
    )
    batch = plan.max_batch_tokens // plan.longest if plan.max_batch_tokens else plan.batch_size
    batch = min(batch, len(lengths))
    activations = activation_bytes(plan_shape, batch, plan.longest, dtype_bytes, attention)
    _reset_peak(device)
    started = time.perf_counter()
    extract(traj, work / f"acts_{target}.h5", capture, tokenizer, config, model_id="random")
    seconds = time.perf_counter() - started
    return {
        "tokens": float(plan.longest),
        "steps": float(len(lengths)),
        "batch": float(batch),
        "tokens_per_s": sum(lengths) / seconds,
        "peak_gb": _peak_gb(device),
        "planned_gb": (weights + activations) / 1e9,
        "fits": 1.0,
    }


def attention_agreement(
    model, device: str, kernels: tuple[str, ...], tokens: int = 1_000, batch: int = 2
) -> dict:
    """Residual streams of one random batch under eager attention and each of ``kernels``,
    compared per block output as ``||a - b|| / ||a||`` (worst block), beside the noise floor of
    the dtype itself (eager on the same sequences one at a time instead of batched), and the
    routing flip rate: the share of (block, token) whose top-k experts differ from eager's (a
    flip moves a token's MoE output by about 30%, issue 43), overall and at block 0."""
    import torch
    from goalprobe.agents.attention import register

    generator = torch.Generator(device=device).manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, tokens), device=device, generator=generator)
    routers = [m for n, m in model.named_modules() if n.endswith("mlp.router")]

    def streams(implementation: str, one_at_a_time: bool = False) -> tuple[list, list]:
        register(implementation)
        model.set_attn_implementation(implementation)
        chosen: list = []
        hooks = [
            r.register_forward_hook(lambda m, i, o: chosen.append(o[2].sort(-1).values))
            for r in routers
        ]
        try:
            with torch.no_grad():
                if not one_at_a_time:
                    out = model(ids, output_hidden_states=True, logits_to_keep=1).hidden_states
                    return [h.float() for h in out], chosen
                parts = [
                    model(ids[i : i + 1], output_hidden_states=True, logits_to_keep=1).hidden_states
                    for i in range(batch)
                ]
                return [torch.cat([p[k] for p in parts]).float() for k in range(len(parts[0]))], []
        finally:
            for hook in hooks:
                hook.remove()

    def worst(a: list, b: list) -> float:
        return max(
            (torch.linalg.norm(x - y) / torch.linalg.norm(x)).item()
            for x, y in zip(a[1:], b[1:], strict=True)
        )

    eager, routes = streams("eager")
    out: dict = {"tokens": float(tokens), "batch": float(batch)}
    out["floor"] = worst(eager, streams("eager", one_at_a_time=True)[0])
    for kernel in kernels:
        other, other_routes = streams(kernel)
        flips = [
            (a != b).any(-1).float().mean().item()
            for a, b in zip(routes, other_routes, strict=True)
        ]
        out[kernel] = {
            "worst": worst(eager, other),
            "flips": sum(flips) / max(1, len(flips)),
            "flips_block0": flips[0] if flips else float("nan"),
        }
    model.set_attn_implementation("eager")
    return out


def patching_memory(model, tokenizer, device: str, lengths: tuple[int, ...]) -> list[dict]:
    """Patched forward passes (probes/patching's ``patched_logits``) at ``T`` tokens with the
    batch :class:`~goalprobe.probes.patching.experiment.PatchingBudget` plans (at most 16 copies,
    each patched from the middle on, so the first half is a cached prefix): the measured peak
    beside the planned one (weights plus :func:`~goalprobe.activations.plan.patched_run_bytes`)."""
    import torch
    from goalprobe.activations.capture import Patch, make_backend
    from goalprobe.probes.patching.experiment import PatchingBudget

    budget = PatchingBudget.for_model(model, device)
    backend = make_backend("nnsight", model, tokenizer)
    rows = []
    for tokens in lengths:
        ids = torch.randint(0, model.config.vocab_size, (tokens,)).numpy()
        start = tokens // 2 if backend.prefix_cache else 0
        batch = budget.patched_batch(start, tokens - start, 16)
        planned = budget.weights_bytes + budget.patched_bytes(batch, start, tokens - start)
        values = torch.zeros(1, 1, model.config.hidden_size)
        patches = [Patch((0,), torch.tensor([tokens // 2]), values) for _ in range(batch)]
        _reset_peak(device)
        try:
            backend.patched_logits(ids, patches)
            peak = _peak_gb(device)
        except torch.OutOfMemoryError:
            peak = float("inf")
        rows.append(
            {"tokens": tokens, "batch": batch, "planned_gb": planned / 1e9, "peak_gb": peak}
        )
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def blocks_that_fit(device: str, wanted: int, tiny: bool) -> int:
    """Blocks whose bf16 weights (with embeddings and head) leave a third of the card free."""
    from goalprobe.activations.plan import GPT_OSS_20B, device_memory_bytes

    if tiny or not device.startswith("cuda"):
        return wanted
    memory = device_memory_bytes(device)
    total = GPT_OSS_20B.weight_bytes(mxfp4=False)
    per_block = (total - 2 * GPT_OSS_20B.vocab_size * GPT_OSS_20B.d_model * 2) / 24
    fixed = total - 24 * per_block
    return max(1, min(wanted, int((memory * 2 / 3 - fixed) // per_block)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--blocks", type=int, default=24, help="blocks to build (most that fit)")
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions (CPU smoke mode)")
    parser.add_argument("--lengths", default="500,1000,2000,4000", help="replayed T values")
    parser.add_argument("--steps", type=int, default=8, help="synthetic steps per T")
    parser.add_argument("--conversations", type=int, default=8, help="rollout conversations")
    parser.add_argument("--new-tokens", type=int, default=64, help="new tokens per rollout step")
    parser.add_argument("--mxfp4-blocks", type=int, default=4, help="blocks of the MXFP4 model")
    parser.add_argument("--no-mxfp4", action="store_true", help="skip the MXFP4 measurement")
    parser.add_argument("--tokenizer", default=None, help="a saved o200k_harmony tokenizer dir")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown here")
    parser.add_argument(
        "--attn-implementation",
        default="eager",
        choices=("eager", "flex_attention", "flex_fp32_sinks"),
        help="attention of the extraction (flex_attention: CUDA only)",
    )
    parser.add_argument(
        "--kernel-lengths",
        default=None,
        help="replayed T values of the fp32-LSE flex kernel's extraction (default on CUDA "
        "500,2000,4000,8000,16000; on CPU none; '' to skip)",
    )
    parser.add_argument(
        "--patching-lengths",
        default=None,
        help="T of the patching memory check (default on CUDA 1000,2000,4000; on CPU none)",
    )
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if args.kernel_lengths is None:
        args.kernel_lengths = "500,2000,4000,8000,16000" if cuda else ""
    if args.patching_lengths is None:
        args.patching_lengths = "1000,2000,4000" if cuda else ""
    for name in ("lengths", "kernel_lengths", "patching_lengths"):
        text = getattr(args, name)
        try:
            setattr(args, name, tuple(int(x) for x in text.split(",") if x.strip()))
        except ValueError:
            parser.error(f"--{name.replace('_', '-')} {text!r}: expected comma-separated integers")
    if not args.lengths or min((*args.lengths, *args.kernel_lengths)) < 64:
        parser.error("--lengths: every T must be >= 64 (a prompt is several hundred tokens)")
    if args.blocks < 1 or args.steps < 1 or args.conversations < 1 or args.new_tokens < 1:
        parser.error("--blocks, --steps, --conversations and --new-tokens must be >= 1")
    if args.attn_implementation == "flex_attention" and not args.device.startswith("cuda"):
        parser.error("--attn-implementation flex_attention needs CUDA (GPT-OSS's sinks)")
    if args.device.startswith("cpu") and not args.tiny:
        parser.error("--device cpu needs --tiny (the real dimensions are for a GPU)")
    return args


def _write_partial(out: Path | None, report: Report, started: float) -> None:
    """Write what is measured so far to ``out`` under an "incomplete" line (a check stopped
    at its time limit still leaves its figures; the final write replaces the file)."""
    if out is None:
        return
    report.seconds = time.perf_counter() - started
    text = "**incomplete: the check was still running when this was written**\n\n"
    out.write_text(text + markdown(report) + "\n", encoding="utf-8")
    print(markdown(report), flush=True)


def main(argv: list[str] | None = None) -> Report:
    args = parse_args(argv)
    started = time.perf_counter()
    import torch
    from goalprobe.activations.plan import loaded_weights_bytes, mxfp4_status
    from goalprobe.agents.attention import FLEX_FP32_SINKS, register

    from goalprobe.version import software_versions

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device (use --device cpu --tiny for the smoke mode)")
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    tokenizer = load_o200k(args.tokenizer)
    blocks = blocks_that_fit(args.device, args.blocks, args.tiny)
    model = build_model(tokenizer, blocks, tiny=args.tiny, dtype=dtype, device=args.device)
    status = mxfp4_status()
    report = Report(
        device=name,
        dtype=str(dtype).removeprefix("torch."),
        blocks=blocks,
        blocks_wanted=args.blocks,
        weights_gb=loaded_weights_bytes(model, args.device) / 1e9,
        versions=software_versions(),
        mxfp4="available" if status.available else f"not available ({status.reason})",
        attention=args.attn_implementation,
    )
    report.rollout = rollout_steps(
        model, tokenizer, args.device, args.conversations, args.new_tokens
    )
    _write_partial(args.out, report, started)
    attn = args.attn_implementation
    kernels = ("flex_attention", FLEX_FP32_SINKS) if args.device.startswith("cuda") else ()
    tokens = 1_000 if args.device.startswith("cuda") else 128
    report.agreement = attention_agreement(
        model, args.device, kernels or (FLEX_FP32_SINKS,), tokens=tokens
    )
    print(f"kernels vs eager attention: {report.agreement}", flush=True)
    if args.patching_lengths:
        report.patching = patching_memory(model, tokenizer, args.device, args.patching_lengths)
        _write_partial(args.out, report, started)
    register(attn)
    model.set_attn_implementation(attn)
    with tempfile.TemporaryDirectory() as work:
        for target in args.lengths:
            report.extraction.append(
                extraction_at(model, tokenizer, args.device, target, args.steps, Path(work), attn)
            )
            _write_partial(args.out, report, started)
        if args.kernel_lengths:  # the fp32-LSE flex kernel, up to long reasoning
            register(FLEX_FP32_SINKS)
            model.set_attn_implementation(FLEX_FP32_SINKS)
            report.kernel = FLEX_FP32_SINKS
            kernel_work = Path(work) / FLEX_FP32_SINKS  # its own stores
            kernel_work.mkdir()
            for target in args.kernel_lengths:
                report.kernel_extraction.append(
                    extraction_at(
                        model, tokenizer, args.device, target, args.steps, kernel_work,
                        FLEX_FP32_SINKS,
                    )
                )  # fmt: skip
                _write_partial(args.out, report, started)
            model.set_attn_implementation(attn)
        if status.available and not args.no_mxfp4 and not args.tiny:
            del model
            torch.cuda.empty_cache()
            model = mxfp4_model(tokenizer, args.mxfp4_blocks, args.device, Path(work))
            model.set_attn_implementation(attn)
            report.mxfp4 += f"; {args.mxfp4_blocks} blocks reloaded through the MXFP4 quantizer"
            for target in args.lengths:
                report.mxfp4_extraction.append(
                    extraction_at(
                        model, tokenizer, args.device, target, args.steps, Path(work), attn
                    )
                )
                _write_partial(args.out, report, started)
    report.seconds = time.perf_counter() - started
    text = markdown(report)
    print(text)
    print(json.dumps({"report": report.__dict__}, default=str))
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return report


def mxfp4_model(tokenizer, blocks: int, device: str, work: Path):
    """A random bf16 model of ``blocks`` blocks saved and reloaded with transformers' MXFP4
    quantizer (quantised on load), as a checkpoint in MXFP4 would be kept."""
    import torch
    from transformers import AutoModelForCausalLM, Mxfp4Config

    model = build_model(tokenizer, blocks, tiny=False, dtype=torch.bfloat16, device=device)
    model.save_pretrained(work / "mxfp4-src")
    del model
    torch.cuda.empty_cache()
    return AutoModelForCausalLM.from_pretrained(
        work / "mxfp4-src",
        quantization_config=Mxfp4Config(),
        dtype=torch.bfloat16,
        device_map=device,
    ).eval()


if __name__ == "__main__":
    main()
