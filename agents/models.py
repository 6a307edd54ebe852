"""The one way an agent is named, loaded and identified.

A model name is a registered agent's name (``bundled``, ``bundled:map`` or one added with
:func:`goalprobe.agents.bundled.register_agent`), a local model directory (``config.json`` + weights + tokenizer files; never touches the network),
or a Hugging Face hub id (``openai/gpt-oss-20b``). Rollouts, extraction, patching, the server
and the demo all load through :func:`load_model` and record the model through
:func:`model_identity` / :func:`describe_local_model`, so one agent has one identity
everywhere.

A hub id is first looked up in the local cache; when it is not there and ``HF_HUB_OFFLINE`` is
set or the hub does not answer within :data:`NETWORK_PROBE_TIMEOUT_S`, :func:`load_model` raises
:class:`HubUnavailableError` at once instead of hanging. When the hub is used, transformers
downloads the model (and says so on its progress bars).
"""

from __future__ import annotations

import inspect
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from goalprobe.agents.attention import resolve_attention, set_attention
from goalprobe.agents.bundled import (
    bundled_agent_dir,
    bundled_weights_digest,
    load_bundled_agent,
    named_agent,
)

NETWORK_PROBE_TIMEOUT_S = 3.0
"""How long :func:`load_model` waits to learn whether the hub is reachable."""


class HubUnavailableError(RuntimeError):
    """A hub id was asked for but neither the local cache nor the network can provide it."""


@dataclass
class LoadedModel:
    """A loaded agent.

    Attributes:
        model: the causal LM in eval mode (for remote runs: an nnsight ``TransformersModel``
            without weights).
        tokenizer: its tokenizer (it holds the harmony special tokens).
        model_id: the name it was loaded by (recorded in stores and trajectory files).
        revision: the revision recorded: the one asked for, else the resolved commit
            (:func:`model_commit`; '' when unknown; a bundled agent's weights digest).
    """

    model: Any
    tokenizer: Any
    model_id: str
    revision: str = ""


