"""The library backends: nnsight (the default) and TransformerLens.

nnsight runs a trace, locally or on NDIF (``remote``): capture gathers each requested block's
output at the batch's positions inside one trace and stops after the last one; patching (local
only) assigns to ``model.layers[L].output``. Remote execution sends the same trace to an NDIF
server holding the model under its nnsight model key (:func:`ndif_model_key`; API key from
``NDIF_API_KEY`` or nnsight's config); ``remote="local"`` runs nnsight's local simulation.

TransformerLens runs a ``TransformerBridge`` (without weight folding, so
``blocks.{L}.hook_resid_post`` is block ``L``'s output) around a deep copy of the loaded model
(``copy_model``: the bridge changes what it wraps); its generation runs full forwards."""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
from collections.abc import Sequence

import torch
from goalprobe.activations.capture.base import (
    BackendUnavailableError,
    Patch,
    ResidualBackend,
    block_output,
    check_patches,
    decoder_layers_path,
    gather_positions,
    get_submodule_path,
    input_device,
    layer_plan,
)
from torch import nn


class RemoteCaptureError(RuntimeError):
    """An NDIF request failed; the message names the host and the model key."""


def ndif_model_key(repo_id: str, revision: str | None = None) -> str:
    """The nnsight model key under which NDIF serves ``repo_id`` (``TransformersModel(repo_id)
    .to_model_key()`` without asking the Hub, so ``repo_id`` must be canonical)."""
    from nnsight.modeling.transformers import TransformersModel
    from nnsight.util import to_import_path

    payload = {"repo_id": repo_id, "revision": revision, "task": "text-generation"}
    return f"{to_import_path(TransformersModel)}:{json.dumps(payload)}"


@contextlib.contextmanager
def cache_name_accepted():
    """Silence only transformers' ``FutureWarning`` that ``past_key_values`` is deprecated: nnsight
    recognises a KV cache by that name only (:meth:`NnsightBackend.cache_keyword`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`past_key_values` is deprecated", category=FutureWarning
        )
        yield


class NnsightBackend(ResidualBackend):
    """Capture and patch through an nnsight trace of a loaded causal LM (with its tokenizer) or
    an nnsight ``TransformersModel``; ``remote``: False, True (NDIF at ``host``, model key from
    ``model_id`` and ``revision``) or ``"local"``; ``prefix_cache``: run the unpatched prefix
    once (:meth:`ResidualBackend._patched_run`)."""

    name = "nnsight"
    gradient_runner = "nnsight_gradient_run"

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        remote: bool | str = False,
        model_id: str | None = None,
        revision: str | None = None,
        host: str | None = None,
        prefix_cache: bool = True,
    ) -> None:
        from nnsight.modeling.transformers import TransformersModel

        if remote not in (False, True, "local"):
            raise ValueError(f"remote must be False, True or 'local', got {remote!r}")
        if isinstance(model, TransformersModel):
            self.lm = model
        elif isinstance(model, nn.Module):
            if tokenizer is None:
                raise ValueError("wrapping a loaded model with nnsight needs its tokenizer")
            # nnsight's pipeline sets the tokenizer's padding side and pad token: give it a copy
            self.lm = TransformersModel(
                model, tokenizer=copy.deepcopy(tokenizer), task="text-generation"
            )
        else:
            raise TypeError(f"expected a torch model or TransformersModel, got {type(model)}")
        module = self.lm._module
        super().__init__(module, tokenizer if tokenizer is not None else self.lm.tokenizer)
        self.prefix_cache = prefix_cache and remote is False  # a KV cache never leaves the host
        self.remote = remote
        self.host = host
        self.model_id = model_id or self.lm.repo_id
        self.revision = revision
        self._path = decoder_layers_path(module)
        self._module = module

    def model_key(self) -> str:
        """The NDIF model key of the wrapped model (see :func:`ndif_model_key`)."""
        if not self.model_id:
            raise ValueError("remote extraction needs the model's Hub id (model_id)")
        return ndif_model_key(self.model_id, self.revision)

    def _backend(self):
        if not self.remote:
            return None
        if self.remote == "local":
            from nnsight.intervention.backends.local import LocalSimulationBackend

            return LocalSimulationBackend(self.lm)
        from nnsight.intervention.backends.remote import RemoteBackend

        return RemoteBackend(
            self.model_key(),
            host=self.host,
            env={"attn_implementation": self.lm.attn_implementation},
            blocking=True,
        )

    def cache_keyword(self) -> str:
        """``past_key_values`` always: under any other name nnsight masks the suffix alone."""
        return "past_key_values"

    def _capture(self, input_ids, attention_mask, positions, layers, **forward_kwargs):
        device = torch.device("cpu") if self.remote is True else input_device(self._module)
        input_ids = input_ids.to(device)
        attention_mask = attention_mask.to(device)
        blocks = get_submodule_path(self.lm, self._path)
        backend = self._backend()
        try:
            with (
                torch.no_grad(),
                cache_name_accepted(),
                self.lm.trace(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    backend=backend,
                    **forward_kwargs,
                ) as tracer,
            ):
                gathered = []
                for layer in layers:
                    hidden = block_output(blocks[layer].output)
                    gathered.append(gather_positions(hidden, positions).cpu())
                acts = torch.stack(gathered).save()
                tracer.stop()
        except Exception as err:
            if self.remote is True and type(err).__name__ == "RemoteError":
                raise RemoteCaptureError(
                    f"NDIF request for model key {self.model_key()} at {backend.host} failed: {err}"
                ) from err
            raise
        return {layer: acts[i].detach() for i, layer in enumerate(layers)}

    def _blocks(self):
        """The decoder blocks' envoy list of the wrapped model."""
        return get_submodule_path(self.lm, self._path)

    def _clean_forward(self, ids, where, layers, kwargs):
        blocks = self._blocks()
        saved = []
        with (
            torch.no_grad(),
            cache_name_accepted(),
            self.lm.trace(ids, logits_to_keep=1, **{"use_cache": False, **kwargs}),
        ):
            for layer in layers:
                saved.append(blocks[layer].output[0, where].save())
            logits = self.lm.lm_head.output[0, -1].save()
        return saved, logits

    def _intervene(self, patches: Sequence[Patch]) -> None:
        """Write every patch into the trace being built (call inside a trace)."""
        blocks = self._blocks()
        for layer, (rows, cols, vals) in layer_plan(patches, self.device, self.dtype).items():
            hidden = blocks[layer].output
            hidden[rows, cols] = vals

    def _patched_forward(
        self, ids: torch.Tensor, kwargs: dict, patches: Sequence[Patch]
    ) -> torch.Tensor:
        with torch.no_grad(), cache_name_accepted(), self.lm.trace(ids, **kwargs):
            self._intervene(patches)
            logits = self.lm.lm_head.output.save()
        return logits

    def _generate(self, ids, patches, max_new_tokens, stop_ids):
        _, kwargs, patches = self._generation_prefix(ids, patches, max_new_tokens, stop_ids)
        with torch.no_grad(), cache_name_accepted(), self.lm.generate(ids, **kwargs) as tracer:
            self._intervene(patches)
            result = tracer.result.save()
        return result


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
