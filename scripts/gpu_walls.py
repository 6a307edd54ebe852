"""Train walls-phase variants of the map agent side by side on one GPU, each for a fixed time.

A GPU job (issue 39, item 4; docs/map_agent.md, fifth session): the map agent is tiny (0.9 M
parameters), so one process leaves a GPU mostly idle and the step time is set by the Python
side; several variants therefore train at once, one process each. The steps of each variant's
learning-rate schedule are fitted to the time it is given: a short calibration run of every
variant (all at once, as in the real run) measures its seconds per step, and the real run gets
``minutes * 60 / seconds_per_step`` steps (less a margin), with ``--stop-after-minutes`` as a
guard. Each variant's weights and training log are packed into ``OUT/<variant>.tar``.

Usage (on a CUDA machine, from the repository root)::

    python scripts/gpu_walls.py --out OUT --minutes 5.5 \\
        --variant offset:--map-recipe,walls-offset --variant walls:--map-recipe,walls

A variant is ``name:arg,arg,...`` (extra arguments of ``scripts/train_default_agent.py --map``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "train_default_agent.py"


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``name:arg,arg`` -> ``(name, [arg, arg])``."""
    name, _, rest = text.partition(":")
    if not name.isidentifier():
        raise argparse.ArgumentTypeError(f"variant name {name!r}: letters, digits and _ only")
    return name, [a for a in rest.split(",") if a]


def launch(extra: list[str], out: Path, steps: int, minutes: float, log: Path):
    """Start one training process (``--map``, no evaluation) writing to ``out``."""
    command = [
        sys.executable,
        str(SCRIPT),
        "--map",
        *extra,
        "--device",
        os.environ.get("GOALPROBE_DEVICE", "cuda"),
        "--skip-eval",
        "--map-steps",
        str(steps),
        "--stop-after-minutes",
        str(minutes),
        "--log-every",
        "50",
        "--checkpoint-every",
        "250",
        "--out",
        str(out),
    ]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)


def seconds_per_step(out: Path) -> float:
    """Seconds per step of a finished run, from its ``training_log.json`` (its first steps
    left out: they include CUDA's warm-up)."""
    records = json.loads((out / "training_log.json").read_text())["log"]
    if len(records) < 12:
        raise RuntimeError(f"{out}: only {len(records)} calibration steps")
    return (records[-1]["seconds"] - records[9]["seconds"]) / (len(records) - 10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the tars go")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_walls"))
    parser.add_argument("--minutes", type=float, default=5.5, help="training time per variant")
    parser.add_argument("--calibration-minutes", type=float, default=0.6)
    parser.add_argument("--variant", type=parse_variant, action="append", required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    calibration = {
        name: launch(
            extra,
            args.work / "calibration" / name,
            4000,
            args.calibration_minutes,
            args.work / f"{name}.calibration.log",
        )
        for name, extra in args.variant
    }
    rates = {}
    for name, process in calibration.items():
        if process.wait() != 0:
            print((args.work / f"{name}.calibration.log").read_text()[-3000:], flush=True)
            raise SystemExit(f"calibration of {name} failed (exit {process.returncode})")
        rates[name] = seconds_per_step(args.work / "calibration" / name)
    margin = 20.0  # model load, the first steps' warm-up, the save
    steps = {name: max(20, int((args.minutes * 60 - margin) / rates[name])) for name in rates}
    print(
        f"calibrated in {time.perf_counter() - started:.0f}s: "
        + ", ".join(f"{n} {rates[n]:.3f}s/step -> {steps[n]} steps" for n in rates),
        flush=True,
    )
    runs = {
        name: launch(
            extra,
            args.work / name,
            steps[name],
            args.minutes + 0.3,
            args.work / f"{name}.log",
        )
        for name, extra in args.variant
    }
    failed = []
    for name, process in runs.items():
        if process.wait() != 0:
            failed.append(name)
        with tarfile.open(args.out / f"{name}.tar", "w") as tar:
            for file in ("model.safetensors", "config.json", "training_log.json"):
                if (args.work / name / file).exists():
                    tar.add(args.work / name / file, arcname=f"{name}/{file}")
            for log in (f"{name}.log", f"{name}.calibration.log"):
                tar.add(args.work / log, arcname=f"{name}/{log}")
        print(f"{name}: exit {process.returncode}, packed", flush=True)
    print(f"done in {time.perf_counter() - started:.0f}s; failed: {failed or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
