"""Patched forward passes on the residual stream: an nnsight backend and a TransformerLens one.

"Layer ``L``" is the residual stream *after* decoder block ``L`` (0-based), the same convention
as the activation store. A :class:`Patch` overwrites that stream at some positions of one run
with values taken from another run; the blocks after ``L`` then read the patched stream. A patch
over several layers overwrites each of them.

Both backends run a batch of patches on copies of one target sequence in a single forward pass
(every row is the same length, so there is no padding), read the logits of the last position
only, and give the same numbers up to float rounding:

* :class:`NNsightBackend` (default) wraps the Hugging Face model in
  ``nnsight.modeling.transformers.TransformersModel`` and edits ``model.layers[L].output`` in the
  trace. By default it runs the unpatched prefix once and continues every patched copy from its
  KV cache (``prefix_cache``), so patches late in the sequence are cheap;
* :class:`TransformerLensBackend` wraps it in TransformerLens 4's ``TransformerBridge`` (offline,
  from the loaded model) and edits ``blocks.{L}.hook_resid_post`` with hooks, over the full
  sequence. Booting the bridge switches the model's attention to the eager implementation, in
  place (GPT-OSS uses eager attention anyway).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

BACKENDS: tuple[str, ...] = ("nnsight", "transformer_lens")


class BackendUnavailableError(RuntimeError):
    """A backend cannot wrap the given model (the message says why)."""


@dataclass(frozen=True)
class Patch:
    """One patched run: write ``values`` into the residual stream after each of ``layers``.

    Attributes:
        layers: ``(n_patch_layers,)`` decoder blocks whose output is overwritten.
        positions: ``(k,)`` int64 target positions.
        values: ``(n_patch_layers, k, d_model)`` float, ``values[i]`` goes to ``layers[i]``.
    """

    layers: tuple[int, ...]
    positions: torch.Tensor
    values: torch.Tensor

    def __post_init__(self) -> None:
        if self.values.ndim != 3 or tuple(self.values.shape[:2]) != (
            len(self.layers),
            len(self.positions),
        ):
            raise ValueError(
                f"values must be (n_layers={len(self.layers)}, k={len(self.positions)}, d_model), "
                f"got {tuple(self.values.shape)}"
            )


@dataclass(frozen=True)
class CleanRun:
    """An unpatched run.

    Attributes:
        positions: ``(k,)`` int64 positions captured, ascending.
        layers: ``(n_layers,)`` blocks captured, ascending.
        acts: ``(n_layers, k, d_model)`` float32 residual stream after each block.
        logits: ``(vocab,)`` float32 logits at the last position.
    """

    positions: np.ndarray
    layers: tuple[int, ...]
    acts: torch.Tensor
    logits: torch.Tensor

    def values(self, layers: Sequence[int], positions: np.ndarray) -> torch.Tensor:
        """``(len(layers), len(positions), d_model)`` captured values (KeyError if not captured)."""
        missing = [x for x in layers if x not in self.layers]
        if missing:
            raise KeyError(f"layers {missing} were not captured")
        layer_index = torch.as_tensor([self.layers.index(x) for x in layers], dtype=torch.long)
        positions = np.asarray(positions, dtype=np.int64)
        where = np.searchsorted(self.positions, positions)
        if np.any(where >= len(self.positions)) or np.any(self.positions[where] != positions):
            raise KeyError("some requested positions were not captured")
        return self.acts[layer_index[:, None], torch.as_tensor(where)[None, :]]


class PatchBackend(Protocol):
    """What the experiment needs from a backend."""

    name: str
    n_layers: int

    def clean_run(
        self, token_ids: Sequence[int], layers: Sequence[int], positions: np.ndarray
    ) -> CleanRun:
        """Run unpatched and capture the residual stream at ``layers`` x ``positions``."""
        ...

    def patched_logits(
        self,
        token_ids: Sequence[int],
        patches: Sequence[Patch],
        readout_position: int | None = None,
    ) -> torch.Tensor:
        """``(len(patches), vocab)`` float32 logits at ``readout_position`` (default: the last
        position), one patched copy of ``token_ids`` per patch."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[int],
        patches: Sequence[Patch],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int],
    ) -> list[list[int]]:
        """Greedy completions of the prompt, one per patch (patches apply to the prompt pass)."""
        ...


