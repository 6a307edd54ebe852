"""Residual-stream backends: nnsight (default, local or NDIF), TransformerLens, plain hooks.

One adapter per library (:class:`~goalprobe.activations.capture.base.ResidualBackend`), used by
extraction (``capture``) and by the patching experiment (``clean_run``, ``patched_logits``,
``generate``); all agree with the plain-hook reference up to floating-point reassociation."""

from __future__ import annotations

from goalprobe.activations.capture.backends import NnsightBackend, TransformerLensBackend
from goalprobe.activations.capture.base import (
    BackendUnavailableError,
    HookBackend,
    Patch,
    ResidualBackend,
    TokenBatch,
)

BACKENDS: tuple[str, ...] = ("nnsight", "transformer_lens", "hooks")
"""Backend names accepted by :func:`make_backend` (``goalprobe extract/patch --backend``)."""


def make_backend(name: str, model, tokenizer=None, **kwargs) -> ResidualBackend:
    """Build the backend called ``name`` (one of :data:`BACKENDS`) around a loaded model with the
    backend's options ``kwargs`` (:class:`BackendUnavailableError`: it cannot wrap the model)."""
    if name == "nnsight":
        return NnsightBackend(model, tokenizer, **kwargs)
    if name == "transformer_lens":
        if tokenizer is None:
            raise ValueError("wrapping a loaded model with TransformerLens needs its tokenizer")
        return TransformerLensBackend(model, tokenizer, **kwargs)
    if name == "hooks":
        return HookBackend(model, tokenizer, **kwargs)
    raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")


__all__ = ["BACKENDS", "BackendUnavailableError", "Patch", "TokenBatch", "make_backend"]
