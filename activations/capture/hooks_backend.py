"""Reference backend: plain PyTorch forward hooks on the decoder blocks (capture stops after the
last requested block; patching overwrites a block's output in place)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from goalprobe.activations.capture.base import (
    Patch,
    ResidualBackend,
    block_output,
    decoder_layers_path,
    gather_positions,
    get_submodule_path,
    input_device,
    layer_plan,
)
from torch import nn


class _StopForward(Exception):
    """Raised by the last hook to end the forward pass early."""


class HookBackend(ResidualBackend):
    """Capture and patch with ``register_forward_hook`` (the reference of the other backends;
    ``device_map`` models allowed for capture)."""

    name = "hooks"
    gradient_runner = "hooks_gradient_run"

    def __init__(self, model: nn.Module, tokenizer=None, *, prefix_cache: bool = True) -> None:
        super().__init__(model, tokenizer)
        self.prefix_cache = prefix_cache
        path = decoder_layers_path(model)
        blocks = get_submodule_path(model, path)
        if blocks is None:
            raise ValueError(f"{type(model).__name__} has no decoder blocks at {path!r}")
        self.blocks = blocks
        base = getattr(model, "base_model", None)
        self.runner = base if isinstance(base, nn.Module) else model

    @contextlib.contextmanager
    def _hooked(self, hooks: dict[int, Callable]) -> Iterator[None]:
        """Forward hooks on the blocks ``hooks`` names, removed on exit."""
        handles = [self.blocks[layer].register_forward_hook(h) for layer, h in hooks.items()]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _capture(self, input_ids, attention_mask, positions, layers, **forward_kwargs):
        last = layers[-1]
        out: dict[int, torch.Tensor] = {}

        def make_hook(layer: int):
            def hook(module, args, output):
                out[layer] = gather_positions(block_output(output), positions).detach().cpu()
                if layer == last:
                    raise _StopForward

            return hook

        device = input_device(self.model)
        try:
            with self._hooked({x: make_hook(x) for x in layers}), torch.inference_mode():
                self.runner(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    **{"use_cache": False, **forward_kwargs},
                )
        except _StopForward:
            pass
        missing = [x for x in layers if x not in out]
        if missing:
            raise RuntimeError(f"the forward pass never reached block(s) {missing}")
        return out

    def _clean_forward(self, ids, where, layers, kwargs):
        saved: dict[int, torch.Tensor] = {}

        def reader(layer: int):
            def hook(module, args, output):
                hidden = block_output(output)
                saved[layer] = hidden[0, where.to(hidden.device)].detach()

            return hook

        with torch.no_grad(), self._hooked({x: reader(x) for x in layers}):
            logits = self.model(ids, logits_to_keep=1, **{"use_cache": False, **kwargs}).logits
        return [saved[x] for x in layers], logits[0, -1]

    def _writers(self, patches: Sequence[Patch], prompt_length: int = 0) -> dict[int, Callable]:
        """Hooks writing patch ``i`` into row ``i``'s block outputs (in place), skipping passes over
        fewer than ``prompt_length`` tokens (the decoding steps after a patched prompt)."""
        hooks = {}
        for layer, (rows, cols, vals) in layer_plan(patches, self.device, self.dtype).items():

            def hook(module, args, output, rows=rows, cols=cols, vals=vals):
                hidden = block_output(output)
                if hidden.shape[1] < prompt_length:
                    return
                hidden[rows.to(hidden.device), cols.to(hidden.device)] = vals.to(hidden.device)

            hooks[layer] = hook
        return hooks

    def _patched_forward(
        self, ids: torch.Tensor, kwargs: dict, patches: Sequence[Patch]
    ) -> torch.Tensor:
        with torch.no_grad(), self._hooked(self._writers(patches)):
            return self.model(ids, **kwargs).logits

    def _generate(self, ids, patches, max_new_tokens, stop_ids):
        start, kwargs, patches = self._generation_prefix(ids, patches, max_new_tokens, stop_ids)
        with torch.no_grad(), self._hooked(self._writers(patches, ids.shape[1] - start)):
            return self.model.generate(ids, **kwargs)