def _layer_plan(
    patches: Sequence[Patch], device: torch.device, dtype: torch.dtype
) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per layer: ``(rows (m,), positions (m,), values (m, d_model))`` over the whole batch."""
    grouped: dict[int, tuple[list, list, list]] = {}
    for row, patch in enumerate(patches):
        for i, layer in enumerate(patch.layers):
            rows, cols, vals = grouped.setdefault(int(layer), ([], [], []))
            rows.append(torch.full((len(patch.positions),), row, dtype=torch.long))
            cols.append(patch.positions.to(torch.long))
            vals.append(patch.values[i])
    return {
        layer: (
            torch.cat(rows).to(device),
            torch.cat(cols).to(device),
            torch.cat(vals).to(device=device, dtype=dtype),
        )
        for layer, (rows, cols, vals) in sorted(grouped.items())
    }


def decoder_layers_path(model: torch.nn.Module) -> str:
    """Dotted path of the decoder blocks' ``ModuleList`` (``"model.layers"`` for GPT-OSS)."""
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        module = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList):
            return path
    raise BackendUnavailableError(
        f"cannot find the decoder blocks of {type(model).__name__} (tried model.layers, "
        "transformer.h, gpt_neox.layers, model.decoder.layers)"
    )


def _ids_tensor(token_ids: Sequence[int], rows: int, device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64), device=device)
    if ids.ndim != 1 or ids.numel() == 0:
        raise ValueError("token_ids must be a non-empty 1-D sequence")
    return ids.unsqueeze(0).expand(rows, -1).contiguous()


def _check_patches(patches: Sequence[Patch], seq_len: int, n_layers: int) -> None:
    for patch in patches:
        if len(patch.positions) and (
            int(patch.positions.max()) >= seq_len or int(patch.positions.min()) < 0
        ):
            raise ValueError(f"a patch position lies outside the {seq_len}-token sequence")
        if any(not 0 <= layer < n_layers for layer in patch.layers):
            raise ValueError(f"a patch layer lies outside 0..{n_layers - 1}: {patch.layers}")


def _readout(readout_position: int | None, seq_len: int) -> int:
    """The readout as a position in ``[0, seq_len)`` (default: the last one)."""
    if readout_position is None:
        return seq_len - 1
    if not 0 <= readout_position < seq_len:
        raise ValueError(f"readout position {readout_position} outside 0..{seq_len - 1}")
    return int(readout_position)


def _strip_stop(ids: list[int], stop_ids: Sequence[int]) -> list[int]:
    """The ids up to and including the first stop id."""
    for i, token in enumerate(ids):
        if token in stop_ids:
            return ids[: i + 1]
    return ids


