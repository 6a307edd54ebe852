"""Residual-stream backends: nnsight (default, local or NDIF), TransformerLens, plain hooks.

One adapter per library (:class:`~goalprobe.activations.capture.base.ResidualBackend`), used both by
extraction (:meth:`~goalprobe.activations.capture.base.ResidualBackend.capture`: read the output of chosen
decoder blocks at chosen token positions of a right-padded batch, stopping the forward pass
after the last requested block) and by the patching experiment (``clean_run``,
``patched_logits``, ``generate``: overwrite the residual stream after chosen blocks). All three
agree with the plain-hook reference up to floating-point reassociation.
"""

from __future__ import annotations

from goalprobe.activations.capture.base import (
    BackendUnavailableError,
    CleanRun,
    Patch,
    ResidualBackend,
    TokenBatch,
    decoder_layers_path,
    input_device,
)

BACKENDS: tuple[str, ...] = ("nnsight", "transformer_lens", "hooks")
"""Backend names accepted by :func:`make_backend` (``goalprobe extract/patch --backend``)."""


def make_backend(name: str, model, tokenizer=None, **kwargs) -> ResidualBackend:
    """Build the backend called ``name`` around a loaded model.

    Args:
        name: one of :data:`BACKENDS`.
        model: a Hugging Face causal LM (for nnsight also a ``TransformersModel``).
        tokenizer: the model's tokenizer (nnsight and TransformerLens need it).
        **kwargs: backend options (nnsight: ``remote``, ``model_id``, ``revision``, ``host``,
            ``prefix_cache``; TransformerLens: ``model_id``; hooks: ``prefix_cache``).

    Raises:
        ValueError: an unknown name, or a missing tokenizer.
        BackendUnavailableError: the library cannot wrap this model.
    """
    if name == "nnsight":
        from goalprobe.activations.capture.nnsight_backend import NnsightBackend

        return NnsightBackend(model, tokenizer, **kwargs)
    if name == "transformer_lens":
        from goalprobe.activations.capture.tl_backend import TransformerLensBackend

        if tokenizer is None:
            raise ValueError("wrapping a loaded model with TransformerLens needs its tokenizer")
        return TransformerLensBackend(model, tokenizer, **kwargs)
    if name == "hooks":
        from goalprobe.activations.capture.hooks_backend import HookBackend

        return HookBackend(model, tokenizer, **kwargs)
    raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")


__all__ = [
    "BACKENDS",
    "BackendUnavailableError",
    "CleanRun",
    "Patch",
    "ResidualBackend",
    "TokenBatch",
    "decoder_layers_path",
    "input_device",
    "make_backend",
]
