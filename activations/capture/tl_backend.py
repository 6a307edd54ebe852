"""TransformerLens backend: a ``TransformerBridge`` (without weight folding, so
``blocks.{L}.hook_resid_post`` is block ``L``'s output) around a deep copy of the loaded model
(``copy_model``: the bridge changes what it wraps); generation runs full forwards."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from goalprobe.activations.capture.base import (
    BackendUnavailableError,
    Patch,
    ResidualBackend,
    check_patches,
    gather_positions,
    input_device,
    layer_plan,
)
from torch import nn


class TransformerLensBackend(ResidualBackend):
    """Capture and patch with a TransformerLens ``TransformerBridge`` (``model_id``: the name it
    records); :class:`BackendUnavailableError` when it cannot wrap the model."""

    name = "transformer_lens"

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        model_id: str | None = None,
        copy_model: bool = True,
    ) -> None:
        try:
            from transformer_lens.model_bridge import TransformerBridge
        except ImportError as err:
            raise BackendUnavailableError(
                f"TransformerLens is not installed ({err}); pip install 'goalprobe[tl]'"
            ) from err
        super().__init__(model, tokenizer)
        architecture = type(model).__name__
        name = model_id or getattr(model.config, "name_or_path", "") or architecture
        try:
            # the bridge picks its adapter from `architectures` (absent from an in-memory
            # config) and edits the tokenizer it is given
            self.bridge = TransformerBridge.boot_transformers(
                name,
                hf_model=copy.deepcopy(model) if copy_model else model,
                tokenizer=copy.deepcopy(tokenizer),
                device=str(self.device),
                dtype=self.dtype,
                hf_config_overrides={"architectures": [architecture]},
            )
        except (ValueError, KeyError, AttributeError, NotImplementedError, OSError) as err:
            raise BackendUnavailableError(
                f"TransformerLens' TransformerBridge cannot wrap this {architecture} offline: "
                f"{type(err).__name__}: {err}"
            ) from err

    @property
    def attention(self) -> str:
        """``eager``: the bridge runs the model under eager attention whatever it was loaded
        with."""
        return "eager"

    @staticmethod
    def hook_name(layer: int) -> str:
        """The hook of the residual stream after block ``layer``."""
        return f"blocks.{int(layer)}.hook_resid_post"

    def _capture(self, input_ids, attention_mask, positions, layers, **forward_kwargs):
        """See :meth:`ResidualBackend._capture` (no prefix cache: ``prefix_cache`` is False)."""
        if forward_kwargs:
            raise ValueError("the TransformerLens backend runs whole sequences (no KV cache)")
        names = [self.hook_name(x) for x in layers]
        device = input_device(self.model)
        with torch.inference_mode():
            _, cache = self.bridge.run_with_cache(
                input_ids.to(device),
                attention_mask=attention_mask.to(device),
                names_filter=names,
                stop_at_layer=layers[-1] + 1,
            )
        return {
            layer: gather_positions(cache[name], positions).detach().cpu()
            for layer, name in zip(layers, names, strict=True)
        }

    def _clean_forward(self, ids, where, layers, kwargs):
        """See :meth:`ResidualBackend._clean_forward` (no prefix cache: ``kwargs`` is empty)."""
        names = [self.hook_name(layer) for layer in layers]
        with torch.no_grad():
            logits, cache = self.bridge.run_with_cache(ids, names_filter=names)
        return [cache[name][0, where] for name in names], logits[0, -1]

    def _hooks(self, patches: Sequence[Patch], seq_len: int) -> list:
        check_patches(patches, seq_len, self.n_layers)
        hooks = []
        for layer, (rows, cols, vals) in layer_plan(patches, self.device, self.dtype).items():

            def hook(resid, hook, rows=rows, cols=cols, vals=vals):
                if resid.shape[1] < seq_len:  # a cached decoding step: the prompt is done
                    return resid
                resid[rows, cols] = vals
                return resid

            hooks.append((self.hook_name(layer), hook))
        return hooks

    def _patched_forward(self, ids, kwargs, patches):
        """See :meth:`ResidualBackend._patched_forward` (no prefix cache: ``ids`` are whole)."""
        with torch.no_grad():
            logits = self.bridge.run_with_hooks(ids, fwd_hooks=self._hooks(patches, ids.shape[1]))
        return logits[:, ids.shape[1] - kwargs["logits_to_keep"] :]

    def _generate(self, ids, patches, max_new_tokens, stop_ids):
        hooks = self._hooks(patches, ids.shape[1])
        stops = torch.as_tensor(stop_ids, device=self.device)
        done = torch.zeros(len(patches), dtype=torch.bool, device=self.device)
        with torch.no_grad():
            for _ in range(max_new_tokens):
                # every pass reruns the prompt under its patches (causal: the same as patching
                # a prefill once), then the tokens generated so far
                logits = self.bridge.run_with_hooks(ids, fwd_hooks=hooks)
                nxt = logits[:, -1].argmax(dim=-1)
                nxt = torch.where(done, ids[:, -1], nxt)  # finished rows repeat their stop
                ids = torch.cat([ids, nxt[:, None]], dim=1)
                done |= torch.isin(nxt, stops)
                if bool(done.all()):
                    break
        return ids