class NNsightBackend:
    """Patching through nnsight (``TransformersModel`` over an already loaded HF model).

    Args:
        model: a Hugging Face causal LM (e.g. ``GptOssForCausalLM``) in eval mode.
        tokenizer: its tokenizer.
        prefix_cache: run the unpatched prefix once and continue the batch from its KV cache.
    """

    name = "nnsight"

    def __init__(self, model: torch.nn.Module, tokenizer, *, prefix_cache: bool = True) -> None:
        from nnsight.modeling.transformers import TransformersModel

        self.model = model
        self.tokenizer = tokenizer
        self.prefix_cache = prefix_cache
        self._path = decoder_layers_path(model)
        self.n_layers = len(self._module(model))
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.lm = TransformersModel(model, tokenizer=tokenizer, task="text-generation")
        self._cached_prefix: tuple[bytes, object] | None = None

    def _module(self, root):
        for part in self._path.split("."):
            root = getattr(root, part)
        return root

    def clean_run(
        self, token_ids: Sequence[int], layers: Sequence[int], positions: np.ndarray
    ) -> CleanRun:
        """See :class:`PatchBackend`."""
        ids = _ids_tensor(token_ids, 1, self.device)
        where = torch.as_tensor(np.asarray(positions, dtype=np.int64), device=self.device)
        layers = tuple(sorted(int(layer) for layer in layers))
        blocks = self._module(self.lm)
        saved = []
        with torch.no_grad(), self.lm.trace(ids, logits_to_keep=1, use_cache=False):
            for layer in layers:
                saved.append(blocks[layer].output[0, where].save())
            logits = self.lm.lm_head.output[0, -1].save()
        acts = torch.stack([s.float().cpu() for s in saved]) if saved else torch.empty(0)
        return CleanRun(np.asarray(positions, dtype=np.int64), layers, acts, logits.float().cpu())

    def _intervene(self, patches: Sequence[Patch]) -> None:
        """Write every patch into the trace being built (call inside a trace)."""
        blocks = self._module(self.lm)
        for layer, (rows, cols, vals) in _layer_plan(patches, self.device, self.dtype).items():
            hidden = blocks[layer].output
            hidden[rows, cols] = vals

    def _prefix_cache(self, prefix: np.ndarray, rows: int):
        """The KV cache of the unpatched ``prefix``, repeated for ``rows`` rows (a fresh copy)."""
        key = prefix.tobytes()
        if self._cached_prefix is None or self._cached_prefix[0] != key:
            ids = _ids_tensor(prefix, 1, self.device)
            with torch.no_grad():
                cache = self.model(ids, use_cache=True, logits_to_keep=1).past_key_values
            self._cached_prefix = (key, cache)
        cache = copy.deepcopy(self._cached_prefix[1])
        cache.batch_repeat_interleave(rows)
        return cache

    def patched_logits(
        self,
        token_ids: Sequence[int],
        patches: Sequence[Patch],
        readout_position: int | None = None,
    ) -> torch.Tensor:
        """See :class:`PatchBackend`.

        With ``prefix_cache`` the tokens before the first patched position of the batch (or
        the readout, if earlier) are run once, unpatched, and every copy continues from their KV
        cache (exact under causal attention): a patch near the end of a long sequence costs a
        few tokens, not the sequence.
        """
        if not patches:
            return torch.empty(0)
        ids = np.asarray(token_ids, dtype=np.int64)
        _check_patches(patches, len(ids), self.n_layers)
        readout = _readout(readout_position, len(ids))
        start = 0
        if self.prefix_cache:
            firsts = [int(p.positions.min()) for p in patches if len(p.positions)]
            start = min(min(firsts, default=readout), readout)
        kwargs: dict = {"use_cache": False, "logits_to_keep": len(ids) - readout}
        if start > 0:
            kwargs["use_cache"] = True
            kwargs["past_key_values"] = self._prefix_cache(ids[:start], len(patches))
            patches = [Patch(p.layers, p.positions - start, p.values) for p in patches]
        suffix = _ids_tensor(ids[start:], len(patches), self.device)
        with torch.no_grad(), self.lm.trace(suffix, **kwargs):
            self._intervene(patches)
            logits = self.lm.lm_head.output[:, 0].save()
        return logits.float().cpu()

    def generate(
        self,
        prompt_ids: Sequence[int],
        patches: Sequence[Patch],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int],
    ) -> list[list[int]]:
        """See :class:`PatchBackend`; the patches act on the prompt's forward pass (prefill)."""
        if not patches:
            return []
        ids = _ids_tensor(prompt_ids, len(patches), self.device)
        _check_patches(patches, ids.shape[1], self.n_layers)
        with (
            torch.no_grad(),
            self.lm.generate(
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=list(stop_ids),
                pad_token_id=self.tokenizer.pad_token_id,
            ) as tracer,
        ):
            self._intervene(patches)
            result = tracer.result.save()
        out = result[:, ids.shape[1] :].cpu().tolist()
        return [_strip_stop(row, stop_ids) for row in out]


