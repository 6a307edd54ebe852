"""Reference backend: plain PyTorch forward hooks on the decoder blocks.

Runs the base model (no unembedding); the hook of the last requested block raises an internal
exception that ends the forward pass, so later blocks never run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from activations.capture.base import (
    CaptureBackend,
    TokenBatch,
    block_output,
    decoder_layers_path,
    get_submodule_path,
    input_device,
)


class _StopForward(Exception):
    """Raised by the last hook to end the forward pass early."""


class HookCapture(CaptureBackend):
    """Capture with ``register_forward_hook`` (the reference the other backends must match).

    Args:
        model: a loaded Hugging Face causal LM (any device, any dtype, ``device_map`` allowed).
    """

    name = "hooks"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model.config)
        self.model = model
        self.blocks = get_submodule_path(model, decoder_layers_path(model))
        base = getattr(model, "base_model", None)
        self.runner = base if isinstance(base, nn.Module) else model

    def capture(self, batch: TokenBatch, layers: Sequence[int]) -> dict[int, torch.Tensor]:
        """See :meth:`CaptureBackend.capture`; returns ``{layer: (B, K, d_model)}``."""
        layers = self.check_layers(layers)
        last = layers[-1]
        out: dict[int, torch.Tensor] = {}

        def make_hook(layer: int):
            def hook(module, args, output):
                hidden = block_output(output)
                rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
                out[layer] = hidden[rows, batch.positions.to(hidden.device)].detach().cpu()
                if layer == last:
                    raise _StopForward

            return hook

        handles = [self.blocks[x].register_forward_hook(make_hook(x)) for x in layers]
        device = input_device(self.model)
        try:
            with torch.inference_mode():
                self.runner(
                    input_ids=batch.input_ids.to(device),
                    attention_mask=batch.attention_mask.to(device),
                    use_cache=False,
                )
        except _StopForward:
            pass
        finally:
            for handle in handles:
                handle.remove()
        missing = [x for x in layers if x not in out]
        if missing:
            raise RuntimeError(f"the forward pass never reached block(s) {missing}")
        return out
