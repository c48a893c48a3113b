"""Easy prompts first: a loader whose first epoch is paced from the easiest prompts to all.

`paced_order(difficulty, batch_size, seed, start_fraction, ramp_batches)` is a permutation
of the data set: batch k takes its prompts at random (seeded) from those not yet taken
among the easiest max(f(k) N, what the batch needs) prompts, where the share
f(k) = start_fraction + (1 - start_fraction) min(1, k / ramp_batches) widens linearly
to all of them (a pacing function, Hacohen & Weinshall 2019). Ties keep a seeded random
order. `CurriculumLoader` is a `ResumableLoader` whose epoch 0 follows that order (later
epochs are shuffled as usual), so a checkpoint's loader position resumes it exactly.

    loader = CurriculumLoader(ds, 16, difficulty, seed=0, start_fraction=0.25, ramp_batches=20)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hybridflow.data.loader import ResumableLoader


def paced_order(difficulty: np.ndarray, batch_size: int, seed: int, start_fraction: float,
                ramp_batches: int) -> np.ndarray:
    """The paced permutation of len(difficulty) indices (module docstring)."""
    n = len(difficulty)
    rng = np.random.default_rng(seed)
    by_difficulty = np.lexsort((rng.permutation(n), np.asarray(difficulty, dtype=np.float64)))  # easiest first
    taken = np.zeros(n, dtype=bool)
    order: list[int] = []
    for k in range(-(-n // batch_size)):
        share = start_fraction + (1.0 - start_fraction) * min(1.0, k / max(1, ramp_batches))
        pool = max(int(np.ceil(share * n)), min(n, len(order) + batch_size))
        free = by_difficulty[:pool][~taken[by_difficulty[:pool]]]
        picked = rng.choice(free, size=min(batch_size, len(free)), replace=False)
        taken[picked] = True
        order.extend(int(i) for i in picked)
    return np.asarray(order, dtype=np.int64)


class CurriculumLoader(ResumableLoader):
    """A ResumableLoader (its batches, state and resume) whose epoch 0 is `paced_order`."""

    def __init__(self, dataset: Sequence[Any], batch_size: int, difficulty: Sequence[float], *, seed: int,
                 start_fraction: float, ramp_batches: int, shuffle: bool = True,
                 collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        if len(difficulty) != len(dataset):
            raise ValueError(f"{len(difficulty)} difficulties for {len(dataset)} prompts; give one per prompt")
        super().__init__(dataset, batch_size, shuffle=shuffle, seed=seed, collate_fn=collate_fn)
        self.difficulty = np.asarray(difficulty, dtype=np.float64)
        self.first_epoch = paced_order(self.difficulty, batch_size, seed, start_fraction, ramp_batches)

    def epoch_order(self, epoch: int) -> np.ndarray:
        return self.first_epoch if epoch == 0 else super().epoch_order(epoch)

    def state_dict(self) -> dict[str, Any]:
        # The order is part of the position's meaning: a resume with other difficulties is refused.
        return {**super().state_dict(), "curriculum": hashlib.sha1(self.first_epoch.tobytes()).hexdigest()[:16]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()["curriculum"]
        if state.get("curriculum") != mine:
            raise ValueError(f"cannot resume the loader: the saved position belongs to curriculum order "
                             f"{state.get('curriculum')!r}, this run's is {mine!r} (other difficulties or "
                             "curriculum settings); resume with the data and data.curriculum it was saved with")
        super().load_state_dict(state)
