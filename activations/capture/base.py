"""What every capture backend shares: the padded token batch, the backend interface, and
helpers to find a model's decoder blocks and input device.

The residual stream "at layer L" is the *output* of decoder block ``L`` (0-based): what
``output_hidden_states`` reports as ``hidden_states[L + 1]`` (before the final norm for every
block but the last, whose output hidden_states reports after it). Sequences are padded on the
right, so every real token keeps its position (rotary phases, causal attention) exactly as in
an unpadded forward: a row's activations do not depend on the other rows of its batch beyond
floating-point reassociation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

_LAYER_PATHS: tuple[str, ...] = (
    "model.layers",
    "model.language_model.layers",
    "transformer.h",
    "gpt_neox.layers",
    "model.decoder.layers",
)


@dataclass(frozen=True)
class TokenBatch:
    """Right-padded token ids of ``B`` sequences and the positions to read in each.

    Attributes:
        input_ids: ``(B, T)`` int64 ids, padded on the right.
        attention_mask: ``(B, T)`` int64, 1 on real tokens.
        positions: ``(B, K)`` int64 positions to read, each inside its row's real tokens.
    """

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
        """Pad ``sequences`` on the right with ``pad_id``.

        Args:
            sequences: ``B`` token id lists (lengths may differ).
            positions: ``B`` lists of ``K`` positions, each ``< len(sequence)``.
            pad_id: id written into padding (never attended to by real tokens).
        """
        if len(sequences) == 0 or len(sequences) != len(positions):
            raise ValueError(
                f"need as many position rows as sequences (>0), got {len(sequences)} sequences "
                f"and {len(positions)} position rows"
            )
        lengths = [len(s) for s in sequences]
        width = max(lengths)
        ids = torch.full((len(sequences), width), int(pad_id), dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, seq in enumerate(sequences):
            ids[i, : lengths[i]] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[i, : lengths[i]] = 1
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


class CaptureBackend(ABC):
    """Reads the residual stream after chosen decoder blocks at chosen token positions.

    Subclasses implement :meth:`capture` and stop the forward pass after the last requested
    block (no later block and no unembedding runs).
    """

    name: str = ""
    """Backend name recorded in the store's ``backend`` attribute."""

    def __init__(self, config) -> None:
        self.config = config
        self.n_layers = int(config.num_hidden_layers)
        self.d_model = int(config.hidden_size)

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

    @abstractmethod
    def capture(self, batch: TokenBatch, layers: Sequence[int]) -> dict[int, torch.Tensor]:
        """Run the batch and read block outputs at ``batch.positions``.

        Args:
            batch: the padded sequences and positions ``(B, K)``.
            layers: decoder blocks to read (0-based).

        Returns:
            ``{layer: (B, K, d_model)}`` CPU tensors in the model's dtype.
        """


def get_submodule_path(root: nn.Module, path: str) -> nn.Module | None:
    """``root.a.b.c`` for ``path = "a.b.c"``, or None when an attribute is missing."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def decoder_layers_path(model: nn.Module) -> str:
    """Dotted path of ``model``'s decoder block list (``"model.layers"`` for GPT-OSS).

    Raises:
        ValueError: no known path holds an ``nn.ModuleList``.
    """
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


def block_output(output) -> torch.Tensor:
    """The hidden state of a decoder block's output (a tensor, or the first element of a tuple)."""
    return output[0] if isinstance(output, tuple) else output