def resolve_device_dtype(device: str, dtype: str) -> tuple[str, Any]:
    """``(device, torch dtype)``: ``device="auto"`` is CUDA when available, else CPU;
    ``dtype="auto"`` bf16 on CUDA, fp32 on CPU (else ``bfloat16``, ``float16``, ``float32``;
    ``ValueError`` for another name)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        return device, torch.bfloat16 if device.startswith("cuda") else torch.float32
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use auto, bfloat16, float16 or float32")
    return device, resolved


def check_model_name(model: str) -> None:
    """Refuse a name that is neither a bundled agent, a model directory nor a hub id, before
    anything is loaded.

    Raises:
        ValueError: an empty name.
        FileNotFoundError: an existing path that is no model directory.
    """
    if not model.strip():
        raise ValueError("the model name is empty")
    if _named(model):
        return
    path = Path(model).expanduser()
    if path.exists() and not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no config.json; not a model directory")


def load_model(
    model: str,
    *,
    revision: str = "",
    device: str = "auto",
    dtype: str = "auto",
    device_map: str | None = None,
    remote: bool = False,
    attention: str = "auto",
) -> LoadedModel:
    """Load an agent by name (module docstring; a bundled agent's revision is a digest of its
    weights; transformers loads GPT-OSS-20B's MXFP4 weights where the kernels exist and
    dequantises to bf16 elsewhere).

    Args:
        revision: hub revision ('' for the default branch); ignored for local models.
        device, dtype: as :func:`resolve_device_dtype`; ``device_map`` (a transformers device
            map, ``"auto"`` spreads a large model over GPUs) overrides ``device``.
        remote: build only the module tree and tokenizer (nnsight ``TransformersModel``, no
            weights) for a run on NDIF.
        attention: the GPT-OSS attention kernel (:func:`~goalprobe.agents.attention.set_attention`).

    Raises:
        HubUnavailableError: a hub id that is not cached while the hub cannot be used.
        FileNotFoundError: a path that is no model directory.
        ValueError: an empty name or an unknown dtype.
    """
    check_model_name(model)
    if remote:
        from nnsight.modeling.transformers import TransformersModel

        if _named(model) or Path(model).exists():
            raise ValueError("remote extraction needs a Hub id that NDIF serves, not a local model")
        lm = TransformersModel(model, revision=revision or None)
        return LoadedModel(lm, lm.tokenizer, model, revision)
    device, torch_dtype = resolve_device_dtype(device, dtype)
    resolve_attention(attention, device)  # an unknown choice fails before any weights load
    if _named(model):
        loaded, tokenizer = load_bundled_agent(device=device, directory=bundled_agent_dir(model))
        set_attention(loaded, attention, device)
        return LoadedModel(loaded.to(torch_dtype), tokenizer, model, bundled_weights_digest(model))

    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(model).expanduser()
    kwargs: dict[str, Any]
    if local.is_dir():
        source, kwargs = str(local), {"local_files_only": True}
    else:
        source = model
        kwargs = {"local_files_only": not _hub_reachable()}
        if revision:
            kwargs["revision"] = revision
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, device_map=device_map or device, **kwargs
        )
    except OSError as err:
        if kwargs["local_files_only"] and not local.is_dir():
            raise _hub_unavailable(model) from err
        raise
    commit = revision or getattr(loaded.config, "_commit_hash", None) or model_commit(model)
    set_attention(loaded, attention, str(loaded.device) if device_map else device)
    return LoadedModel(loaded.eval(), tokenizer, model, commit or "")


def model_commit(model: str) -> str:
    """The resolved commit of a model's weights, '' when unknown: a hub id's cached snapshot
    (``.../snapshots/<commit>/config.json`` in the Hugging Face cache; nothing is downloaded), a
    local directory that is such a snapshot, or what the loaded config says
    (``config._commit_hash``, see :func:`load_model`). A bundled agent is identified by its
    weights digest instead (:func:`model_identity`)."""
    if _named(model):
        return ""
    local = Path(model).expanduser()
    if local.is_dir():
        resolved = local.resolve()
        return resolved.name if resolved.parent.name == "snapshots" else ""
    if _looks_like_path(model):
        return ""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
    except (ImportError, ValueError):  # no hub client, or not a valid repo id
        return ""
    if isinstance(cached, str) and Path(cached).parent.parent.name == "snapshots":
        return Path(cached).parent.name
    return ""


def check_model_available(model: str) -> None:
    """Refuse, before any stage runs, a model that cannot be loaded: a path that is no model
    directory, or a hub id that is not in the local cache while the hub cannot be used.

    Raises:
        FileNotFoundError: a path that does not exist or holds no ``config.json``.
        HubUnavailableError: a hub id neither cached nor downloadable now.
        ValueError: an empty name.
    """
    check_model_name(model)
    if _named(model) or Path(model).expanduser().is_dir():
        return
    if _looks_like_path(model):
        raise FileNotFoundError(f"{model}: no such model directory")
    if not (model_commit(model) or _hub_reachable()):
        raise _hub_unavailable(model)


def _hub_unavailable(model: str) -> HubUnavailableError:
    return HubUnavailableError(
        f"{model!r} is not a local directory and is not in the Hugging Face cache, and the hub "
        "cannot be used (HF_HUB_OFFLINE is set or the hub is unreachable); download it where "
        "there is network, or pass a local path"
    )


def _looks_like_path(model: str) -> bool:
    """Whether ``model`` is spelled as a path rather than a hub id (``org/name``)."""
    return (
        model.startswith(("/", ".", "~"))
        or "\\" in model
        or model.count("/") > 1
        or model.endswith("/")
    )


def load_tokenizer(model: str):
    """The tokenizer of ``model`` (a bundled agent's name, a local directory or a hub id)."""
    check_model_name(model)
    if _named(model):
        from goalprobe.agents.tokenizer import load_tokenizer as load_bundled_tokenizer

        return load_bundled_tokenizer(bundled_agent_dir(model))
    from transformers import AutoTokenizer

    local = Path(model).expanduser().is_dir()
    return AutoTokenizer.from_pretrained(model, local_files_only=local or not _hub_reachable())


def model_identity(model: str) -> dict[str, str]:
    """What identifies an agent's weights: a bundled agent's weights digest, else its name."""
    if _named(model):
        return {"model": model, "weights_sha256": bundled_weights_digest(model)}
    return {"model": model}


def describe_local_model(model: str, revision: str = "", chat_format=None) -> dict[str, Any]:
    """How trajectory files identify a model run in this process (it enters the rollout's
    ``run_id``): a bundled agent by its weights digest, any other model by name and revision,
    so ``goalprobe rollout`` and ``goalprobe demo`` give the same run id for the same agent;
    with the chat format it runs in, unless harmony
    (:func:`~goalprobe.agents.chat_format.with_chat_format`)."""
    from goalprobe.agents.chat_format import with_chat_format

    identity = model_identity(model) if _named(model) else {"model": model, "revision": revision}
    return with_chat_format({"class": "LocalBackend", **identity}, chat_format)


def _hub_reachable() -> bool:
    """Whether the hub may be used (not offline, and its endpoint answers quickly)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (443 if parsed.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=NETWORK_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def cache_keyword(model) -> str:
    """The keyword a causal LM's ``forward`` and ``generate`` take a KV cache by: ``cache``
    where the installed transformers has it (5.2x; ``past_key_values`` is deprecated there and
    warns on every call), else ``past_key_values``. ``model`` may be wrapped (nnsight's
    ``LanguageModel`` keeps the module in ``_model``)."""
    module = getattr(model, "_model", model)
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):  # no introspectable forward: the long-standing name
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def output_cache(output):
    """The KV cache a forward pass returned (``cache`` or, before transformers 5.2x,
    ``past_key_values``)."""
    return output["cache"] if "cache" in output else output["past_key_values"]


def _named(model: str) -> bool:
    """Whether ``model`` is a registered agent's name (the bundled ones included)."""
    return named_agent(model) is not None
