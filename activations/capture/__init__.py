"""Residual-stream capture: nnsight (default, local or NDIF), TransformerLens, plain hooks.

Every backend reads the output of chosen decoder blocks at chosen token positions of a
right-padded batch (:class:`TokenBatch`) and stops the forward pass after the last requested
block. All three agree with the plain-hook reference up to floating-point reassociation.
"""

from __future__ import annotations

from activations.capture.base import CaptureBackend, TokenBatch, decoder_layers_path, input_device

BACKENDS: tuple[str, ...] = ("nnsight", "transformer_lens", "hooks")
"""Backend names accepted by :func:`make_capture` (and ``goalprobe extract --backend``)."""


def make_capture(name: str, model, tokenizer=None, **kwargs) -> CaptureBackend:
    """Build the backend called ``name`` around a loaded model.

    Args:
        name: one of :data:`BACKENDS`.
        model: a Hugging Face causal LM (for nnsight also a ``TransformersModel``).
        tokenizer: the model's tokenizer (nnsight and TransformerLens need it).
        **kwargs: backend options (nnsight: ``remote``, ``model_id``, ``revision``, ``host``;
            TransformerLens: ``model_id``).
    """
    if name == "nnsight":
        from activations.capture.nnsight_backend import NnsightCapture

        return NnsightCapture(model, tokenizer, **kwargs)
    if name == "transformer_lens":
        from activations.capture.tl_backend import TransformerLensCapture

        return TransformerLensCapture(model, tokenizer, **kwargs)
    if name == "hooks":
        from activations.capture.hooks_backend import HookCapture

        if kwargs:
            raise TypeError(f"the hooks backend takes no options, got {sorted(kwargs)}")
        return HookCapture(model)
    raise ValueError(f"unknown capture backend {name!r}; expected one of {BACKENDS}")


__all__ = [
    "BACKENDS",
    "CaptureBackend",
    "TokenBatch",
    "decoder_layers_path",
    "input_device",
    "make_capture",
]
