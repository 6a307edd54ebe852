"""Train the bundled agent (a small GPT-OSS) from a seed, evaluate it and write its model card.

Usage::

    python scripts/train_default_agent.py                      # train + evaluate (CPU)
    python scripts/train_default_agent.py --device cuda        # minutes on a GPU
    python scripts/train_default_agent.py --eval-only          # re-evaluate the saved agent

Writes ``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer files,
``training_log.json``, ``evaluation.json`` and ``MODEL_CARD.md`` into ``--out`` (default: the
packaged ``activations/agent/bundled``). Progress goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from activations.agent.bundled import BUNDLED_AGENT_DIR, load_bundled_agent
from activations.agent.evaluation import (
    EvaluationConfig,
    evaluate_agent,
    heldout_grids,
    quality_table_markdown,
)
from activations.agent.local_backend import LocalBackend
from activations.agent.tokenizer import build_tokenizer
from activations.agent.training import (
    BundledModelConfig,
    TrainingConfig,
    TrainingDataConfig,
    build_model,
    train,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = TrainingConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUNDLED_AGENT_DIR, help="output directory")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="training seed")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--log-every", type=int, default=25, help="print every N steps")
    parser.add_argument(
        "--checkpoint-every", type=int, default=250, help="save the model every N steps"
    )
    parser.add_argument("--eval-only", action="store_true", help="evaluate the saved agent")
    parser.add_argument("--skip-eval", action="store_true", help="train without evaluating")
    parser.add_argument(
        "--eval-grids-per-cell", type=int, default=EvaluationConfig().grids_per_cell
    )
    parser.add_argument(
        "--eval-episodes-per-grid", type=int, default=EvaluationConfig().episodes_per_grid
    )
    parser.add_argument("--eval-batch-size", type=int, default=EvaluationConfig().batch_size)
    return parser.parse_args(argv)


def save(model, tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def run_training(args: argparse.Namespace, eval_config: EvaluationConfig) -> dict:
    model_config = BundledModelConfig()
    data_config = TrainingDataConfig()
    config = replace(
        TrainingConfig(),
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )
    tokenizer = build_tokenizer()
    model = build_model(model_config, tokenizer, seed=config.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: GptOssForCausalLM, {n_params / 1e6:.2f} M parameters, vocab {len(tokenizer)}")
    print(f"model config: {asdict(model_config)}")
    print(f"training: {asdict(config)}")
    exclude = frozenset(heldout_grids(eval_config))
    print(f"held-out evaluation grids excluded from training: {len(exclude)}", flush=True)

    records: list[dict] = []

    def on_step(record: dict) -> None:
        records.append(record)
        done = record["step"] + 1
        if done % args.log_every == 0 or done == config.steps:
            recent = records[-args.log_every :]
            loss = sum(r["loss"] for r in recent) / len(recent)
            accuracy = sum(r["answer_accuracy"] for r in recent) / len(recent)
            auxiliary = "".join(
                f"  {name.split('_')[0]} {sum(r[name] for r in recent) / len(recent):.4f}"
                for name in ("coordinate_loss", "attention_loss")
                if name in record
            )
            elapsed = record["seconds"]
            eta = elapsed / done * (config.steps - done)
            print(
                f"step {done}/{config.steps}  loss {loss:.4f}{auxiliary}  answer acc {accuracy:.3f}  "
                f"{elapsed:.0f}s elapsed  eta {eta:.0f}s  {record['tokens'] / elapsed:.0f} tokens/s",
                flush=True,
            )
        if args.checkpoint_every and done % args.checkpoint_every == 0:
            save(model, tokenizer, args.out)
            model.train()

    started = time.perf_counter()
    log = train(
        model,
        tokenizer,
        config,
        data_config,
        device=args.device,
        exclude=exclude,
        on_step=on_step,
    )
    seconds = time.perf_counter() - started
    model.to("cpu")
    save(model, tokenizer, args.out)
    info = {
        "model_config": asdict(model_config),
        "training_config": asdict(config),
        "data_config": {k: v for k, v in asdict(data_config).items()},
        "parameters": n_params,
        "training_seconds": seconds,
        "device": str(args.device),
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "final_loss": sum(x["loss"] for x in log[-50:]) / len(log[-50:]),
    }
    (args.out / "training_log.json").write_text(
        json.dumps({"info": info, "log": log}, indent=1), encoding="utf-8"
    )
    print(f"trained in {seconds:.0f}s; saved to {args.out}", flush=True)
    return info


def run_evaluation(args: argparse.Namespace, eval_config: EvaluationConfig) -> dict:
    model, tokenizer = load_bundled_agent(args.device, args.out)
    backend = LocalBackend(model, tokenizer)
    started = time.perf_counter()
    result = evaluate_agent(backend, eval_config, progress=True)
    seconds = time.perf_counter() - started
    result["seconds"] = seconds
    (args.out / "evaluation.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(quality_table_markdown(result))
    print(f"evaluated in {seconds:.0f}s", flush=True)
    return result


def write_model_card(out: Path) -> None:
    from activations.agent.evaluation import model_card_text

    training = json.loads((out / "training_log.json").read_text(encoding="utf-8"))["info"]
    evaluation = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    (out / "MODEL_CARD.md").write_text(model_card_text(training, evaluation), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    eval_config = replace(
        EvaluationConfig(),
        grids_per_cell=args.eval_grids_per_cell,
        episodes_per_grid=args.eval_episodes_per_grid,
        batch_size=args.eval_batch_size,
    )
    if not args.eval_only:
        run_training(args, eval_config)
    if not args.skip_eval:
        run_evaluation(args, eval_config)
        write_model_card(args.out)
        print(f"model card: {args.out / 'MODEL_CARD.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
