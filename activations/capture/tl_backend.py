"""TransformerLens backend: a ``TransformerBridge`` around the loaded Hugging Face model.

``TransformerBridge.boot_transformers(model_id, hf_model=model, tokenizer=tokenizer)`` wraps an
already-loaded model offline (TransformerLens 4 supports GPT-OSS). The bridge keeps the raw
Hugging Face weights (no weight folding), so ``blocks.{L}.hook_resid_post`` is the output of
block ``L``; ``run_with_cache(..., stop_at_layer=max(layers) + 1)`` skips later blocks and the
unembedding.

The bridge modifies the wrapped model in place (it swaps the blocks for bridge components and
switches attention to the eager implementation): give it its own model, not one that another
backend also uses.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from activations.capture.base import CaptureBackend, TokenBatch, input_device


class TransformerLensCapture(CaptureBackend):
    """Capture with a TransformerLens ``TransformerBridge``.

    Args:
        model: a loaded Hugging Face causal LM of an architecture TransformerLens supports
            (wrapped in place, see the module docstring).
        tokenizer: its tokenizer (needed to wrap without downloading one).
        model_id: name recorded by the bridge (default: the model's ``name_or_path``).
    """

    name = "transformer_lens"

    def __init__(self, model: nn.Module, tokenizer, *, model_id: str | None = None) -> None:
        from transformer_lens.model_bridge import TransformerBridge

        super().__init__(model.config)
        if not getattr(model.config, "architectures", None):
            # Models built from a config (not loaded from a checkpoint) lack the field the
            # bridge selects its adapter by; it is the class name for every HF causal LM.
            model.config.architectures = [type(model).__name__]
        name = model_id or getattr(model.config, "name_or_path", "") or type(model).__name__
        self.model = model
        # the bridge edits the tokenizer it is given (init kwargs, BOS handling): give it a copy
        self.bridge = TransformerBridge.boot_transformers(
            name, hf_model=model, tokenizer=copy.deepcopy(tokenizer)
        )

    def capture(self, batch: TokenBatch, layers: Sequence[int]) -> dict[int, torch.Tensor]:
        """See :meth:`CaptureBackend.capture`; returns ``{layer: (B, K, d_model)}``."""
        layers = self.check_layers(layers)
        names = [f"blocks.{x}.hook_resid_post" for x in layers]
        device = input_device(self.model)
        with torch.inference_mode():
            _, cache = self.bridge.run_with_cache(
                batch.input_ids.to(device),
                attention_mask=batch.attention_mask.to(device),
                names_filter=names,
                stop_at_layer=layers[-1] + 1,
            )
        out = {}
        for layer, name in zip(layers, names, strict=True):
            hidden = cache[name]
            rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
            out[layer] = hidden[rows, batch.positions.to(hidden.device)].detach().cpu()
        return out
