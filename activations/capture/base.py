"""What every residual-stream backend shares: the padded token batch, patches, clean runs and the
backend interface (:class:`ResidualBackend`), and its reference implementation with plain PyTorch
forward hooks on the decoder blocks (:class:`HookBackend`: capture stops after the last requested
block; patching overwrites a block's output in place).

The residual stream "at layer L" is the *output* of decoder block ``L`` (0-based), i.e.
``hidden_states[L + 1]``. Sequences are right-padded, so a row's activations do not depend on
the other rows; a batch of patches runs on equal-length copies of one target sequence."""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from goalprobe.agents.models import cache_keyword, output_cache
from torch import nn
from torch.nn.utils.rnn import pad_sequence

_LAYER_PATHS: tuple[str, ...] = (
    "model.layers",
    "model.language_model.layers",
    "transformer.h",
    "gpt_neox.layers",
    "model.decoder.layers",
)


@dataclass(frozen=True)
class TokenBatch:
    """Right-padded ``(B, T)`` int64 token ids of ``B`` sequences, their attention mask (1 on
    real tokens) and the ``(B, K)`` positions to read in each row's real tokens."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def from_sequences(
        cls,
        sequences: Sequence[Sequence[int]],
        positions: Sequence[Sequence[int]],
        pad_id: int = 0,
    ) -> TokenBatch:
        """Pad ``B`` id lists on the right; ``positions``: ``B`` rows of ``K`` ints inside their
        row."""
        if len(sequences) == 0 or len(sequences) != len(positions):
            raise ValueError(
                f"need as many position rows as sequences (>0), got {len(sequences)} sequences "
                f"and {len(positions)} position rows"
            )
        rows = [torch.as_tensor(list(s), dtype=torch.long) for s in sequences]
        lengths = [len(r) for r in rows]
        ids = pad_sequence(rows, batch_first=True, padding_value=int(pad_id))
        mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True)
        pos = torch.as_tensor([list(p) for p in positions], dtype=torch.long)
        if pos.ndim != 2:
            raise ValueError(f"positions must be B rows of K ints, got shape {tuple(pos.shape)}")
        for i, length in enumerate(lengths):
            if pos[i].min() < 0 or pos[i].max() >= length:
                raise ValueError(
                    f"row {i}: positions {pos[i].tolist()} fall outside its {length} tokens"
                )
        return cls(ids, mask, pos)

    @property
    def size(self) -> int:
        """Number of rows ``B``."""
        return int(self.input_ids.shape[0])


class BackendUnavailableError(RuntimeError):
    """A backend cannot wrap the given model (the message says why)."""


@dataclass(frozen=True)
class Patch:
    """One patched run: ``values[i]`` ``(k, d_model)`` overwrites the output of block
    ``layers[i]`` at the ``(k,)`` int64 ``positions``."""

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
    """An unpatched run of one sequence: ``acts`` ``(n_layers, k, d_model)`` float32 after the
    ascending ``layers`` at the ascending ``positions``, and the last position's logits."""

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


