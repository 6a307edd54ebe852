"""Source activations of recorded base runs, read from the HDF5 activation store.

The store holds, per trajectory step, the residual stream at the two anchors for some layers,
computed on the recorded prompt + completion. Where a patch's source is such a run
(``"base_to_cf"``) and the store holds every layer of the patch, its values are read instead of
captured, but only when the source sequence equals the recorded ids up to the anchor (so
``post_reasoning`` needs the recorded reasoning). Stored positions must match the positions the
patch reads (else an error: another extraction). Values are float16 on disk."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from goalprobe.activations.store.reader import ActivationStore
from goalprobe.probes.patching.counterfactuals import BaseState

STORE_SITES: tuple[str, ...] = ("pre_reasoning", "post_reasoning")
"""Sites whose source values a store can provide."""


class StoreSource:
    """Look up base runs in an open activation store by ``(run_id, grid_id, episode, step)``."""

    def __init__(self, store: ActivationStore) -> None:
        self.store = store
        labels = store.labels(["run_id", "grid_id", "episode", "step"])
        keys = zip(
            labels["run_id"], labels["grid_id"], labels["episode"], labels["step"], strict=True
        )
        self._rows = {(str(r), str(g), int(e), int(s)): i for i, (r, g, e, s) in enumerate(keys)}

    def row_of(self, base: BaseState) -> int | None:
        """The store row of ``base``'s trajectory step, or None."""
        if base.run_id is None or base.episode is None or base.step is None:
            return None
        return self._rows.get((base.run_id, base.grid_id, base.episode, base.step))

    def values(
        self,
        base: BaseState,
        site: str,
        layers: Sequence[int],
        positions: np.ndarray,
        token_ids: np.ndarray,
    ) -> torch.Tensor | None:
        """``(len(layers), 3, d_model)`` float32 stored values of ``base`` at ``site`` for a source
        sequence ``token_ids`` read at ``positions``; None when the site is not a stored anchor,
        the base has no recorded ids or row, the sequence differs from them up to the anchor, or
        a layer or the stage is not stored. ValueError when the stored positions differ from
        ``positions``."""
        if site not in STORE_SITES or site not in self.store.stages:
            return None
        if base.prompt_token_ids is None or base.generated_token_ids is None:
            return None
        recorded = np.asarray(base.prompt_token_ids + base.generated_token_ids, dtype=np.int64)
        n = int(np.max(positions)) + 1
        if len(recorded) < n or not np.array_equal(recorded[:n], np.asarray(token_ids)[:n]):
            return None
        if any(int(x) not in self.store.layers for x in layers):
            return None
        row = self.row_of(base)
        if row is None or not self.store.present(site)[row]:
            return None
        stored = self.store.positions(site, [row])[0]
        if not np.array_equal(stored.astype(np.int64), np.asarray(positions, dtype=np.int64)):
            raise ValueError(
                f"{self.store.path}: row {row} ({base.base_id}) stores {site} at positions "
                f"{stored.tolist()}, but the patch reads {np.asarray(positions).tolist()}; the "
                "store was extracted from other token ids"
            )
        acts = [self.store.read(site, int(x), [row], dtype=np.float32)[0] for x in layers]
        return torch.from_numpy(np.stack(acts))
