"""A seeded, resumable batch loader over an indexable data set.

    loader = ResumableLoader(dataset, batch_size=32, seed=1, collate_fn=dataset.collate)
    for epoch in range(loader.epoch, total_epochs):
        for batch in loader:          # the rest of the current epoch
            ...
            ckpt["loader"] = loader.state_dict()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

STATE_VERSION = 1


class ResumableLoader:
    """Batches of `dataset` in a per-epoch seeded order, with an exact, restorable position."""

    def __init__(
        self,
        dataset: Sequence[Any],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.collate_fn = collate_fn if collate_fn is not None else list
        self._num_samples = len(dataset)
        if len(self) == 0:
            raise ValueError(
                f"the data set has {self._num_samples} samples, fewer than batch_size={batch_size} with "
                "drop_last=true, so an epoch has no batch; lower batch_size or set drop_last=false"
            )
        self._epoch = 0
        self._offset = 0  # batches of the current epoch already handed out

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self._num_samples // self.batch_size
        return math.ceil(self._num_samples / self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    @property
    def offset(self) -> int:
        """Batches of the current epoch already handed out."""
        return self._offset

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Sample indices in the order epoch `epoch` visits them."""
        if not self.shuffle:
            return np.arange(self._num_samples)
        return np.random.default_rng(self.seed + epoch).permutation(self._num_samples)

    def __iter__(self) -> Iterator[Any]:
        """Yield the remaining batches of the current epoch."""
        epoch, start = self._epoch, self._offset
        order = self.epoch_order(epoch)
        num_batches = len(self)
        for b in range(start, num_batches):
            indices = order[b * self.batch_size : (b + 1) * self.batch_size]
            batch = self.collate_fn([self.dataset[int(i)] for i in indices])
            # Advance first so a state_dict() taken while the caller holds this batch
            # already points past it (and into the next epoch after the last batch).
            if b + 1 == num_batches:
                self._epoch, self._offset = epoch + 1, 0
            else:
                self._epoch, self._offset = epoch, b + 1
            yield batch

    def state_dict(self) -> dict[str, int | bool]:
        """The position (epoch, offset) and the settings it is only meaningful with."""
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "offset": self._offset,
            "num_samples": self._num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; the settings must match the saved ones."""
        missing = {"epoch", "offset", "num_samples", "batch_size", "seed", "shuffle", "drop_last"} - set(state)
        if missing:
            raise ValueError(
                f"loader state is missing {sorted(missing)}; pass a dict from ResumableLoader.state_dict()"
            )
        mine = self.state_dict()
        changed = {k: (state[k], mine[k]) for k in ("num_samples", "batch_size", "seed", "shuffle", "drop_last")
                   if state[k] != mine[k]}
        if changed:
            detail = ", ".join(f"{k}: saved {old!r}, now {new!r}" for k, (old, new) in changed.items())
            raise ValueError(
                f"cannot resume the loader: {detail}; the saved position only means something with the "
                "same data set and loader settings (restore them, or start the loader fresh)"
            )
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if epoch < 0 or not 0 <= offset <= len(self):
            raise ValueError(
                f"loader state has epoch={epoch}, offset={offset}; expected epoch >= 0 and "
                f"0 <= offset <= {len(self)}"
            )
        # A state written by another tool at the very end of an epoch means "next epoch".
        if offset == len(self):
            epoch, offset = epoch + 1, 0
        self._epoch, self._offset = epoch, offset
