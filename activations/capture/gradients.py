"""Activations and their gradients with respect to a scalar metric of the logits at a few
readout positions (:class:`GradientRun`, hooks and nnsight backends), for attribution patching.

Parameters are frozen and the input embedding's output requires grad instead. **GradDrop** (AtP*,
Kramar et al. 2024): ``drops`` lists blocks whose residual branch passes no gradient back (hooks
backend only). MXFP4 kernels have no backward: :class:`GradientUnsupportedError` up front."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from goalprobe.activations.compute import config_value
from torch import nn

Metric = Callable[[torch.Tensor], torch.Tensor]
"""A scalar metric of the logits ``(R, vocab)`` at the run's readout positions (floating point,
at least float32; float64 when the model runs in float64)."""


class GradientUnsupportedError(RuntimeError):
    """The model (or backend) cannot give gradients; the message says why and what to do."""


@dataclass(frozen=True)
class GradientRun:
    """A teacher-forced run's residual stream ``acts`` ``(n_layers, k, d_model)`` and the
    metric's gradient ``grads`` ``(n_drops, n_layers, k, d_model)``, one per entry of ``drops``
    (None: the plain gradient), and the ``metric`` on the unpatched run."""

    positions: np.ndarray
    layers: tuple[int, ...]
    acts: torch.Tensor
    grads: torch.Tensor
    drops: tuple[int | None, ...]
    metric: float
    readout_positions: np.ndarray

    def grad(self, drop: int | None = None) -> torch.Tensor:
        """``(n_layers, k, d_model)`` the gradient with block ``drop``'s branch dropped (None:
        the plain gradient); KeyError when that drop was not computed."""
        if drop not in self.drops:
            raise KeyError(f"GradDrop of block {drop} was not computed (have {self.drops})")
        return self.grads[self.drops.index(drop)]


def result_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype activations and gradients come back in: at least float32 (float64 kept)."""
    return torch.promote_types(dtype, torch.float32)


def is_mxfp4(model: nn.Module) -> bool:
    """Whether ``model`` holds GPT-OSS's MXFP4 expert weights (not dequantised on load)."""
    config = getattr(getattr(model, "config", None), "quantization_config", None)
    method = str(config_value(config, "quant_method", "") or "")
    return method.lower() == "mxfp4" and not bool(config_value(config, "dequantize", False))


def refuse_without_gradients(model: nn.Module) -> None:
    """Raise :class:`GradientUnsupportedError` for a model whose kernels have no backward."""
    if is_mxfp4(model):
        raise GradientUnsupportedError(
            "the model holds MXFP4 expert weights, whose kernels are forward-only (transformers: "
            "MXFP4 quantization does not support training); attribution needs bf16 weights: "
            "load with quantization_config=Mxfp4Config(dequantize=True) (about 41.8 GB for "
            "GPT-OSS-20B instead of 13.8 GB)"
        )


@contextlib.contextmanager
def gradient_mode(model: nn.Module) -> Iterator[None]:
    """Grad enabled, parameters frozen (restored on exit), the input embedding's output requiring
    grad: autograd tracks the activations without any parameter gradient."""
    trainable = [p for p in model.parameters() if p.requires_grad]

    def track(module, args, output):
        return output.detach().requires_grad_(True)

    handle = model.get_input_embeddings().register_forward_hook(track)
    try:
        for param in trainable:
            param.requires_grad_(False)
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        handle.remove()
        for param in trainable:
            param.requires_grad_(True)


class _DropHolder:
    """Which block's branch the current backward pass drops (None: none)."""

    def __init__(self) -> None:
        self.layer: int | None = None


class _BranchGate(torch.autograd.Function):
    """Identity on a block's output ``out``; when the holder names this block, backward sends the
    gradient to the block's input ``inp`` (the skip connection) instead, skipping the branch."""

    @staticmethod
    def forward(ctx, out, inp, holder, layer):  # type: ignore[override]
        ctx.holder = holder
        ctx.layer = layer
        return out.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.holder.layer == ctx.layer:
            return None, grad, None, None
        return grad, None, None, None


def check_drops(drops: Sequence[int | None], n_layers: int) -> tuple[int | None, ...]:
    """``drops`` as a tuple, each None or a block index inside the model."""
    out = tuple(None if d is None else int(d) for d in drops)
    if not out:
        raise ValueError("drops needs at least one entry (None: the plain gradient)")
    bad = [d for d in out if d is not None and not 0 <= d < n_layers]
    if bad:
        raise ValueError(f"GradDrop blocks {bad} outside 0..{n_layers - 1}")
    return out


def _block_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a decoder block was called with."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    hidden = kwargs.get("hidden_states")
    if not isinstance(hidden, torch.Tensor):
        raise RuntimeError("cannot find the decoder block's input hidden states")
    return hidden


