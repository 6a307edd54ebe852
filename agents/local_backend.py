"""Rollout backend running any transformers causal LM in this process (GPT-OSS-20B, bundled agent,
a think-tag reasoning model such as Qwen3).

Prompts are rendered in the model's chat format (:mod:`goalprobe.agents.chat_format`), a batch
is sampled with ``model.generate`` up to the format's stop ids, and each completion is split
into reasoning and answer. The system and developer messages every prompt shares are run once
and their KV cache reused (a copy repeated over the batch), with rows grouped by prompt length
so none is padded (padding after the prefix would shift sliding-window attention);
conversations without a shared prefix go in one left-padded call. Every row samples from its
own ``torch.Generator`` (:class:`PerRowSampler`), so a completion depends only on the model,
its prompt and its seed, never on the rest of the batch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from goalprobe.agents.backend import (
    ChatFormatBackend,
    Completion,
    FinishReason,
    SamplingConfig,
    check_seeds,
)
from goalprobe.agents.chat_format import ChatFormat, HarmonyFormat, chat_format_for
from goalprobe.agents.harmony import DEFAULT_SYSTEM, Message, SystemContent
from goalprobe.agents.models import cache_keyword, load_model
from transformers import LogitsProcessor, LogitsProcessorList


class LocalBackend(ChatFormatBackend):
    """Sample completions in the model's chat format from a local causal LM.

    ``model``: a transformers causal LM (``GptOssForCausalLM``, ``Qwen3ForCausalLM``), put in
    eval mode; ``system``: the harmony system content of every prompt (a think-tag template
    renders its own); ``chat_format`` None detects it from ``tokenizer``
    (:func:`~goalprobe.agents.chat_format.chat_format_for`).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        system: SystemContent = DEFAULT_SYSTEM,
        chat_format: ChatFormat | None = None,
    ) -> None:
        fmt = chat_format if chat_format is not None else chat_format_for(tokenizer)
        self._harmony = fmt.name == "harmony"
        if self._harmony:  # its prompts open with this backend's system content
            fmt = replace(cast(HarmonyFormat, fmt), system=system)
        self.chat_format: ChatFormat = fmt
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stop_ids = tuple(int(i) for i in self.chat_format.stop_ids)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.stop_ids[-1]
        self._prefix_cache: tuple[tuple[int, ...], Any] | None = None  # (prefix, KV cache)
        """``(prefix ids, DynamicCache of that prefix, batch 1)`` of the last shared prefix."""

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "auto",
        system: SystemContent = DEFAULT_SYSTEM,
    ) -> LocalBackend:
        """Load model and tokenizer from a local directory or a Hugging Face hub id.

        Loads through :func:`goalprobe.agents.models.load_model` (``path_or_hub_id``: a bundled
        agent's name, a local directory that never touches the network, or a hub id such as
        ``openai/gpt-oss-20b``); ``dtype``: a torch dtype or its name, or ``"auto"``.
        """
        if not isinstance(dtype, str):
            dtype = str(dtype).removeprefix("torch.")
        loaded = load_model(str(path_or_hub_id), device=str(device), dtype=dtype)
        return cls(loaded.model, loaded.tokenizer, system=system)

    @property
    def device(self) -> torch.device:
        """The device the model's parameters live on."""
        return next(self.model.parameters()).device

    @property
    def context_length(self) -> int:
        """Most positions (prompt + generated tokens) the model handles
        (``config.max_position_embeddings``)."""
        return int(self.model.config.max_position_embeddings)

    @torch.no_grad()
    def generate(
        self,
        batch: Sequence[list[Message]],
        sampling: SamplingConfig,
        *,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """Sample one completion per conversation: one ``generate`` call per prompt length,
        after the cached shared prefix (see the module docstring).

        ``seeds``: one per conversation; None derives them from ``sampling.seed`` and the row
        index (fresh randomness when ``sampling.seed`` is None too).
        """
        prompts = [self.encode_prompt(m, sampling.reasoning_effort) for m in batch]
        return self.generate_ids(prompts, sampling, seeds=seeds)

    @torch.no_grad()
    def generate_ids(
        self,
        prompts: Sequence[list[int]],
        sampling: SamplingConfig,
        *,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """:meth:`generate` for prompts given as token ids (e.g. the ones a server rendered)."""
        if not prompts:
            return []
        prompts = [list(p) for p in prompts]
        check_seeds(seeds, len(prompts))
        if seeds is None and sampling.temperature > 0:
            seeds = _row_seeds(len(prompts), sampling.seed)
        groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
        for row, ids in enumerate(prompts):
            prefix = tuple(ids[: self.shared_prefix_length(ids)])
            groups.setdefault((prefix, len(ids)), []).append(row)
        results: list[Completion | None] = [None] * len(prompts)
        if any(len(prefix) == 0 for prefix, _ in groups):  # no shared prefix: one padded call
            groups = {((), 0): list(range(len(prompts)))}
        for (prefix, _), rows in groups.items():
            row_seeds = None if seeds is None else [seeds[r] for r in rows]
            outputs = self._generate_rows([prompts[r] for r in rows], prefix, sampling, row_seeds)
            for row, completion in zip(rows, outputs, strict=True):
                results[row] = completion
        return results  # type: ignore[return-value]

    def shared_prefix_length(self, prompt: list[int]) -> int:
        """Tokens of ``prompt`` before its last message (system + developer messages), or 0.

        Harmony: the prefix ends after the second-to-last ``<|end|>`` of the prompt, i.e. just
        before the last user message. Think-tag: it ends before the second-to-last occurrence
        of the token that opens the generation prompt (ChatML's ``<|im_start|>``, which opens
        every message), i.e. just before the last user message; a template whose messages open
        otherwise gets 0 (one padded call). Prompts of one run share the prefix, so its KV
        cache is computed once.
        """
        if self._harmony:
            end = self.chat_format.special.end  # type: ignore[attr-defined]
            ends = [i for i, t in enumerate(prompt) if t == end]
            return ends[-2] + 1 if len(ends) >= 2 else 0
        opener = self.chat_format.generation_ids[0]  # type: ignore[attr-defined]
        opens = [i for i, t in enumerate(prompt) if t == opener]
        return opens[-2] if len(opens) >= 2 else 0

    def _prefix_kv(self, prefix: tuple[int, ...], n_rows: int):
        """A fresh copy of ``prefix``'s KV cache repeated over ``n_rows`` rows."""
        from transformers import DynamicCache

        if self._prefix_cache is None or self._prefix_cache[0] != prefix:
            ids = torch.tensor([prefix], dtype=torch.long, device=self.device)
            cache = DynamicCache(config=self.model.config)
            # only the cache is wanted: logits_to_keep=1 spares the (prefix x 201,088) logits of
            # GPT-OSS's vocabulary (hundreds of MB for a prompt prefix)
            self.model(
                input_ids=ids,
                **{cache_keyword(self.model): cache},
                use_cache=True,
                logits_to_keep=1,
            )
            self._prefix_cache = (prefix, cache)
        cache = copy.deepcopy(self._prefix_cache[1])
        cache.batch_repeat_interleave(n_rows)
        return cache

    def _generate_rows(
        self,
        prompts: list[list[int]],
        prefix: tuple[int, ...],
        sampling: SamplingConfig,
        seeds: list[int] | None,
    ) -> list[Completion]:
        """One ``generate`` call: prompts of one length after a cached ``prefix``, or left-padded
        prompts without a prefix (``prefix == ()``)."""
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):  # left padding (none when lengths are equal)
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        device = self.device
        stop_ids = list(self.stop_ids)
        kwargs = dict(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
        )
        if prefix:
            kwargs[cache_keyword(self.model)] = self._prefix_kv(prefix, len(prompts))
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.temperature > 0:
            assert seeds is not None
            sampler = PerRowSampler(seeds, sampling.temperature, sampling.top_p, device)
            kwargs["logits_processor"] = LogitsProcessorList([sampler])
        output = self.model.generate(**kwargs)
        generated = output[:, width:].tolist()
        return [
            self._row_completion(prompt, row, stop_ids)
            for prompt, row in zip(prompts, generated, strict=True)
        ]

    def _row_completion(self, prompt: list[int], row: list[int], stop_ids: list[int]) -> Completion:
        stop_at = next((i for i, t in enumerate(row) if t in stop_ids), None)
        # no stop id: it ran to max_new_tokens (generate pads only rows that stopped)
        finish: FinishReason = "length" if stop_at is None else "stop"
        ids = row if stop_at is None else row[: stop_at + 1]
        return self._completion(
            prompt, ids, self.tokenizer.decode(ids, skip_special_tokens=False), finish
        )


class PerRowSampler(LogitsProcessor):
    """Temperature + top-p sampling with one ``torch.Generator`` per batch row.

    Used as the only logits processor of a greedy ``generate``: it draws each row's next token
    from that row's generator (``seeds``: one per row) and masks every other token, so greedy
    decoding picks the draw. ``temperature > 0``, ``top_p`` in (0, 1].
    """

    def __init__(
        self, seeds: Sequence[int], temperature: float, top_p: float, device: torch.device
    ) -> None:
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.generators = [
            torch.Generator(device=device).manual_seed(int(s) % 2**63) for s in seeds
        ]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``scores: (B, vocab)`` -> ``(B, vocab)`` with 0 at each row's draw, -inf elsewhere."""
        logits = scores.float() / self.temperature
        if torch.isposinf(logits).any() or torch.isnan(logits).any():
            # near temperature 0 the division overflows float32 (then inf - inf = nan in the
            # softmax); shifting by the row maximum first gives the same distribution. Only
            # here, so that ordinary temperatures keep their exact arithmetic (and samples).
            shifted = scores.float() - scores.float().amax(dim=-1, keepdim=True)
            logits = shifted / self.temperature
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = self._nucleus_candidates(probs)
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(mass_before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        out = torch.full_like(scores, -math.inf)
        for row, generator in enumerate(self.generators):
            token = torch.multinomial(probs[row], 1, generator=generator)
            out[row, token] = 0.0
        return out

    def _nucleus_candidates(self, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The largest probabilities of each row, descending, with their token ids: enough of
        them to hold every row's nucleus (the first ``k`` whose last one starts at or beyond
        ``top_p`` cumulative mass in every row, ``k`` growing 64, 512, ... up to the whole
        vocabulary): sorting a 201,088-token vocabulary per token would dominate sampling."""
        vocab = probs.shape[-1]
        k = min(64, vocab)
        while True:
            top, order = torch.topk(probs, k, dim=-1, sorted=True)
            if k == vocab:
                return top, order
            mass_before_last = torch.cumsum(top, dim=-1)[:, -1] - top[:, -1]
            if bool((mass_before_last >= self.top_p).all()):
                return top, order
            k = min(k * 8, vocab)


def _row_seeds(n_rows: int, seed: int | None) -> list[int]:
    """Per-row seeds derived from one seed (fresh entropy when it is None)."""
    sequence = np.random.SeedSequence(seed)
    return [int(s) for s in sequence.generate_state(n_rows, np.uint64) >> np.uint64(1)]
