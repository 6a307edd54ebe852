"""Wall time per stage of ``goalprobe demo`` (default scale: the README's first command).

Runs the demo in a fresh run directory (or resumes ``--run-dir``) as ``goalprobe demo`` does
without ``--model`` (the default agent with the positive control beside it; ``--alone`` for the
default agent only) and prints one line per stage and the total, as a markdown table for
docs/benchmarks.md, plus the headline table (both agents side by side).

    python3 scripts/bench_demo.py                      # default scale, temporary run directory
    python3 scripts/bench_demo.py --scale tiny --run-dir runs/bench-tiny
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="default", choices=("tiny", "default", "paper"))
    parser.add_argument("--run-dir", type=Path, default=None, help="default: a fresh temp dir")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--progress", action="store_true", help="show the stages' bars")
    parser.add_argument(
        "--jobs", type=int, default=None, help="stages at once (default: as goalprobe demo)"
    )
    parser.add_argument("--alone", action="store_true", help="the default agent only")
    args = parser.parse_args()

    from goalprobe.config import control_config, demo_config
    from goalprobe.demo import default_jobs, run_demo
    from goalprobe.report.agents import side_by_side_markdown
    from goalprobe.report.headline import headline_rows

    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix=f"bench-demo-{args.scale}-"))
    config = demo_config(args.scale, device=args.device)
    started = time.perf_counter()
    jobs = args.jobs or default_jobs(args.device)
    control = None if args.alone else control_config(config)
    result = run_demo(
        run_dir, config, progress=args.progress, log=lambda line: None, jobs=jobs, control=control
    )
    total = time.perf_counter() - started
    print(
        f"goalprobe demo --scale {args.scale}: {run_dir} on {platform.machine()}, "
        f"{os.cpu_count()} CPU(s), {platform.python_version()}, {jobs} stage(s) at a time"
    )
    print("\n| stage | status | seconds |\n|---|---|---|")
    for prefix, each in (("", result), ("control/", result.control)):
        for name, outcome in (each.stages if each is not None else {}).items():
            print(f"| {prefix}{name} | {outcome.error or outcome.status} | {outcome.seconds:.1f} |")
    print(f"| **total (wall)** | | **{total:.1f}** |")
    if result.control is None:
        print("\n| finding | value | baseline |\n|---|---|---|")
        for row in headline_rows(run_dir):
            print(f"| {row.finding} | {row.value} | {row.baseline} |")
        return
    print()
    print(side_by_side_markdown(run_dir))


if __name__ == "__main__":
    main()
