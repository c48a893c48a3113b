"""The curriculum loader (data.curriculum): its first epoch is a permutation paced from the
easiest prompts to all of them, ties in a seeded order; a checkpoint's position resumes it
exactly, and a position saved under other difficulties is refused."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.config import ConfigError
from hybridflow.config.schema import load_run_config
from hybridflow.data.curriculum import CurriculumLoader, paced_order

DIFFICULTY = np.repeat([3.0, 1.0, 2.0, 4.0], 25)  # 100 prompts, 4 levels of 25 (the easiest are rows 25-49)


def test_the_first_epoch_is_a_permutation_paced_from_the_easiest_prompts():
    order = paced_order(DIFFICULTY, batch_size=5, seed=0, start_fraction=0.25, ramp_batches=8)
    assert sorted(order.tolist()) == list(range(100))  # every prompt once
    batches = order.reshape(20, 5)
    assert set(DIFFICULTY[batches[0]]) == {1.0}  # the first step draws from the easiest quarter
    # Batch k draws from the easiest ceil((0.25 + 0.75 k / 8) * 100) prompts, and no harder.
    for k, batch in enumerate(batches[:8]):
        share = 0.25 + 0.75 * k / 8
        assert DIFFICULTY[batch].max() <= np.sort(DIFFICULTY)[int(np.ceil(share * 100)) - 1], k
    assert DIFFICULTY[batches[8:].ravel()].mean() > DIFFICULTY[batches[:8].ravel()].mean()  # harder later
    assert np.array_equal(order, paced_order(DIFFICULTY, 5, 0, 0.25, 8))  # seeded
    assert not np.array_equal(order, paced_order(DIFFICULTY, 5, 1, 0.25, 8))  # ties follow the seed
    whole = paced_order(DIFFICULTY, 5, 0, 1.0, 8)  # start_fraction 1: no pacing, a seeded shuffle
    assert sorted(whole.tolist()) == list(range(100)) and DIFFICULTY[whole[:25]].std() > 0


def test_a_resumed_loader_continues_the_paced_order():
    def loader(difficulty=DIFFICULTY):
        return CurriculumLoader(list(range(100)), 5, difficulty, seed=0, start_fraction=0.25, ramp_batches=8)

    first = loader()
    it = iter(first)
    seen = [next(it) for _ in range(7)]
    state = first.state_dict()
    rest = [next(it) for _ in range(13)] + [next(iter(first))]  # the epoch's rest, then epoch 1 (shuffled)
    resumed = loader()
    resumed.load_state_dict(state)
    again = iter(resumed)
    assert [next(again) for _ in range(13)] == rest[:13] and next(iter(resumed)) == rest[13]
    assert sorted(sum(seen + rest[:13], [])) == list(range(100))
    other = loader(DIFFICULTY[::-1].copy())
    with pytest.raises(ValueError, match="curriculum order"):
        other.load_state_dict(state)


def test_the_settings_are_checked():
    cfg = load_run_config(None, ["data.curriculum.by=pass_rate"])
    assert (cfg.data.curriculum.by, cfg.data.curriculum.column) == ("pass_rate", "difficulty")
    assert load_run_config(None, []).data.curriculum.by is None  # off by default
    with pytest.raises(ConfigError, match=r"^data\.curriculum\.start_fraction: must be in \[0, 1\]"):
        load_run_config(None, ["data.curriculum.start_fraction=1.5"])
    with pytest.raises(ConfigError, match=r"^data\.curriculum\.by"):
        load_run_config(None, ["data.curriculum.by=length"])
    with pytest.raises(ValueError, match="one per prompt"):
        CurriculumLoader(list(range(10)), 2, [1.0] * 9, seed=0, start_fraction=0.5, ramp_batches=2)
