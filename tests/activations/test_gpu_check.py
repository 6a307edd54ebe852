"""``scripts/gpu_check.py``'s CPU-safe parts (it never runs in CI on a GPU): argument parsing,
the Markdown report, and the whole check in its smoke mode (``--device cpu --blocks 1 --tiny``)
on the real o200k tokenizer."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_arguments(gpu_check):
    args = gpu_check.parse_args([])
    assert args.device == "cuda" and args.blocks == 24 and args.lengths == (500, 1000, 2000, 4000)
    args = gpu_check.parse_args(["--lengths", "700, 900", "--steps", "2"])
    assert args.lengths == (700, 900) and args.steps == 2
    assert args.kernel_lengths == (500, 2000, 4000, 8000, 16000)  # up to long reasoning
    assert args.patching_lengths == (1000, 2000, 4000)
    smoke = gpu_check.parse_args(["--device", "cpu", "--tiny"])
    assert smoke.kernel_lengths == () and smoke.patching_lengths == ()
    for bad in (["--lengths", "5x"], ["--lengths", "10"], ["--blocks", "0"], ["--device", "cpu"]):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(bad)


def test_markdown_report(gpu_check):
    report = gpu_check.Report(
        device="NVIDIA H100 80GB HBM3", dtype="bfloat16", blocks=24, blocks_wanted=24,
        weights_gb=41.8, versions={"torch": "2.8.0", "transformers": "4.56.0", "nnsight": "0.5"},
        mxfp4="available", seconds=300.0,
        rollout={"conversations": 8, "new_tokens": 64, "seconds": 2.0, "tokens_per_s": 256.0,
                 "peak_gb": 43.0},
        extraction=[{"tokens": 500, "steps": 8, "batch": 8, "tokens_per_s": 9000.0,
                     "peak_gb": 43.1, "planned_gb": 43.2}],
    )  # fmt: skip
    text = gpu_check.markdown(report)
    assert text.startswith("### GPU check (NVIDIA H100 80GB HBM3, ")
    assert "24 of 24 blocks, bfloat16 weights 41.8 GB" in text and "MXFP4: available" in text
    assert "| 500 | 8 | 8 | 9,000 | 43.10 | 43.20 |" in text
    assert "256 generated tokens/s" in text and "5.0 min" in text
    assert "MXFP4 weights" not in text  # no MXFP4 rows measured, no table


def test_layer_types_alternate_like_gpt_oss(gpu_check):
    assert gpu_check.layer_types(3) == ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.mark.slow  # end to end (a whole script, verb or trained agent): the full suite runs it
def test_smoke_mode_on_cpu(gpu_check, gptoss_dir, tmp_path, capsys):
    out = tmp_path / "check.md"
    args = ["--device", "cpu", "--blocks", "1", "--tiny", "--tokenizer", str(gptoss_dir)]
    args += ["--lengths", "450,600", "--steps", "2", "--conversations", "2", "--new-tokens", "3"]
    args += ["--kernel-lengths", "450", "--patching-lengths", "400"]
    report = gpu_check.main([*args, "--out", str(out)])
    # the fp32-LSE flex kernel: its rows, its agreement with eager and its routing flips (fp32
    # on CPU: within float noise, no flip), and patching planned beside measured (CPU: nan)
    assert report.kernel == "flex_fp32_sinks" and report.kernel_extraction[0]["tokens"] == 450
    kernel = report.agreement["flex_fp32_sinks"]
    assert kernel["worst"] < 1e-4 and kernel["flips"] == 0.0
    assert report.patching[0]["tokens"] == 400 and report.patching[0]["batch"] >= 1
    assert report.blocks == 1 and report.dtype == "float32"
    assert [row["tokens"] for row in report.extraction] == [450, 600]  # replayed at T exactly
    assert all(row["steps"] == 2 and row["tokens_per_s"] > 0 for row in report.extraction)
    assert report.rollout["conversations"] == 2 and report.rollout["tokens_per_s"] > 0
    text = out.read_text()
    assert "| 450 | 2 |" in text and "| 600 | 2 |" in text and "1 of 1 blocks" in text
    assert "flex_fp32_sinks attention" in text and "top-k routing differs for 0.00%" in text
    assert "| 400 |" in text  # the patching table
    assert "### GPU check (CPU" in capsys.readouterr().out