class TransformerLensBackend:
    """Patching through TransformerLens 4's ``TransformerBridge`` wrapped around a loaded model.

    The bridge is booted offline from the model object (``boot_transformers(hf_model=...)``);
    nothing is downloaded. It hooks ``blocks.{L}.hook_resid_post``. The bridge takes over the
    model: it replaces its submodules with bridge components in place (forward passes, and an
    nnsight backend on the same model, still give the same numbers, but ``save_pretrained`` of
    that model then fails), so keep a separate model instance for anything else.

    Raises:
        BackendUnavailableError: TransformerLens is missing, has no adapter for the
            architecture, or the bridge fails to boot (the message carries the reason).
    """

    name = "transformer_lens"

    def __init__(self, model: torch.nn.Module, tokenizer) -> None:
        try:
            from transformer_lens.model_bridge import TransformerBridge
        except ImportError as err:
            raise BackendUnavailableError(
                f"TransformerLens is not installed ({err}); pip install 'goalprobe[tl]'"
            ) from err
        architecture = type(model).__name__
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        try:
            # A config built in memory carries no `architectures`, and the bridge picks its
            # adapter from that field: name the loaded class (on the bridge's copy of the config).
            self.bridge = TransformerBridge.boot_transformers(
                getattr(model, "name_or_path", "") or architecture,
                hf_model=model,
                tokenizer=tokenizer,
                device=str(self.device),
                dtype=self.dtype,
                hf_config_overrides={"architectures": [architecture]},
            )
        except (ValueError, KeyError, AttributeError, NotImplementedError, OSError) as err:
            raise BackendUnavailableError(
                f"TransformerLens' TransformerBridge cannot wrap this {architecture} offline: "
                f"{type(err).__name__}: {err}"
            ) from err
        self.n_layers = int(self.bridge.cfg.n_layers)

    @staticmethod
    def hook_name(layer: int) -> str:
        """The hook of the residual stream after block ``layer``."""
        return f"blocks.{int(layer)}.hook_resid_post"

    def clean_run(
        self, token_ids: Sequence[int], layers: Sequence[int], positions: np.ndarray
    ) -> CleanRun:
        """See :class:`PatchBackend`."""
        ids = _ids_tensor(token_ids, 1, self.device)
        layers = tuple(sorted(int(layer) for layer in layers))
        names = [self.hook_name(layer) for layer in layers]
        with torch.no_grad():
            logits, cache = self.bridge.run_with_cache(ids, names_filter=names)
        where = torch.as_tensor(np.asarray(positions, dtype=np.int64), device=self.device)
        acts = (
            torch.stack([cache[name][0, where].float().cpu() for name in names])
            if names
            else torch.empty(0)
        )
        return CleanRun(
            np.asarray(positions, dtype=np.int64), layers, acts, logits[0, -1].float().cpu()
        )

    def _hooks(self, patches: Sequence[Patch], seq_len: int) -> list:
        _check_patches(patches, seq_len, self.n_layers)
        hooks = []
        for layer, (rows, cols, vals) in _layer_plan(patches, self.device, self.dtype).items():

            def hook(resid, hook, rows=rows, cols=cols, vals=vals):
                if resid.shape[1] < seq_len:  # a cached decoding step: the prompt is done
                    return resid
                resid[rows, cols] = vals
                return resid

            hooks.append((self.hook_name(layer), hook))
        return hooks

    def patched_logits(
        self,
        token_ids: Sequence[int],
        patches: Sequence[Patch],
        readout_position: int | None = None,
    ) -> torch.Tensor:
        """See :class:`PatchBackend`."""
        if not patches:
            return torch.empty(0)
        ids = _ids_tensor(token_ids, len(patches), self.device)
        readout = _readout(readout_position, ids.shape[1])
        with torch.no_grad():
            logits = self.bridge.run_with_hooks(ids, fwd_hooks=self._hooks(patches, ids.shape[1]))
        return logits[:, readout].float().cpu()

    def generate(
        self,
        prompt_ids: Sequence[int],
        patches: Sequence[Patch],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int],
    ) -> list[list[int]]:
        """See :class:`PatchBackend`; the patches act on the prompt's forward pass (prefill)."""
        if not patches:
            return []
        ids = _ids_tensor(prompt_ids, len(patches), self.device)
        with torch.no_grad(), self.bridge.hooks(fwd_hooks=self._hooks(patches, ids.shape[1])):
            out = self.bridge.hf_generate(
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=list(stop_ids),
                pad_token_id=self.tokenizer.pad_token_id,
                return_type="tokens",
            )
        rows = out[:, ids.shape[1] :].cpu().tolist()
        return [_strip_stop(row, stop_ids) for row in rows]


def make_backend(name: str, model: torch.nn.Module, tokenizer, **kwargs) -> PatchBackend:
    """The backend called ``name`` (``"nnsight"`` or ``"transformer_lens"``) around ``model``.

    ``kwargs`` go to the backend's constructor (``prefix_cache`` for nnsight).
    """
    if name == "nnsight":
        return NNsightBackend(model, tokenizer, **kwargs)
    if name == "transformer_lens":
        return TransformerLensBackend(model, tokenizer, **kwargs)
    raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")
