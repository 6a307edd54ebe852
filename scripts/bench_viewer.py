"""Benchmark: does the viewer stay responsive on a large run? (no model, no GPU)

Writes a synthetic run directory of realistic file sizes: episodes on grids of sizes 7-15 walked
by a noisy optimal policy, step lines carrying prompt/generated token-id lists of study-like
length, a real activation store (labels; tiny activations, which the viewer never reads), one
decoded-maps file over every row and one predicted-plans run. Then times what the viewer does:
opening the run (indexing the trajectory file), the first episode (store id index and HDF5 row
index built), further episodes (read per episode), and one step's view plus figures.
With ``--browser``, also what a user waits for: ``goalprobe view`` serving the run to headless
Chromium (playwright), the time from loading the page to the first screen's decoded map, and the
latency of the right-arrow key (next step drawn, header updated), median over 20 presses.

    python scripts/bench_viewer.py --episodes 2000 --out /tmp/bench-run --browser
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from goalprobe.activations.store import RowBatch, StoreLayout, StoreWriter
from goalprobe.activations.store.schema import episode_labels
from goalprobe.agents.trajectories import (
    EpisodeSummary,
    RunHeader,
    StepRecord,
    append_episode,
    open_for_resume,
    read_trajectories,
)
from goalprobe.gridworld.core import Action
from goalprobe.gridworld.dynamics import initial_state, is_success, step
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render

RUN_ID = "bench0000000000a"


def _episode(grid, index: int, rng, prompt_len: int, gen_len: int):
    policy = solve(grid)
    state = initial_state(grid)
    horizon = policy.horizon
    steps = []
    while not is_success(grid, state) and len(steps) < horizon:
        optimal = sorted(policy.optimal_actions(state))
        action = Action(int(rng.integers(4))) if rng.random() < 0.2 else optimal[0]
        nxt = step(grid, state, action)
        steps.append(
            StepRecord(
                run_id=RUN_ID,
                grid_id=grid.grid_id,
                episode=index,
                step=len(steps),
                episode_seed=index,
                grid_size=grid.size,
                density=grid.density,
                variant=str(grid.variant),
                grid_text=render(grid, state),
                agent_row_col=state.agent,
                goal_row_col=grid.goal,
                has_key=state.has_key,
                door_open=state.door_open,
                key_row_col=grid.key,
                door_row_col=grid.door,
                optimal_actions=[a.name for a in optimal],
                distance_to_goal=int(policy.distance(state)),
                action=action.name,
                valid=True,
                next_agent_row_col=nxt.agent,
                prompt_token_ids=rng.integers(0, 200_000, prompt_len).tolist(),
                generated_token_ids=rng.integers(0, 200_000, gen_len).tolist(),
                token_ids_source="model",
                reasoning="A is somewhere. G is elsewhere. Plan: "
                + " ".join(a.name for a in optimal),
                final=f'{{"action": "{action.name}"}}',
                finish_reason="stop",
                parse_error=None,
                parse_form="json",
                attempts=1,
            )
        )
        state = nxt
    success = is_success(grid, state)
    summary = EpisodeSummary(
        run_id=RUN_ID,
        grid_id=grid.grid_id,
        episode=index,
        episode_seed=index,
        grid_size=grid.size,
        density=grid.density,
        variant=str(grid.variant),
        success=success,
        end_reason="goal" if success else "horizon",
        length=len(steps),
        invalid_steps=0,
        optimal_steps=sum(s.action in s.optimal_actions for s in steps),
        total_attempts=len(steps),
        horizon=horizon,
        shortest_path_length=policy.shortest_path_length,
        start_row_col=grid.start,
        goal_row_col=grid.goal,
        final_agent_row_col=state.agent,
        final_has_key=state.has_key,
        final_door_open=state.door_open,
    )
    return steps, summary


def build(out: Path, n_episodes: int, prompt_len: int, gen_len: int, seed: int = 0) -> int:
    """Write the synthetic run; returns the number of steps."""
    from goalprobe.probes.decoded_maps import write_decoded_maps
    from goalprobe.probes.plan_metrics import write_predicted_plans

    rng = np.random.default_rng(seed)
    sizes, densities = (7, 9, 11, 13, 15), (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    per_cell = max(1, n_episodes // (len(sizes) * len(densities) * 2))
    grids = generate_grid_set(
        GridSetConfig(sizes=sizes, densities=densities, n_per_cell=per_cell, seed=seed)
    )
    write_grid_set(out / "grids" / "grids.jsonl", grids)
    traj = out / "rollouts" / "trajectories.jsonl"
    open_for_resume(traj, RunHeader(RUN_ID, {}, {"class": "bench"}, "bench"))
    count = 0
    for grid in grids:
        for index in range(2):
            if count >= n_episodes:
                break
            append_episode(traj, *_episode(grid, index, rng, prompt_len, gen_len))
            count += 1
    labels: dict[str, list] = {}
    first = 0
    for episode in read_trajectories(traj):
        for name, values in episode_labels(episode, first).items():
            labels.setdefault(name, []).append(values)
        first += len(episode.steps)
    lab = {k: np.concatenate(v) for k, v in labels.items()}
    n = len(lab["step"])
    lab["seq_len"] = np.full(n, prompt_len + gen_len, dtype=np.int32)
    stages, layers = ("pre_reasoning",), (15,)
    with StoreWriter(
        out / "activations" / "activations.h5",
        StoreLayout(stages, layers, 4),
        {"model_id": "bench"},
    ) as writer:
        writer.append(
            RowBatch(
                acts={"pre_reasoning": {15: np.zeros((n, 3, 4), np.float32)}},
                positions={"pre_reasoning": np.zeros((n, 3), np.int32)},
                present={"pre_reasoning": np.ones(n, bool)},
                labels=lab,
            )
        )
    classes = (0, 1, 2, 3, 6)
    onehot = (lab["cell_types"][..., None] == np.asarray(classes)).astype(np.float32)
    probs = onehot * 0.8 + rng.random(onehot.shape, dtype=np.float32) * 0.2
    probs /= probs.sum(-1, keepdims=True)
    card = {
        "class": "CoordinateCellProbe",
        "hyperparameters": {"family": "mlp"},
        "fitted": {"classes_": list(classes)},
        "activations": {"stage": "pre_reasoning", "layer": 15},
    }
    write_decoded_maps(out / "probes" / "decoded" / "mlp_pre_L15.h5", probs, np.arange(n), card)
    write_predicted_plans(
        out / "plans" / "predicted" / "plans.h5",
        "pre_reasoning/layer15/decoder2",
        lab["plan"].astype(np.int8),
        np.arange(n),
        card={"hyperparameters": {"n_layers": 2}},
    )
    return n


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--prompt-len", type=int, default=1200, help="token ids per prompt")
    parser.add_argument("--gen-len", type=int, default=300, help="token ids per completion")
    parser.add_argument("--out", type=Path, default=Path("/tmp/goalprobe-bench-viewer"))
    parser.add_argument("--keep", action="store_true", help="reuse an existing run in --out")
    parser.add_argument(
        "--browser", action="store_true", help="also time goalprobe view in headless Chromium"
    )
    args = parser.parse_args()
    if not (args.keep and (args.out / "rollouts" / "trajectories.jsonl").exists()):
        shutil.rmtree(args.out, ignore_errors=True)
        t = time.perf_counter()
        n = build(args.out, args.episodes, args.prompt_len, args.gen_len)
        print(f"built {n} steps in {time.perf_counter() - t:.1f} s")
    sizes = {
        p.relative_to(args.out).as_posix(): p.stat().st_size / 1e6
        for p in args.out.rglob("*")
        if p.is_file()
    }
    for name, mb in sorted(sizes.items()):
        print(f"  {name:45s} {mb:8.1f} MB")

    from goalprobe.viewer.data import RunData
    from goalprobe.viewer.step import build_step_view, step_figures, timeline_figure

    rss0 = _rss_mb()
    t = time.perf_counter()
    run = RunData(args.out)
    print(f"open run (index {len(run.episodes)} episodes): {time.perf_counter() - t:.3f} s")
    keys = list(run.episodes)
    map_key, plan_key = next(iter(run.map_sources)), next(iter(run.plan_sources))
    t = time.perf_counter()
    run.decoded_maps(map_key, keys[0])
    run.predicted_plans(plan_key, keys[0])
    print(
        f"first episode with maps and plans (builds the id indexes): {time.perf_counter() - t:.3f} s"
    )
    rng = np.random.default_rng(1)
    picks = [keys[i] for i in rng.choice(len(keys), size=min(50, len(keys)), replace=False)]
    t = time.perf_counter()
    for key in picks:
        run.decoded_maps(map_key, key)
        run.predicted_plans(plan_key, key)
    per = (time.perf_counter() - t) / len(picks)
    print(f"further episodes (maps + plans, uncached): {1000 * per:.1f} ms each")
    times = []
    for key in picks[:20]:
        t = time.perf_counter()
        view = build_step_view(run, key, 1, map_source=map_key, plan_source=plan_key)
        figs = step_figures(view, show_legend=False)
        figs["timeline"] = timeline_figure(run, key, 1, map_key)
        for fig in figs.values():
            fig.to_json()
        times.append(time.perf_counter() - t)
    print(
        f"one step, view + figures + JSON: median {1000 * np.median(times):.0f} ms, max {1000 * max(times):.0f} ms"
    )
    print(f"peak RSS growth while viewing: {_rss_mb() - rss0:.0f} MB (peak {_rss_mb():.0f} MB)")
    if args.browser:
        browser_timings(args.out)


_SERVE = "import sys; from goalprobe.cli import main; sys.argv[0] = 'goalprobe'; main()"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browser_timings(run_dir: Path, presses: int = 20) -> None:
    """Serve ``run_dir`` with ``goalprobe view`` and time the first screen and the arrow keys in
    headless Chromium."""
    import httpx
    import playwright.sync_api as playwright_api

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("--browser needs chromium on PATH (scripts/setup_tests.sh installs it)")
    port = _free_port()
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, "view", str(run_dir), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"goalprobe view exited with code {proc.returncode}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        print(
            f"browser: server up (process start, imports, run index): {time.perf_counter() - t:.2f} s"
        )
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1600, "height": 1300})
            t = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#g-decoded .js-plotly-plot .hm", timeout=120_000)
            print(
                "browser: page load to the first screen's decoded map: "
                f"{time.perf_counter() - t:.2f} s"
            )
            page.locator(".gp-header h1").click()
            found = re.search(r"step 0 of (\d+)", page.text_content("#step-header"))
            n_steps = int(found.group(1)) if found else 2
            times, step = [], 0
            for _ in range(presses):
                key = "ArrowRight" if step + 1 < n_steps else "ArrowLeft"
                step += 1 if key == "ArrowRight" else -1
                t = time.perf_counter()
                page.keyboard.press(key)
                page.wait_for_function(
                    "(t) => document.querySelector('#step-header').textContent.includes(t)",
                    arg=f"step {step} of",
                    timeout=30_000,
                )
                times.append(time.perf_counter() - t)
            print(
                f"browser: arrow key to the next step drawn: median {1000 * np.median(times):.0f} ms, "
                f"max {1000 * max(times):.0f} ms ({len(times)} presses)"
            )
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
