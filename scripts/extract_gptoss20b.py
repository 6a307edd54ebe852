"""GPU job: extract GPT-OSS-20B's residual stream (blocks 7, 15, 23) for a trajectory file.

One A100/H100 (80 GB) holds the model: transformers keeps the checkpoint's MXFP4 expert
weights (~13 GB) where its MXFP4 kernels run (``triton>=3.4`` and ``kernels``, Hopper-class
GPUs) and otherwise dequantises them to bf16 (~42 GB; ``--dequantize`` forces this). The
script prints a memory estimate and picks the largest batch size that fits (or checks yours),
then runs ``goalprobe.activations.extract.extract`` with the nnsight backend: resumable (rerun the same
command after a preemption, even SIGKILL) and shardable (``--shard i/N``, see
``scripts/slurm_extract_array.sh``; join with ``goalprobe merge``).

``--model`` takes the hub id (default ``openai/gpt-oss-20b``) or a local model directory (a
downloaded checkpoint, or the tiny random GPT-OSS of ``scripts/gptoss_tokenizer.py``); for a
directory the plan reads its ``config.json`` and weight files (dimensions, default layers,
weight memory), and nothing is downloaded.

Memory model (:func:`activation_gb`, :func:`plan_batch`): weights (GPT-OSS-20B: MXFP4 13.8 GB,
bf16 41.8 GB) plus one batch's activations must fit in 85% of the GPU's memory less 1.5 GB of
CUDA context. Eager attention's scores (``batch x 64 heads x T x (T + 1)``, fp32 + bf16)
dominate the activations: per sequence about 0.17 GB at T = 500 tokens, 0.52 GB at 1,000,
1.8 GB at 2,000 and 6.7 GB at 4,000. On an 80 GB card the plan picks batch 64 / 16 / 4 for
T = 1,000 / 2,000 / 4,000 with MXFP4 weights and 32 / 8 / 2 with bf16 ones. A 40 GB card
cannot hold the bf16 weights (the plan warns).

Examples::

    python scripts/extract_gptoss20b.py runs/gptoss/trajectories.jsonl --out runs/gptoss/acts.h5
    python scripts/extract_gptoss20b.py traj.jsonl --out acts_3.h5 --shard 3/8 --batch-size 4
    python scripts/extract_gptoss20b.py traj.jsonl --out acts.h5 --dry-run --gpu-memory-gb 80
    python scripts/extract_gptoss20b.py traj.jsonl --out acts.h5 --model /data/gpt-oss-20b
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

MODEL_ID = "openai/gpt-oss-20b"
LAYERS = (7, 15, 23)
"""The study's blocks (section 5): early, middle, last of 24."""


@dataclass(frozen=True)
class GptOssShape:
    """GPT-OSS-20B's dimensions (its ``config.json``)."""

    n_params: float = 20.9e9
    n_layers: int = 24
    d_model: int = 2880
    n_heads: int = 64
    n_kv_heads: int = 8
    head_dim: int = 64
    n_experts: int = 32
    experts_per_token: int = 4
    expert_width: int = 2880
    mxfp4_weight_gb: float = 13.8
    bf16_weight_gb: float = 41.8

    @classmethod
    def from_model_dir(cls, directory: Path) -> GptOssShape:
        """The shape of a local GPT-OSS checkpoint: dimensions from its ``config.json``; the
        stored weights are the ``*.safetensors`` bytes, bf16 weights 2 bytes per parameter."""
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        d, n_layers = config["hidden_size"], config["num_hidden_layers"]
        heads, kv, hd = (
            config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")
        )
        experts, width = config["num_local_experts"], config["intermediate_size"]
        # q, k, v, o with biases, attention sinks; experts' gate_up and down with biases and
        # the router; two RMSNorms per block, one final
        attention = (d + 1) * (heads + 2 * kv) * hd + (heads * hd + 1) * d + heads
        moe = experts * ((d + 1) * 2 * width + (width + 1) * d) + (d + 1) * experts
        embeddings = config["vocab_size"] * d * (1 if config.get("tie_word_embeddings") else 2)
        n_params = n_layers * (attention + moe + 2 * d) + d + embeddings
        stored = sum(f.stat().st_size for f in directory.glob("*.safetensors")) / 1e9
        return cls(
            n_params=float(n_params), n_layers=n_layers, d_model=d, n_heads=heads,
            n_kv_heads=kv, head_dim=hd, n_experts=experts,
            experts_per_token=config["num_experts_per_tok"], expert_width=width,
            mxfp4_weight_gb=stored, bf16_weight_gb=n_params * 2 / 1e9,
        )  # fmt: skip


def activation_gb(shape: GptOssShape, batch: int, tokens: int) -> float:
    """Peak activation memory (GB) of one batch forward, eager attention, no KV cache kept.

    The eager attention of one block holds ``batch x heads x T x (T + 1)`` fp32 scores plus
    their bf16 probabilities; the MoE block holds the routed tokens' expert activations; a few
    residual-width tensors are live at once.
    """
    scores = batch * shape.n_heads * tokens * (tokens + 1) * (4 + 2)
    moe = batch * tokens * shape.experts_per_token * 2 * shape.expert_width * 2 * 2
    residual = 8 * batch * tokens * shape.d_model * 2
    return (scores + moe + residual) / 1e9


def sequence_lengths(trajectories: Path) -> list[int]:
    """Recorded prompt + generated length of every step of finished episodes."""
    from goalprobe.agents.trajectories import read_steps

    return [len(s.prompt_token_ids) + len(s.generated_token_ids) for s in read_steps(trajectories)]


