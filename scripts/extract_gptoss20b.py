"""GPU job: extract GPT-OSS-20B's residual stream (blocks 7, 15, 23) for a trajectory file.

One A100/H100 (80 GB) holds the model: transformers keeps the checkpoint's MXFP4 expert
weights (~13.8 GB) where its MXFP4 kernels run and otherwise dequantises them to bf16 (~41.8 GB;
``--dequantize`` forces this). Which one happens is asked of the installed transformers
(:func:`goalprobe.activations.plan.mxfp4_status`: a CUDA GPU of compute capability >= 7.5,
``triton >= 3.4``, the ``kernels`` package and ``accelerate``; ``pip install -e '.[gpu]'``
installs them), and the plan says why when it would dequantise. The script plans the batches
from the *replayed* lengths (each step up to its last anchor, not its whole generation;
:mod:`goalprobe.activations.plan`), prints the plan, then runs
``goalprobe.activations.extract.extract`` with the nnsight backend: resumable (rerun the same
command after a preemption, even SIGKILL) and shardable (``--shard i/N``, see
``scripts/slurm_extract_array.sh``; join with ``goalprobe merge``).

``--model`` takes the hub id (default ``openai/gpt-oss-20b``) or a local model directory (a
downloaded checkpoint, or the tiny random GPT-OSS of ``scripts/gptoss_tokenizer.py``); for a
directory the plan reads its ``config.json`` (dimensions, default layers), and nothing is
downloaded. The replayed lengths need the tokenizer's harmony ids: ``--tokenizer`` (default:
the model's).

Memory model (:func:`goalprobe.activations.plan.activation_bytes`): weights plus one batch's
activations must fit in 85% of the GPU's memory less 1.5 GB of CUDA context. Eager attention's
scores (``3 x batch x 64 heads x T x (T + 1)`` bf16) dominate: per sequence about 0.08 GB at
T = 400 replayed tokens, 0.43 GB at 1,000, 1.6 GB at 2,000 and 6.4 GB at 4,000. Batches are
limited by a token budget (``max_batch_tokens``) chosen at the longest replayed step, so short
steps go many at a time.

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
from dataclasses import replace
from pathlib import Path

MODEL_ID = "openai/gpt-oss-20b"
LAYERS = (7, 15, 23)
"""The study's blocks (section 5): early, middle, last of 24."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trajectories", type=Path)
    parser.add_argument(
        "--model", default=MODEL_ID, help=f"hub id or local model directory (default {MODEL_ID})"
    )
    parser.add_argument("--tokenizer", default=None, help="default: the model's")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shard", default="0/1", help="i/N (grids hashed into N shards)")
    parser.add_argument("--layers", default=None, help="default: the study's 7,15,23 (thirds)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the plan's")
    parser.add_argument("--rows-per-part", type=int, default=256)
    parser.add_argument("--compression", default="none", choices=("none", "lzf", "gzip"))
    parser.add_argument("--grid-cells", action="store_true")
    parser.add_argument("--revision", default="")
    parser.add_argument("--dequantize", action="store_true", help="force bf16 expert weights")
    parser.add_argument("--gpu-memory-gb", type=float, default=None, help="override detection")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, load no model")
    parser.add_argument(
        "--attn-implementation",
        default="eager",
        choices=("eager", "flex_attention", "flex_fp32_sinks"),
        help="flex_fp32_sinks / flex_attention: memory linear in T, for 8-16k-token reasoning "
        "(CUDA); flex_fp32_sinks keeps the log-sum-exp and the sinks in fp32",
    )
    args = parser.parse_args(argv)

    import torch
    from goalprobe.activations.extract import ExtractConfig, default_layers
    from goalprobe.activations.plan import (
        GPT_OSS_20B,
        ExtractionDoesNotFitError,
        ModelShape,
        activation_bytes,
        mxfp4_status,
        plan_extraction,
        planned_attention,
        replay_lengths,
        require_fits,
    )
    from goalprobe.agents.models import load_tokenizer, model_commit
    from goalprobe.agents.trajectories import read_steps

    local = Path(args.model).expanduser()
    if local.exists() and not (local / "config.json").is_file():
        raise SystemExit(f"error: {local} holds no config.json; not a model directory")
    shape = ModelShape.from_model_dir(local) if local.is_dir() else GPT_OSS_20B
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
    status = mxfp4_status()
    if local.is_dir():  # only a checkpoint stored in MXFP4 has MXFP4 weights to keep
        stored = json.loads((local / "config.json").read_text(encoding="utf-8"))
        if (stored.get("quantization_config") or {}).get("quant_method") != "mxfp4":
            status = replace(status, available=False, reason="the checkpoint is not MXFP4")
    kernel = ""
    if status.available and not args.dequantize:  # transformers downloads it only at load time
        from goalprobe.activations.compute import mxfp4_kernel_check

        loads, kernel = mxfp4_kernel_check()
        if not loads:
            status = replace(status, available=False, reason=kernel)
    mxfp4 = status.available and not args.dequantize
    weights = shape.weight_bytes(mxfp4=mxfp4)
    config = ExtractConfig(
        layers=layers,
        grid_cells=args.grid_cells,
        rows_per_part=args.rows_per_part,
        compression=args.compression,
        shard=args.shard,
    )
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    lengths = replay_lengths(args.trajectories, tokenizer, config)
    recorded = [
        len(s.prompt_token_ids) + len(s.generated_token_ids) for s in read_steps(args.trajectories)
    ]
    planned = plan_extraction(
        lengths,
        shape,
        memory_bytes=gpu_gb * 1e9,
        weights_bytes=weights,
        attention=planned_attention(args.attn_implementation, "cuda"),
    )
    batch = args.batch_size or planned.batch_size
    max_tokens = 0 if args.batch_size else planned.max_batch_tokens
    reason = "--dequantize" if args.dequantize else status.reason
    plan = {
        "model": args.model,
        "n_params": sum(shape.parameters().values()),
        "layers": list(layers),
        "d_model": shape.d_model,
        "gpu": gpu_name,
        "gpu_memory_gb": round(gpu_gb, 1),
        "weights": "MXFP4" if mxfp4 else f"bf16 (dequantised: {reason})",
        "weights_gb": round(weights / 1e9, 1),
        "mxfp4_kernel": kernel or None,
        "steps": len(lengths),
        "replayed_tokens_mean": round(sum(lengths) / max(1, len(lengths))),
        "replayed_tokens_max": max(lengths, default=0),
        "recorded_tokens_max": max(recorded, default=0),
        "attn_implementation": args.attn_implementation,
        "fits": planned.fits,
        "batch_size": batch,
        "max_batch_tokens": max_tokens,
        "estimated_peak_gb": round(planned.peak_gb, 1),
        "store_gb_estimate": round(len(lengths) * 2 * len(layers) * 3 * shape.d_model * 2 / 1e9, 2),
    }
    estimate = planned.peak_gb
    if args.batch_size:  # checked, not changed
        activations = activation_bytes(shape, batch, planned.longest, attention=planned.attention)
        estimate = (weights + activations) / 1e9
        plan["estimated_peak_gb"] = round(estimate, 1)
    print(json.dumps(plan, indent=2))
    try:
        require_fits(planned, shape)
    except ExtractionDoesNotFitError as err:
        raise SystemExit(f"error: {err}") from None
    if estimate > 0.95 * gpu_gb:
        print(f"warning: batch size {batch} is estimated to need {estimate:.1f} GB of {gpu_gb:.1f}")
    if args.dry_run:
        return

    from goalprobe.activations.capture import make_backend
    from goalprobe.activations.extract import extract
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_id = args.model
    if local.is_dir():
        model_id, kwargs = str(local), {"local_files_only": True}
    else:
        kwargs = {"revision": args.revision} if args.revision else {}
    load = {
        "dtype": torch.bfloat16,
        "device_map": "auto",
        "attn_implementation": args.attn_implementation,
        **kwargs,
    }
    if args.dequantize:
        from transformers import Mxfp4Config

        load["quantization_config"] = Mxfp4Config(dequantize=True)
    from goalprobe.agents.attention import register

    register(args.attn_implementation)  # goalprobe's own kernels (flex_fp32_sinks)
    tokenizer = AutoTokenizer.from_pretrained(model_id, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(model_id, **load).eval()
    from goalprobe.activations.compute import weights_format
    from goalprobe.activations.plan import loaded_weights_bytes

    loaded = loaded_weights_bytes(model, "cuda")  # MXFP4 Triton tensors included
    print(
        f"loaded {model_id}: weights {weights_format(model)}, {loaded / 1e9:.1f} GB allocated "
        f"(planned {weights / 1e9:.1f})"
    )
    if not args.batch_size:  # replan from what the weights actually take
        planned = plan_extraction(
            lengths,
            shape,
            memory_bytes=gpu_gb * 1e9,
            weights_bytes=loaded,
            attention=planned.attention,
        )
        try:
            require_fits(planned, shape)
        except ExtractionDoesNotFitError as err:
            raise SystemExit(f"error: {err}") from None
        batch, max_tokens, estimate = planned.batch_size, planned.max_batch_tokens, planned.peak_gb
    capture = make_backend(
        "nnsight", model, tokenizer, model_id=args.model, revision=args.revision or None
    )
    config = replace(config, batch_size=batch, max_batch_tokens=max_tokens)
    report = extract(
        args.trajectories,
        args.out,
        capture,
        tokenizer,
        config,
        model_id=args.model,
        model_revision=args.revision or model_commit(args.model),
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
