"""Benchmark ``goalprobe extract`` on the CPU and print its figures.

1. Trajectories: real rollouts (``run_rollouts`` + ``LocalBackend``) of the bundled agent, or,
   while it is not trained yet, of a random GPT-OSS of the bundled agent's shape.
2. Plain forward: the full model (unembedding included) over every step's full recorded
   sequence (prompt + generated), batched and padded like the extraction batches them.
3. Extraction, per backend: capture only (``compute_rows``: forward + gather + float16) and
   end to end (``extract``: JSONL, labels, parts, HDF5, assembly), each as a ratio of the plain
   forward.
4. The shared-prompt-prefix KV cache (``ResidualBackend.prefix_cache``, the default): capture
   with it against the same backend with ``prefix_cache=False`` on the same rows (asserted equal
   to float16 tolerance), in steps per second.
5. Prompt-only extraction (``ExtractConfig(stages=("pre_reasoning",))``, which replays only the
   prompt) against the full pre + post extraction, in rows per second.
6. HDF5 write throughput of the store with and without compression (GPT-OSS-20B width).

Every ratio comes from interleaved pairs measured in one run: for each comparison ``B / A``,
each round runs A then B back to back (one warm-up round first), and the script prints the
median of the per-round ratios with their min - max, so that load from other processes hits
both sides alike. Absolute times are medians too.

Usage::

    python scripts/bench_extract.py [--grids-per-cell 1] [--batch-size 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def load_agent():
    """``(model, tokenizer, description)``: the bundled agent, else its untrained shape."""
    from goalprobe.agents.bundled import load_bundled_agent

    try:
        model, tokenizer = load_bundled_agent()
        return model, tokenizer, "bundled agent (trained weights)"
    except FileNotFoundError:
        from goalprobe.agents.bundled import BundledModelConfig, gpt_oss_config
        from goalprobe.agents.tokenizer import build_tokenizer
        from transformers import GptOssForCausalLM

        tokenizer = build_tokenizer()
        torch.manual_seed(0)
        model = GptOssForCausalLM(gpt_oss_config(BundledModelConfig(), tokenizer)).eval()
        return model, tokenizer, "random GPT-OSS of the bundled agent's shape (agent not trained)"


def make_trajectories(model, tokenizer, path: Path, grids_per_cell: int, max_new_tokens: int):
    from goalprobe.agents.local_backend import LocalBackend
    from goalprobe.agents.rollout import RolloutConfig, run_rollouts
    from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set

    grids = generate_grid_set(
        GridSetConfig(sizes=(7, 9, 11), densities=(0.2, 0.6), n_per_cell=grids_per_cell, seed=0)
    )
    config = RolloutConfig(
        episodes_per_grid=1,
        retries=0,
        horizon_steps=6,
        batch_size=8,
        temperature=0.0,
        max_new_tokens=max_new_tokens,
    )
    run_rollouts(grids, LocalBackend(model, tokenizer), config, path, progress=False)


def interleaved(pairs: dict, repeats: int) -> dict:
    """``{name: (seconds of A, seconds of B)}`` lists over ``repeats`` rounds, after one warm-up.

    ``pairs`` maps a name to two callables ``(a, b)``; every round runs each pair's ``a`` then
    its ``b`` back to back, so each ratio ``b / a`` compares runs made under the same load.
    """
    for a, b in pairs.values():
        a()
        b()
    out: dict = {name: [] for name in pairs}
    for _ in range(repeats):
        for name, (a, b) in pairs.items():
            times = []
            for fn in (a, b):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            out[name].append(tuple(times))
    return out


def ratio_text(times: list[tuple[float, float]], invert: bool = False) -> str:
    """``median (min - max)`` of the per-round ratios ``b / a`` (``a / b`` with ``invert``)."""
    ratios = [(a / b) if invert else (b / a) for a, b in times]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f} - {max(ratios):.2f})"


def median_s(times: list[tuple[float, float]], side: int) -> float:
    return statistics.median(t[side] for t in times)


def plain_forward(model, steps, batch_size: int, pad_id: int) -> None:
    """The full model over every full recorded sequence (the baseline)."""
    from goalprobe.activations.capture.base import TokenBatch

    seqs = sorted(
        ([*s.prompt_token_ids, *s.generated_token_ids] for s in steps), key=len, reverse=True
    )
    with torch.inference_mode():
        for start in range(0, len(seqs), batch_size):
            chunk = seqs[start : start + batch_size]
            batch = TokenBatch.from_sequences(chunk, [[0]] * len(chunk), pad_id=pad_id)
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)


def shared_prefix_tokens(rows, config) -> int:
    """Tokens every row shares before its first read position (what the prefix cache saves)."""
    from goalprobe.activations.capture.base import ResidualBackend, TokenBatch

    batch = TokenBatch.from_sequences(
        [r.token_ids.tolist() for r in rows],
        [np.concatenate([r.positions[s] for s in config.all_stages]).tolist() for r in rows],
    )
    return ResidualBackend.shared_prefix_length(batch)


def dummy_labels(n: int, start: int) -> dict[str, np.ndarray]:
    """Labels of the right dtypes and shapes (zeros; ids count up from ``start``)."""
    from goalprobe.activations.store.schema import LABEL_FIELDS

    out = {}
    for name, spec in LABEL_FIELDS.items():
        if spec.dtype is str:
            out[name] = np.asarray(["bench"] * n, dtype=object)
        else:
            out[name] = np.zeros((n, *spec.shape), dtype=spec.dtype)
    out["step_index"] = np.arange(start, start + n, dtype=np.int64)
    return out


def hdf5_throughput(rows: int, d_model: int, compression: str, directory: Path):
    """``(MB/s of activation bytes written, file MB / raw MB)`` for one store."""
    from goalprobe.activations.store.writer import RowBatch, StoreLayout, StoreWriter

    layout = StoreLayout(("pre_reasoning", "post_reasoning"), (7, 15, 23), d_model)
    rng = np.random.default_rng(0)
    block = 64
    batches = []
    for start in range(0, rows, block):
        n = min(block, rows - start)
        acts = {
            s: {
                x: (rng.standard_normal((n, 3, d_model)) * 2).astype(np.float16)
                for x in layout.layers
            }
            for s in layout.stages
        }
        batches.append(
            RowBatch(
                acts=acts,
                positions={s: np.zeros((n, 3), np.int32) for s in layout.stages},
                present={s: np.ones(n, bool) for s in layout.stages},
                labels=dummy_labels(n, start),
            )
        )
    raw = rows * len(layout.stages) * len(layout.layers) * 3 * d_model * 2
    path = directory / f"throughput_{compression}.h5"
    start = time.perf_counter()
    with StoreWriter(path, layout, {"model_id": "bench"}, compression=compression) as writer:
        for batch in batches:
            writer.append(batch)
    seconds = time.perf_counter() - start
    return raw / seconds / 1e6, path.stat().st_size / raw


def compressed_size(store_path: Path, compression: str, directory: Path) -> tuple[int, int]:
    """``(bytes stored, raw bytes)`` of a store's pre-reasoning activations written as one
    HDF5 chunk with the store's filter (no partly filled chunk to flatter the ratio)."""
    import h5py
    from goalprobe.activations.store import ActivationStore
    from goalprobe.activations.store.writer import hdf5_filters

    with ActivationStore(store_path) as store:
        acts = np.concatenate([store.read("pre_reasoning", x) for x in store.layers])
    with h5py.File(directory / f"chunk_{compression}.h5", "w") as f:
        ds = f.create_dataset("x", data=acts, chunks=acts.shape, **hdf5_filters(compression))
        return ds.id.get_storage_size(), acts.nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids-per-cell", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--hdf5-rows", type=int, default=512)
    parser.add_argument(
        "--backends",
        default="nnsight,hooks,transformer_lens",
        help="comma-separated; the first one runs the prompt-only comparison",
    )
    parser.add_argument(
        "--middle-layer",
        action="store_true",
        help="also time capture of the single middle layer against the plain forward",
    )
    args = parser.parse_args()
    args.backends = [b for b in args.backends.split(",") if b]
    torch.set_num_threads(args.threads)

    from goalprobe.activations.capture import make_backend
    from goalprobe.activations.extract import (
        ExtractConfig,
        compute_rows,
        default_layers,
        episode_rows,
        extract,
    )
    from goalprobe.agents.chat_format import chat_format_for
    from goalprobe.agents.trajectories import read_steps, read_trajectories
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model, tokenizer, description = load_agent()
    pad_id = tokenizer.pad_token_id
    n_layers = model.config.num_hidden_layers
    work = Path(tempfile.mkdtemp(prefix="bench_extract_"))
    trajectories = work / "trajectories.jsonl"
    started = time.perf_counter()
    make_trajectories(model, tokenizer, trajectories, args.grids_per_cell, args.max_new_tokens)
    steps = list(read_steps(trajectories))
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch threads {args.threads}, load average {os.getloadavg()[0]:.2f} (1 min)"
    )
    print(f"model: {description}; {n_layers} blocks, d_model {model.config.hidden_size}")
    print(
        f"trajectories: {len(steps)} steps, mean sequence "
        f"{np.mean([len(s.prompt_token_ids) + len(s.generated_token_ids) for s in steps]):.0f} "
        f"tokens (rollouts took {time.perf_counter() - started:.1f} s)"
    )

    special = chat_format_for(tokenizer)

    def replay_rows(config):
        rows, first = [], 0
        for episode in read_trajectories(trajectories):
            rows += episode_rows(episode, first, special, config, str(trajectories))
            first += len(episode.steps)
        return rows

    def plain():
        plain_forward(model, steps, args.batch_size, pad_id)

    # backends by (name, prefix cache); TransformerLens has no prefix path
    backends = {}
    for name in args.backends:
        if name == "transformer_lens":
            target = copy.deepcopy(model)
            backends[(name, False)] = make_backend(name, target, tokenizer, copy_model=False)
        else:
            backends[(name, True)] = make_backend(name, model, tokenizer)
            backends[(name, False)] = make_backend(name, model, tokenizer, prefix_cache=False)
            assert backends[(name, True)].prefix_cache, f"{name}: prefix cache is not the default"

    def capture_job(capture, rows, config):
        return lambda: compute_rows(rows, capture, config, pad_id)

    def e2e_job(capture, config, tag):
        def run():
            out = work / f"{tag}.h5"
            out.unlink(missing_ok=True)
            extract(trajectories, out, capture, tokenizer, config, model_id="bench")

        return run

    defaults = default_layers(n_layers)
    layer_sets = [defaults] + ([(n_layers // 2,)] if args.middle_layer else [])
    configs = {
        layers: ExtractConfig(layers=layers, batch_size=args.batch_size, rows_per_part=256)
        for layers in layer_sets
    }
    rows_by_layers = {layers: replay_rows(config) for layers, config in configs.items()}
    full_config = configs[defaults]
    full_rows = rows_by_layers[defaults]
    pre_config = ExtractConfig(
        layers=defaults, stages=("pre_reasoning",), batch_size=args.batch_size, rows_per_part=256
    )
    pre_rows = replay_rows(pre_config)
    prompt_lengths = [len(s.prompt_token_ids) for s in steps]

    # the same rows with and without the prefix (and prompt-only vs full) agree to float16
    # tolerance: check once before timing
    check = {}
    for name in args.backends:
        if (name, True) not in backends:
            continue
        cached = compute_rows(full_rows, backends[(name, True)], full_config, pad_id)
        whole = compute_rows(full_rows, backends[(name, False)], full_config, pad_id)
        worst, ulps = 0.0, 0.0
        for stage in full_config.stages:
            for layer in defaults:
                x = cached.acts[stage][layer].astype(np.float32)
                y = whole.acts[stage][layer].astype(np.float32)
                np.testing.assert_allclose(x, y, rtol=4e-3, atol=4e-3)
                worst = max(worst, float(np.abs(x - y).max()))
                spacing = np.spacing(np.abs(whole.acts[stage][layer])).astype(np.float32)
                ulps = max(ulps, float((np.abs(x - y) / spacing).max()))
        check[name] = (worst, ulps)
    default_backend = backends[(args.backends[0], (args.backends[0], True) in backends)]
    pre = compute_rows(pre_rows, default_backend, pre_config, pad_id)
    full = compute_rows(full_rows, default_backend, full_config, pad_id)
    for layer in defaults:
        np.testing.assert_allclose(
            pre.acts["pre_reasoning"][layer].astype(np.float32),
            full.acts["pre_reasoning"][layer].astype(np.float32),
            rtol=4e-3,
            atol=4e-3,
        )

    pairs: dict = {}
    for layers in layer_sets:
        label = ",".join(map(str, layers))
        for (name, prefix), capture in backends.items():
            job = capture_job(capture, rows_by_layers[layers], configs[layers])
            pairs[("plain", label, name, prefix, "capture")] = (plain, job)
            if layers == defaults and (prefix or name == "transformer_lens"):
                # end to end: each backend as extraction runs it (its default prefix setting)
                tag = f"{name}_{int(prefix)}_{label}"
                pairs[("plain", label, name, prefix, "e2e")] = (
                    plain,
                    e2e_job(capture, configs[layers], tag),
                )
    for name in args.backends:
        if (name, True) in backends:
            pairs[("prefix", name)] = (
                capture_job(backends[(name, False)], full_rows, full_config),
                capture_job(backends[(name, True)], full_rows, full_config),
            )
    pairs[("prompt-only", "capture")] = (
        capture_job(default_backend, full_rows, full_config),
        capture_job(default_backend, pre_rows, pre_config),
    )
    pairs[("prompt-only", "e2e")] = (
        e2e_job(default_backend, full_config, "full"),
        e2e_job(default_backend, pre_config, "pre"),
    )
    times = interleaved(pairs, args.repeats)

    plain_s = statistics.median(t[0] for key, ts in times.items() if key[0] == "plain" for t in ts)
    print(
        f"plain batched forward (full model, full sequences): median {plain_s:.3f} s; "
        f"{args.repeats} interleaved rounds after one warm-up; ratios are medians of the "
        "per-round ratios (min - max)"
    )
    print()
    header = (
        f"{'layers':<10}{'backend':<18}{'prefix':<8}{'capture s':>10}{'x plain':>22}"
        f"{'end-to-end s':>14}{'x plain':>22}"
    )
    print(header)
    print("-" * len(header))
    for key, ts in times.items():
        if key[0] != "plain" or key[4] != "capture":
            continue
        _, label, name, prefix, _ = key
        e2e = times.get(("plain", label, name, prefix, "e2e"))
        e2e_text = f"{median_s(e2e, 1):>14.3f}{ratio_text(e2e):>22}" if e2e else ""
        print(
            f"{label:<10}{name:<18}{'on' if prefix else 'off':<8}{median_s(ts, 1):>10.3f}"
            f"{ratio_text(ts):>22}{e2e_text}"
        )
    print()
    n_steps = len(full_rows)
    print(
        f"shared-prompt-prefix KV cache, capture at layers {','.join(map(str, defaults))}, "
        f"{n_steps} steps (rows up to the post-reasoning anchor: mean "
        f"{np.mean([len(r.token_ids) for r in full_rows]):.0f} tokens; prompts "
        f"{np.mean(prompt_lengths):.0f}; shared prefix "
        f"{shared_prefix_tokens(full_rows, full_config)} tokens)"
    )
    for name in args.backends:
        ts = times.get(("prefix", name))
        if ts is None:
            continue
        off, on = median_s(ts, 0), median_s(ts, 1)
        print(
            f"  {name:<10} off {n_steps / off:8.1f} steps/s   on {n_steps / on:8.1f} steps/s   "
            f"speed-up {ratio_text(ts, invert=True)}   max |diff| {check[name][0]:.2e} "
            f"({check[name][1]:.0f} float16 ulp)"
        )
    print(
        f"prompt-only extraction ({default_backend.name}, prefix cache "
        f"{'on' if default_backend.prefix_cache else 'off'}): pre-reasoning rows "
        f"(mean {np.mean([len(r.token_ids) for r in pre_rows]):.0f} tokens) against full pre + "
        "post rows, equal at the pre-reasoning anchors (float16 tolerance)"
    )
    for kind in ("capture", "e2e"):
        ts = times[("prompt-only", kind)]
        full_s, pre_s = median_s(ts, 0), median_s(ts, 1)
        print(
            f"  {kind:<8} full {n_steps / full_s:8.1f} rows/s   prompt-only "
            f"{n_steps / pre_s:8.1f} rows/s   speed-up {ratio_text(ts, invert=True)}"
        )
    print()
    print(f"HDF5 write throughput ({args.hdf5_rows} rows, 2 stages x 3 layers x 3 x 2880 float16)")
    for compression in ("none", "lzf", "gzip"):
        mbps, ratio = hdf5_throughput(args.hdf5_rows, 2880, compression, work)
        print(f"  {compression:<5} {mbps:8.1f} MB/s   file/raw {ratio:.3f}")
    source = work / "full.h5"
    print("compressibility of the extracted pre-reasoning activations (one unpadded chunk)")
    for compression in ("none", "lzf", "gzip"):
        stored, raw = compressed_size(source, compression, work)
        print(f"  {compression:<5} {raw / 1e6:8.3f} MB raw   stored/raw {stored / raw:.3f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