def _with_output(output, hidden: torch.Tensor):
    """A block's output with its hidden state replaced (tensor or tuple)."""
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def gradient_run(
    backend,
    runner: Callable,
    token_ids: Sequence[int] | np.ndarray,
    layers: Sequence[int],
    positions: np.ndarray,
    metric: Metric,
    readout_positions: Sequence[int] | np.ndarray,
    drops: Sequence[int | None],
) -> GradientRun:
    """:meth:`ResidualBackend.gradient_run`: the inputs checked, then ``runner`` (the backend's
    ``gradient_runner`` of this module) returns ``(acts, grads, metric value)``."""
    refuse_without_gradients(backend.model)
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 1 or len(ids) == 0:
        raise ValueError("token_ids must be a non-empty 1-D sequence")
    layers = backend.check_layers(layers)
    positions = np.asarray(positions, dtype=np.int64)
    readouts = np.asarray(readout_positions, dtype=np.int64)
    for name, values in (("positions", positions), ("readout positions", readouts)):
        if values.ndim != 1 or len(values) == 0:
            raise ValueError(f"{name} must be a non-empty 1-D sequence")
        if values.min() < 0 or values.max() >= len(ids):
            raise ValueError(f"{name} {values.tolist()} fall outside the {len(ids)} tokens")
    if np.any(np.diff(positions) <= 0):
        raise ValueError("positions must be strictly ascending")
    where = torch.as_tensor(positions, device=backend.device)
    drops = check_drops(drops, backend.n_layers)
    acts, grads, value = runner(backend, ids, layers, where, metric, readouts, drops)
    dtype = result_dtype(acts.dtype)
    return GradientRun(
        positions=positions,
        layers=tuple(layers),
        acts=acts.detach().to(dtype).cpu(),
        grads=grads.detach().to(dtype).cpu(),
        drops=drops,
        metric=float(value.detach().reshape(())),
        readout_positions=readouts,
    )


def hooks_gradient_run(backend, ids, layers, where, metric, readouts, drops):
    """:func:`gradient_run` with plain forward hooks (the reference)."""
    from goalprobe.activations.capture.base import block_output, ids_tensor

    holder = _DropHolder()
    gate = any(d is not None for d in drops)
    outs: dict[int, torch.Tensor] = {}

    def make_hook(layer: int):
        def hook(module, args, kwargs, output):
            hidden = block_output(output)
            if gate:
                hidden = _BranchGate.apply(hidden, _block_input(args, kwargs), holder, layer)
            outs[layer] = hidden
            return _with_output(output, hidden) if gate else None

        return hook

    hooked = range(backend.n_layers) if gate else layers
    handles = [
        backend.blocks[x].register_forward_hook(make_hook(x), with_kwargs=True) for x in hooked
    ]
    try:
        with gradient_mode(backend.model):
            logits = backend.model(
                ids_tensor(ids, 1, backend.device),
                use_cache=False,
                logits_to_keep=torch.as_tensor(readouts, device=backend.device),
            ).logits[0]
            value = metric(logits.to(result_dtype(logits.dtype)))
            _check_scalar(value)
            tensors = [outs[x] for x in layers]
            acts = torch.stack([t[0, where] for t in tensors]).detach()
            grads = []
            for i, drop in enumerate(drops):
                holder.layer = drop
                got = torch.autograd.grad(
                    value, tensors, retain_graph=i < len(drops) - 1, allow_unused=True
                )
                grads.append(
                    torch.stack(
                        [
                            torch.zeros_like(t[0, where]) if g is None else g[0, where]
                            for g, t in zip(got, tensors, strict=True)
                        ]
                    )
                )
    finally:
        for handle in handles:
            handle.remove()
    return acts, torch.stack(grads), value


def nnsight_gradient_run(backend, ids, layers, where, metric, readouts, drops):
    """:func:`gradient_run` inside an nnsight trace (plain gradients only)."""
    from goalprobe.activations.capture.backends import cache_name_accepted
    from goalprobe.activations.capture.base import ids_tensor

    if drops != (None,):
        raise GradientUnsupportedError(
            "GradDrop runs on the hooks backend only (the nnsight backend records plain "
            "gradients): use --backend hooks or drops=(None,)"
        )
    if backend.remote:
        raise GradientUnsupportedError("gradient runs are local only (remote=False)")
    blocks = backend._blocks()
    keep = torch.as_tensor(readouts, device=backend.device)
    dtype = result_dtype(backend.dtype)
    with (
        gradient_mode(backend.model),
        cache_name_accepted(),
        backend.lm.trace(ids_tensor(ids, 1, backend.device), use_cache=False, logits_to_keep=keep),
    ):
        hidden = []
        for layer in layers:
            out = blocks[layer].output
            hidden.append(out[0] if isinstance(out, tuple) else out)
        acts = torch.stack([h[0, where].detach() for h in hidden]).save()
        value = metric(backend.lm.lm_head.output[0].to(dtype))
        saved_value = value.detach().save()
        with value.backward():
            reversed_grads = [h.grad[0, where] for h in reversed(hidden)]
            grads = torch.stack(reversed_grads[::-1]).save()
    _check_scalar(saved_value)
    return acts, grads[None], saved_value


def _check_scalar(value) -> None:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ValueError("the metric must return a scalar tensor")