class ResidualBackend(ABC):
    """One library's access to the residual stream after chosen decoder blocks, to capture and
    patch (``tokenizer`` gives the pad id). A subclass implements :meth:`_capture` (stopping
    after the last requested block), :meth:`_clean_forward`, :meth:`generate` and, to read
    logits, :meth:`_patched_forward`."""

    name: str = ""
    """Backend name recorded in the store's ``backend`` attribute and the patching results."""

    gradient_runner: str | None = None
    """The function of :mod:`~goalprobe.activations.capture.gradients` that runs
    :meth:`gradient_run` for this backend (None: it records no gradients)."""

    prefix_cache: bool = False
    """Whether :meth:`patched_logits` runs the unpatched prefix once (see :meth:`_patched_run`)."""

    def __init__(self, model: nn.Module, tokenizer=None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.n_layers = int(model.config.num_hidden_layers)
        self.d_model = int(model.config.hidden_size)
        vocab = getattr(model.config, "vocab_size", None)
        self.vocab_size: int | None = None if vocab is None else int(vocab)
        """Rows of the input embedding (token ids must be below it); None when unknown."""
        self._cached_prefix: tuple[bytes, Any] | None = None  # (prefix bytes, KV cache)
        self.capture_tokens = {"replayed": 0, "run": 0}
        """Token positions :meth:`capture` was handed (``replayed``: batch x padded width) and
        the ones the model ran (``run``: the suffixes after a cached prefix, plus each prefix
        forward); equal without the prefix cache."""

    @property
    def attention(self) -> str:
        """The attention kernel the model runs (``_attn_implementation``; '' when unknown)."""
        return str(getattr(self.config, "_attn_implementation", None) or "")

    @property
    def device(self) -> torch.device:
        """Device of the model's first parameter (where patch values and token ids go)."""
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The model's parameter dtype (patch values are cast to it)."""
        return next(self.model.parameters()).dtype

    @property
    def pad_token_id(self) -> int | None:
        """Pad id passed to generation (the tokenizer's, else the model config's)."""
        if self.tokenizer is not None:
            return self.tokenizer.pad_token_id
        return getattr(self.config, "pad_token_id", None)

    def check_layers(self, layers: Sequence[int]) -> list[int]:
        """``layers`` sorted and validated against the model's depth."""
        out = sorted({int(x) for x in layers})
        if not out:
            raise ValueError("no layers requested")
        if out[0] < 0 or out[-1] >= self.n_layers:
            raise ValueError(
                f"layers {out} out of range: the model has {self.n_layers} decoder blocks "
                f"(0 .. {self.n_layers - 1})"
            )
        return out

    min_shared_prefix: int = 16
    """Shortest shared prefix worth running once in :meth:`capture` (tokens)."""

    def capture(self, batch: TokenBatch, layers: Sequence[int]) -> dict[int, torch.Tensor]:
        """``{layer: (B, K, d_model)}`` CPU block outputs at ``batch.positions`` (model dtype);
        with :attr:`prefix_cache`, the tokens every row shares before its first read position
        run once and the batch continues from their KV cache."""
        layers = self.check_layers(layers)
        self.capture_tokens["replayed"] += int(batch.input_ids.numel())
        start = self.shared_prefix_length(batch) if self.prefix_cache else 0
        if start < self.min_shared_prefix:
            self.capture_tokens["run"] += int(batch.input_ids.numel())
            return self._capture(batch.input_ids, batch.attention_mask, batch.positions, layers)
        start = self._reusable_prefix_length(batch.input_ids[0, :start].numpy())
        prefix = batch.input_ids[0, :start].numpy()
        if self._cached_prefix is None or self._cached_prefix[0] != prefix.tobytes():
            self.capture_tokens["run"] += len(prefix)  # a new prefix runs once (_prefix_kv)
        self.capture_tokens["run"] += batch.size * (batch.input_ids.shape[1] - start)
        kwargs = {"use_cache": True, self.cache_keyword(): self._prefix_kv(prefix, batch.size)}
        return self._capture(
            batch.input_ids[:, start:], batch.attention_mask, batch.positions - start, layers,
            **kwargs,
        )  # fmt: skip

    def _reusable_prefix_length(self, prefix: np.ndarray) -> int:
        """How much of a shared ``prefix`` to run once: up to its last harmony ``<|start|>``, so
        all batches of a template share one cache."""
        from goalprobe.agents.harmony import START

        if self.tokenizer is None or START not in self.tokenizer.get_vocab():
            return len(prefix)
        starts = np.flatnonzero(prefix == self.tokenizer.convert_tokens_to_ids(START))
        starts = starts[starts >= self.min_shared_prefix]
        return int(starts[-1]) if len(starts) else len(prefix)

    @staticmethod
    def shared_prefix_length(batch: TokenBatch) -> int:
        """Tokens at the start that every row shares (real tokens, before every row's first
        read position, leaving each row at least one token to run)."""
        ids, mask = batch.input_ids, batch.attention_mask
        shared = _shared_length((ids == ids[:1]) & (mask == 1))
        return max(0, min(shared, int(batch.positions.min()), int(mask.sum(dim=1).min()) - 1))

    @abstractmethod
    def _capture(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        layers: list[int],
        **forward_kwargs,
    ) -> dict[int, torch.Tensor]:
        """:meth:`capture` on ``input_ids`` ``(B, T')`` (the suffix after the KV cache in
        ``forward_kwargs``, if any) with ``positions`` ``(B, K)`` relative to ``input_ids``."""

    def clean_run(
        self, token_ids: Sequence[int] | np.ndarray, layers: Sequence[int], positions: np.ndarray
    ) -> CleanRun:
        """Run ``token_ids`` unpatched: the residual stream at ``layers`` x ``positions`` and the
        last position's logits (with :attr:`prefix_cache`: :meth:`_clean_prefix`)."""
        token_ids = np.asarray(token_ids, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        start, kwargs = self._clean_prefix(token_ids, positions)
        ids = ids_tensor(token_ids[start:], 1, self.device)
        where = torch.as_tensor(positions - start, device=self.device)
        layers = tuple(sorted(int(layer) for layer in layers))
        saved, logits = self._clean_forward(ids, where, layers, kwargs)
        acts = torch.stack([s.float().cpu() for s in saved]) if layers else torch.empty(0)
        return CleanRun(positions, layers, acts, logits.float().cpu())

    @abstractmethod
    def _clean_forward(
        self, ids: torch.Tensor, where: torch.Tensor, layers: tuple[int, ...], kwargs: dict
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """One unpatched forward pass of ``ids`` ``(1, S')`` (``kwargs``: its cached prefix):
        ``(per layer (k, d_model) values at where, (vocab,) logits of the last position)``."""

    def patched_logits(
        self,
        token_ids: Sequence[int] | np.ndarray,
        patches: Sequence[Patch],
        readout_position: int | None = None,
    ) -> torch.Tensor:
        """``(len(patches), vocab)`` float32 logits at ``readout_position`` (default: the last), one
        patched copy of ``token_ids`` per patch (with :attr:`prefix_cache`:
        :meth:`_patched_run`)."""
        if not patches:
            return torch.empty(0)
        logits = self._patched_forward(*self._patched_run(token_ids, patches, readout_position))
        return logits[:, 0].float().cpu()

    def generate(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        patches: Sequence[Patch],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int],
    ) -> list[list[int]]:
        """Greedy completions, one per patch (applied to the prompt pass only), each cut after its
        first stop id; ``prompt_ids``: one prompt or equal-length prompts (:func:`prompt_batch`)."""
        if not patches:
            return []
        ids = prompt_batch(prompt_ids, len(patches), self.device)
        check_patches(patches, ids.shape[1], self.n_layers)
        out = self._generate(ids, list(patches), max_new_tokens, list(stop_ids))
        return [strip_stop(row, stop_ids) for row in out[:, ids.shape[1] :].cpu().tolist()]

    @abstractmethod
    def _generate(
        self, ids: torch.Tensor, patches: list[Patch], max_new_tokens: int, stop_ids: list[int]
    ) -> torch.Tensor:
        """``(B, S + n)`` ids: the prompts ``ids (B, S)`` and their greedy continuations."""

    def gradient_run(
        self,
        token_ids: Sequence[int] | np.ndarray,
        layers: Sequence[int],
        positions: np.ndarray,
        metric,
        readout_positions: Sequence[int] | np.ndarray,
        *,
        drops: Sequence[int | None] = (None,),
    ):
        """A :class:`~goalprobe.activations.capture.gradients.GradientRun` of one teacher-forced
        sequence (``GradientUnsupportedError``: this backend or the model's kernels cannot)."""
        from goalprobe.activations.capture import gradients

        if self.gradient_runner is None:
            raise gradients.GradientUnsupportedError(
                f"the {self.name} backend records no gradients; use the hooks or nnsight backend"
            )
        runner = getattr(gradients, self.gradient_runner)
        return gradients.gradient_run(
            self, runner, token_ids, layers, positions, metric, readout_positions, drops
        )

    def patched_logits_at(
        self,
        token_ids: Sequence[int] | np.ndarray,
        patches: Sequence[Patch],
        readout_positions: Sequence[int] | np.ndarray,
    ) -> torch.Tensor:
        """``(len(patches), R, vocab)`` logits at non-decreasing ``readout_positions`` of each
        patched copy (every logit from the first readout on is computed: keep ``R`` small)."""
        from goalprobe.activations.capture.gradients import result_dtype

        readouts = np.asarray(readout_positions, dtype=np.int64)
        if not patches:
            return torch.empty(0)
        if readouts.ndim != 1 or len(readouts) == 0 or np.any(np.diff(readouts) < 0):
            raise ValueError("readout_positions must be non-decreasing and non-empty")
        first = int(readouts[0])
        logits = self._patched_forward(*self._patched_run(token_ids, patches, first))
        index = torch.as_tensor(readouts - first, device=logits.device)
        return logits[:, index].to(result_dtype(logits.dtype)).cpu()

    @abstractmethod
    def _patched_forward(
        self, ids: torch.Tensor, kwargs: dict, patches: Sequence[Patch]
    ) -> torch.Tensor:
        """``(rows, kept positions, vocab)`` logits of one no-grad forward of what
        :meth:`_patched_run` prepared."""

    def _patched_run(
        self,
        token_ids: Sequence[int] | np.ndarray,
        patches: Sequence[Patch],
        readout_position: int | None,
    ) -> tuple[torch.Tensor, dict, list[Patch]]:
        """``(ids (len(patches), S), forward kwargs, patches)`` of a batch of patched copies; with
        :attr:`prefix_cache` the tokens before the first patched position (or the readout) come
        from a KV cache and ids and positions are the suffix's. The readout is the first logit
        row."""
        ids = np.asarray(token_ids, dtype=np.int64)
        check_patches(patches, len(ids), self.n_layers)
        readout = len(ids) - 1 if readout_position is None else int(readout_position)
        if not 0 <= readout < len(ids):
            raise ValueError(f"readout position {readout_position} outside 0..{len(ids) - 1}")
        start = 0
        if self.prefix_cache:
            firsts = [int(p.positions.min()) for p in patches if len(p.positions)]
            start = min(min(firsts, default=readout), readout)
        kwargs: dict = {"use_cache": False, "logits_to_keep": len(ids) - readout}
        patches = list(patches)
        if start > 0:
            kwargs["use_cache"] = True
            kwargs[self.cache_keyword()] = self._prefix_kv(ids[:start], len(patches))
            patches = [Patch(p.layers, p.positions - start, p.values) for p in patches]
        return ids_tensor(ids[start:], len(patches), self.device), kwargs, patches

    def _clean_prefix(self, ids: np.ndarray, positions: np.ndarray) -> tuple[int, dict]:
        """``(start, forward kwargs)`` of a clean run: with :attr:`prefix_cache`, the tokens before
        the first read position (cut as :meth:`_reusable_prefix_length`) come from the cached
        prefix."""
        first = int(np.min(positions)) if len(positions) else len(ids) - 1
        start = min(first, len(ids) - 1)
        if not self.prefix_cache or start < self.min_shared_prefix:
            return 0, {}
        start = self._reusable_prefix_length(np.asarray(ids[:start]))
        if start < self.min_shared_prefix:
            return 0, {}
        return start, {"use_cache": True, self.cache_keyword(): self._prefix_kv(ids[:start], 1)}

    def _generation_prefix(
        self, ids: torch.Tensor, patches: Sequence[Patch], max_new_tokens: int, stop_ids: list[int]
    ) -> tuple[int, dict, list[Patch]]:
        """``(start, greedy generate kwargs, patches)`` of prompts ``ids (B, S)``: with
        :attr:`prefix_cache` the shared tokens before the first patch (cut as in :meth:`capture`)
        run once, leaving two or more."""
        patches = list(patches)
        kwargs = {
            "max_new_tokens": max_new_tokens,
            "do_sample": False,
            "eos_token_id": stop_ids,
            "pad_token_id": self.pad_token_id,
        }
        shared = _shared_length(ids == ids[:1])
        firsts = [int(p.positions.min()) for p in patches if len(p.positions)]
        start = min(shared, min(firsts, default=shared), ids.shape[1] - 2)
        if not self.prefix_cache or not patches or start < self.min_shared_prefix:
            return 0, kwargs, patches
        start = self._reusable_prefix_length(ids[0, :start].cpu().numpy())
        kwargs[self.cache_keyword()] = self._prefix_kv(ids[0, :start].cpu().numpy(), len(ids))
        return start, kwargs, [Patch(p.layers, p.positions - start, p.values) for p in patches]

    def cache_keyword(self) -> str:
        """The keyword the forward call takes a KV cache by
        (:func:`~goalprobe.agents.models.cache_keyword`)."""
        return cache_keyword(self.model)

    def _prefix_kv(self, prefix: np.ndarray, rows: int):
        """The KV cache of the unpatched ``prefix``, repeated for ``rows`` rows (a fresh copy)."""
        key = prefix.tobytes()
        if self._cached_prefix is None or self._cached_prefix[0] != key:
            ids = ids_tensor(prefix, 1, self.device)
            with torch.no_grad():
                cache = output_cache(self.model(ids, use_cache=True, logits_to_keep=1))
            self._cached_prefix = (key, cache)
        cache = copy.deepcopy(self._cached_prefix[1])
        cache.batch_repeat_interleave(rows)
        return cache


def _shared_length(same: torch.Tensor) -> int:
    """Leading columns of a ``(B, T)`` bool tensor that are True in every row."""
    return int(torch.cumprod(same.all(dim=0).long(), dim=0).sum())


def layer_plan(
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


def ids_tensor(
    token_ids: Sequence[int] | np.ndarray, rows: int, device: torch.device
) -> torch.Tensor:
    """``(rows, S)`` int64 copies of one non-empty id sequence on ``device``."""
    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64), device=device)
    if ids.ndim != 1 or ids.numel() == 0:
        raise ValueError("token_ids must be a non-empty 1-D sequence")
    return ids.unsqueeze(0).expand(rows, -1).contiguous()


def prompt_batch(prompt_ids, rows: int, device: torch.device) -> torch.Tensor:
    """``(rows, S)`` int64 prompts of :meth:`ResidualBackend.generate`: one 1-D prompt copied
    ``rows`` times, or a 2-D ``(rows, S)`` array of equal-length prompts taken as they are."""
    ids = np.asarray(prompt_ids, dtype=np.int64)
    if ids.ndim == 1:
        return ids_tensor(ids, rows, device)
    if ids.ndim != 2 or ids.shape[0] != rows or ids.shape[1] == 0:
        raise ValueError(
            f"prompt_ids must be one prompt or one equal-length prompt per patch ({rows}), "
            f"got shape {ids.shape}"
        )
    return torch.as_tensor(ids, device=device).contiguous()


def check_patches(patches: Sequence[Patch], seq_len: int, n_layers: int) -> None:
    """Raise ValueError for a patch position outside the sequence or a layer outside the model."""
    for patch in patches:
        if len(patch.positions) and (
            int(patch.positions.max()) >= seq_len or int(patch.positions.min()) < 0
        ):
            raise ValueError(f"a patch position lies outside the {seq_len}-token sequence")
        if any(not 0 <= layer < n_layers for layer in patch.layers):
            raise ValueError(f"a patch layer lies outside 0..{n_layers - 1}: {patch.layers}")


def strip_stop(ids: list[int], stop_ids: Sequence[int]) -> list[int]:
    """The ids up to and including the first stop id."""
    for i, token in enumerate(ids):
        if token in stop_ids:
            return ids[: i + 1]
    return ids


def get_submodule_path(root: nn.Module, path: str) -> nn.Module | None:
    """``root.a.b.c`` for ``path = "a.b.c"``, or None when an attribute is missing."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def decoder_layers_path(model: nn.Module) -> str:
    """Dotted path of ``model``'s decoder block list (``"model.layers"`` for GPT-OSS)."""
    for path in _LAYER_PATHS:
        if isinstance(get_submodule_path(model, path), nn.ModuleList):
            return path
    raise ValueError(
        f"cannot find the decoder blocks of {type(model).__name__}; looked for "
        f"{', '.join(_LAYER_PATHS)}"
    )


def input_device(model: nn.Module) -> torch.device:
    """Device of the input embeddings (where token ids go; ``device_map`` models included)."""
    return model.get_input_embeddings().weight.device


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``(B, K, d_model)`` rows of ``hidden`` ``(B, T, d_model)`` at ``positions`` ``(B, K)``."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
    return hidden[rows, positions.to(hidden.device)]


def block_output(output) -> torch.Tensor:
    """The hidden state of a decoder block's output (a tensor, or the first element of a tuple)."""
    return output[0] if isinstance(output, tuple) else output


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
