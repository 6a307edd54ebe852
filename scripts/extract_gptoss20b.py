"""GPU job: extract GPT-OSS-20B's residual stream (blocks 7, 15, 23) for a trajectory file.

One A100/H100 (80 GB) holds the model: transformers keeps the checkpoint's MXFP4 expert
weights (~13 GB) where its MXFP4 kernels run (``triton>=3.4`` and ``kernels``, Hopper-class
GPUs) and otherwise dequantises them to bf16 (~42 GB; ``--dequantize`` forces this). The
script prints a memory estimate and picks the largest batch size that fits (or checks yours),
then runs ``activations.extract.extract`` with the nnsight backend: resumable (rerun the same
command after a preemption, even SIGKILL) and shardable (``--shard i/N``, see
``scripts/slurm_extract_array.sh``; join with ``goalprobe merge``).

Examples::

    python scripts/extract_gptoss20b.py runs/gptoss/trajectories.jsonl --out runs/gptoss/acts.h5
    python scripts/extract_gptoss20b.py traj.jsonl --out acts_3.h5 --shard 3/8 --batch-size 4
    python scripts/extract_gptoss20b.py traj.jsonl --out acts.h5 --dry-run --gpu-memory-gb 80
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
    from activations.agent.trajectories import read_steps

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trajectories", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shard", default="0/1", help="i/N (grids hashed into N shards)")
    parser.add_argument("--layers", default=",".join(map(str, LAYERS)))
    parser.add_argument("--batch-size", type=int, default=None, help="default: largest that fits")
    parser.add_argument("--rows-per-part", type=int, default=256)
    parser.add_argument("--compression", default="none", choices=("none", "lzf", "gzip"))
    parser.add_argument("--grid-cells", action="store_true")
    parser.add_argument("--revision", default="")
    parser.add_argument("--dequantize", action="store_true", help="force bf16 expert weights")
    parser.add_argument("--gpu-memory-gb", type=float, default=None, help="override detection")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, load nothing")
    args = parser.parse_args()

    import torch

    shape = GptOssShape()
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
        "gpu": gpu_name,
        "gpu_memory_gb": round(gpu_gb, 1),
        "weights": "bf16 (dequantised)" if weights_gb == shape.bf16_weight_gb else "MXFP4",
        "weights_gb": weights_gb,
        "steps": len(lengths),
        "tokens_per_step_mean": round(sum(lengths) / max(1, len(lengths))),
        "tokens_per_step_max": max(lengths, default=0),
        "batch_size": batch,
        "estimated_peak_gb": round(estimate, 1),
        "store_gb_estimate": round(
            len(lengths) * 2 * len(args.layers.split(",")) * 3 * shape.d_model * 2 / 1e9, 2
        ),
    }
    print(json.dumps(plan, indent=2))
    if estimate > 0.95 * gpu_gb:
        print(f"warning: batch size {batch} is estimated to need {estimate:.1f} GB of {gpu_gb:.1f}")
    if args.dry_run:
        return

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from activations.capture import make_backend
    from activations.extract import ExtractConfig, extract

    kwargs = {"revision": args.revision} if args.revision else {}
    load = {"dtype": torch.bfloat16, "device_map": "auto", **kwargs}
    if args.dequantize:
        from transformers import Mxfp4Config

        load["quantization_config"] = Mxfp4Config(dequantize=True)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_ID, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(MODEL_ID, **load).eval()
    print(f"loaded {MODEL_ID}: {torch.cuda.memory_allocated() / 1e9:.1f} GB allocated")
    capture = make_backend(
        "nnsight", model, tokenizer, model_id=MODEL_ID, revision=args.revision or None
    )
    config = ExtractConfig(
        layers=tuple(int(x) for x in args.layers.split(",")),
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
        model_id=MODEL_ID,
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
