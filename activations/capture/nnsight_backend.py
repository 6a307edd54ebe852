"""Default backend: an nnsight trace, locally or on NDIF (``remote``).

Inside one trace the output of each requested block is gathered at the batch's positions (so
only ``(B, K, d_model)`` per layer leaves the model, which matters remotely), and
``tracer.stop()`` ends the forward pass right after the last requested block.

Remote execution sends the same trace to an NDIF server (``https://api.ndif.us`` unless
``host`` says otherwise) that already holds the model; weights never leave the server and the
request names the model by its nnsight model key (:func:`ndif_model_key`). The API key comes
from ``NDIF_API_KEY`` or nnsight's config (``nnsight.CONFIG.set_default_api_key``).
``remote="local"`` runs nnsight's local simulation of that path (serialise, deserialise with
local modules hidden, run here), a dry run that needs no server.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence

import torch
from torch import nn

from activations.capture.base import (
    CaptureBackend,
    TokenBatch,
    decoder_layers_path,
    get_submodule_path,
    input_device,
)


class RemoteCaptureError(RuntimeError):
    """An NDIF request failed; the message names the host and the model key."""


def ndif_model_key(repo_id: str, revision: str | None = None) -> str:
    """The nnsight model key under which NDIF serves ``repo_id`` as a text-generation model.

    Same format as ``TransformersModel(repo_id).to_model_key()`` (import path of nnsight's
    ``TransformersModel``, then JSON of repo id, revision and task), built without asking the
    Hub, so ``repo_id`` must be the canonical id (``"openai/gpt-oss-20b"``).
    """
    from nnsight.modeling.transformers import TransformersModel
    from nnsight.util import to_import_path

    payload = {"repo_id": repo_id, "revision": revision, "task": "text-generation"}
    return f"{to_import_path(TransformersModel)}:{json.dumps(payload)}"


class NnsightCapture(CaptureBackend):
    """Capture through an nnsight trace.

    Args:
        model: a loaded Hugging Face causal LM, or an nnsight ``TransformersModel`` (for
            remote runs, one built from the repo id without weights: ``TransformersModel(id)``).
        tokenizer: the model's tokenizer (nnsight's wrapper needs one to wrap a loaded model).
        remote: False (run here), True (run on NDIF) or ``"local"`` (nnsight's local
            simulation of a remote run).
        model_id: canonical Hub id of the model, for the remote model key (default: the
            wrapper's ``repo_id``).
        revision: model revision for the remote model key.
        host: NDIF base URL (default: nnsight's configured host).
    """

    name = "nnsight"

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        remote: bool | str = False,
        model_id: str | None = None,
        revision: str | None = None,
        host: str | None = None,
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
            self.lm = TransformersModel(model, tokenizer=copy.deepcopy(tokenizer))
        else:
            raise TypeError(f"expected a torch model or TransformersModel, got {type(model)}")
        module = self.lm._module
        super().__init__(module.config)
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

    def capture(self, batch: TokenBatch, layers: Sequence[int]) -> dict[int, torch.Tensor]:
        """See :meth:`CaptureBackend.capture`; returns ``{layer: (B, K, d_model)}``."""
        layers = self.check_layers(layers)
        device = torch.device("cpu") if self.remote is True else input_device(self._module)
        input_ids = batch.input_ids.to(device)
        attention_mask = batch.attention_mask.to(device)
        positions = batch.positions
        blocks = get_submodule_path(self.lm, self._path)
        backend = self._backend()
        try:
            with torch.no_grad():
                with self.lm.trace(
                    input_ids=input_ids, attention_mask=attention_mask, backend=backend
                ) as tracer:
                    gathered = []
                    for layer in layers:
                        hidden = blocks[layer].output
                        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
                        rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
                        gathered.append(hidden[rows, positions.to(hidden.device)].cpu())
                    acts = torch.stack(gathered).save()
                    tracer.stop()
        except Exception as err:
            if self.remote is True and type(err).__name__ == "RemoteError":
                raise RemoteCaptureError(
                    f"NDIF request for model key {self.model_key()} at {backend.host} failed: {err}"
                ) from err
            raise
        return {layer: acts[i].detach() for i, layer in enumerate(layers)}