def plan_batch(
    shape: GptOssShape, lengths: list[int], gpu_gb: float, weights_gb: float, wanted: int | None
):
    """``(batch_size, estimate_gb)`` for the longest sequence; ``wanted`` is checked, not changed."""
    longest = max(lengths) if lengths else 1
    budget = 0.85 * gpu_gb - weights_gb - 1.5  # CUDA context, allocator slack
    if wanted is not None:
        return wanted, weights_gb + activation_gb(shape, wanted, longest)
    batch = 1
    while batch < 64 and activation_gb(shape, batch * 2, longest) <= budget:
        batch *= 2
    return batch, weights_gb + activation_gb(shape, batch, longest)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trajectories", type=Path)
    parser.add_argument(
        "--model", default=MODEL_ID, help=f"hub id or local model directory (default {MODEL_ID})"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shard", default="0/1", help="i/N (grids hashed into N shards)")
    parser.add_argument("--layers", default=None, help="default: the study's 7,15,23 (thirds)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: largest that fits")
    parser.add_argument("--rows-per-part", type=int, default=256)
    parser.add_argument("--compression", default="none", choices=("none", "lzf", "gzip"))
    parser.add_argument("--grid-cells", action="store_true")
    parser.add_argument("--revision", default="")
    parser.add_argument("--dequantize", action="store_true", help="force bf16 expert weights")
    parser.add_argument("--gpu-memory-gb", type=float, default=None, help="override detection")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, load nothing")
    args = parser.parse_args(argv)

    import torch
    from goalprobe.activations.extract import default_layers

    local = Path(args.model).expanduser()
    if local.exists() and not (local / "config.json").is_file():
        raise SystemExit(f"error: {local} holds no config.json; not a model directory")
    shape = GptOssShape.from_model_dir(local) if local.is_dir() else GptOssShape()
    if args.layers is None:
        layers = default_layers(shape.n_layers)
    else:
        layers = tuple(int(x) for x in args.layers.split(","))
    if any(not 0 <= x < shape.n_layers for x in layers):
        raise SystemExit(f"error: --layers {layers} outside the model's {shape.n_layers} blocks")
    if args.gpu_memory_gb is not None:
        gpu_gb, gpu_name = args.gpu_memory_gb, "(given)"
    elif torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu_gb, gpu_name = props.total_memory / 1e9, props.name
    else:
        raise SystemExit("no CUDA device; pass --gpu-memory-gb with --dry-run to plan only")
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] >= 9
    weights_gb = shape.bf16_weight_gb if args.dequantize or not hopper else shape.mxfp4_weight_gb
    lengths = sequence_lengths(args.trajectories)
    batch, estimate = plan_batch(shape, lengths, gpu_gb, weights_gb, args.batch_size)
    plan = {
        "model": args.model,
        "n_params": shape.n_params,
        "layers": list(layers),
        "d_model": shape.d_model,
        "gpu": gpu_name,
        "gpu_memory_gb": round(gpu_gb, 1),
        "weights": "bf16 (dequantised)" if weights_gb == shape.bf16_weight_gb else "MXFP4",
        "weights_gb": weights_gb,
        "steps": len(lengths),
        "tokens_per_step_mean": round(sum(lengths) / max(1, len(lengths))),
        "tokens_per_step_max": max(lengths, default=0),
        "batch_size": batch,
        "estimated_peak_gb": round(estimate, 1),
        "store_gb_estimate": round(len(lengths) * 2 * len(layers) * 3 * shape.d_model * 2 / 1e9, 2),
    }
    print(json.dumps(plan, indent=2))
    if estimate > 0.95 * gpu_gb:
        print(f"warning: batch size {batch} is estimated to need {estimate:.1f} GB of {gpu_gb:.1f}")
    if args.dry_run:
        return

    from goalprobe.activations.capture import make_backend
    from goalprobe.activations.extract import ExtractConfig, extract
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_id = args.model
    if local.is_dir():
        model_id, kwargs = str(local), {"local_files_only": True}
    else:
        kwargs = {"revision": args.revision} if args.revision else {}
    load = {"dtype": torch.bfloat16, "device_map": "auto", **kwargs}
    if args.dequantize:
        from transformers import Mxfp4Config

        load["quantization_config"] = Mxfp4Config(dequantize=True)
    tokenizer = AutoTokenizer.from_pretrained(model_id, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(model_id, **load).eval()
    print(f"loaded {model_id}: {torch.cuda.memory_allocated() / 1e9:.1f} GB allocated")
    capture = make_backend(
        "nnsight", model, tokenizer, model_id=args.model, revision=args.revision or None
    )
    config = ExtractConfig(
        layers=layers,
        grid_cells=args.grid_cells,
        batch_size=batch,
        rows_per_part=args.rows_per_part,
        compression=args.compression,
        shard=args.shard,
    )
    report = extract(
        args.trajectories,
        args.out,
        capture,
        tokenizer,
        config,
        model_id=args.model,
        model_revision=args.revision,
        progress=True,
    )
    peak = torch.cuda.max_memory_allocated() / 1e9
    print(
        f"{report.output}: {report.rows} rows in {report.seconds / 60:.1f} min "
        f"({report.parts_computed} parts computed, {report.parts_reused} reused); "
        f"peak GPU memory {peak:.1f} GB (estimated {estimate:.1f}); "
        f"{report.rows / max(report.seconds, 1e-9):.2f} steps/s"
    )
    if math.isfinite(peak) and peak > estimate * 1.3:
        print("note: the memory estimate was low; lower --batch-size for longer trajectories")


if __name__ == "__main__":
    main()
