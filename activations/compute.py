"""What computed a store's rows: :func:`compute_identity` (weights' format, dtype, device, GPU
model, driver, CUDA) is part of the extraction's identity, since each changes the residual
streams; :func:`batching_record` records the rest per part."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

MXFP4_KERNEL = ("kernels-community/gpt-oss-triton-kernels", 1)
"""The Hub kernel (repository, version) transformers loads for MXFP4 experts."""

PREFETCH = (
    'python -c "from kernels import get_kernel; '
    f"get_kernel('{MXFP4_KERNEL[0]}', version={MXFP4_KERNEL[1]})\""
)
"""Run on a node with network (same ``HF_HOME``) to put the MXFP4 kernel into the Hub cache."""

_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def config_value(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` of a dict config, else its attribute ``key`` (``default`` when absent)."""
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def weights_format(model: Any) -> str:
    """``"mxfp4"`` for transformers' MXFP4 expert modules, another quantised model's method, else
    the parameters' dtype (``bf16``, ``fp32``, ...)."""
    if any("Mxfp4" in type(m).__name__ for m in model.modules()):
        return "mxfp4"
    quantization = getattr(model.config, "quantization_config", None)
    method = config_value(quantization, "quant_method")
    dequantized = config_value(quantization, "dequantize", False)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if method and str(method) != "mxfp4" and not dequantized:
        return str(method)
    return _DTYPE_SHORT.get(dtype, dtype)


def gpu_model(name: str) -> str:
    """A GPU's name without its memory size (``NVIDIA A100-SXM4-80GB`` -> ``NVIDIA A100-SXM4``)."""
    return re.sub(r"\s+", " ", re.sub(r"[-_ ]?\d+\s*GB\b", "", name)).strip(" -")


def nvidia_driver() -> str:
    """The NVIDIA driver's version ('' when it cannot be asked: no driver, no nvidia-smi)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception as err:  # noqa: BLE001 - no pynvml, or NVML failed: ask nvidia-smi
        reason = err
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return f"unknown ({type(reason).__name__})"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def compute_identity(model: Any) -> dict[str, str]:
    """``{weights, dtype, device, gpu, driver, cuda}`` of the computation ``model`` runs (the last
    three '' off CUDA)."""
    import torch

    parameter = next(model.parameters())
    device = parameter.device
    out = {
        "weights": weights_format(model),
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "device": device.type,
        "gpu": "",
        "driver": "",
        "cuda": "",
    }
    if device.type == "cuda":
        out["gpu"] = gpu_model(torch.cuda.get_device_name(device))
        out["driver"] = nvidia_driver()
        out["cuda"] = str(torch.version.cuda or "")
    return out


def batching_record(config: Any, capture: Any) -> dict[str, Any]:
    """A part's ``batching`` attribute (not identity): its batches and where it was computed, the
    device and, on CUDA, the GPU's full name and memory."""
    import torch

    out: dict[str, Any] = {
        "batch_size": config.batch_size,
        "max_batch_tokens": config.max_batch_tokens,
    }
    if hasattr(capture, "model"):
        device = next(capture.model.parameters()).device
        out["device"] = str(device)
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            out.update(gpu=props.name, memory_gb=round(props.total_memory / 1e9, 1))
    return out


def mxfp4_kernel_check() -> tuple[bool, str]:
    """Whether the MXFP4 Hub kernel (:data:`MXFP4_KERNEL`) loads here, and what that means."""
    from goalprobe.activations.plan import mxfp4_status

    status = mxfp4_status()
    if not status.available:
        return False, f"MXFP4 would be dequantised to bf16: {status.reason}"
    try:
        from kernels import get_kernel  # type: ignore[import-not-found]

        get_kernel(MXFP4_KERNEL[0], version=MXFP4_KERNEL[1])
    except Exception as err:  # noqa: BLE001 - any failure means transformers cannot load it
        return False, (
            f"the MXFP4 kernel {MXFP4_KERNEL[0]} (version {MXFP4_KERNEL[1]}) does not load here "
            f"({type(err).__name__}: {err}); transformers would fail or dequantise at load. On "
            f"an offline node, pre-fetch it from a node with network and the same HF_HOME: "
            f"{PREFETCH}"
        )
    return True, f"the MXFP4 kernel {MXFP4_KERNEL[0]} loads: experts stay in MXFP4"
