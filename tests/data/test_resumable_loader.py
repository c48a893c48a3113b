"""ResumableLoader: per-epoch seeded order, exact resume (mid-epoch and at the boundary)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.data import ResumableLoader


def _batches(loader, count):
    """The next `count` batches, crossing epochs the way a trainer loop does."""
    out = []
    while len(out) < count:
        for batch in loader:
            out.append(batch)
            if len(out) == count:
                break
    return out


def test_each_epoch_visits_every_sample_once_in_a_new_order():
    loader = ResumableLoader(list(range(10)), batch_size=3, seed=5, drop_last=False)
    assert len(loader) == 4
    epoch0 = list(loader)
    epoch1 = list(loader)
    assert [len(b) for b in epoch0] == [3, 3, 3, 1]
    assert sorted(sum(epoch0, [])) == sorted(sum(epoch1, [])) == list(range(10))
    assert epoch0 != epoch1
    assert loader.epoch == 2 and loader.offset == 0


def test_order_depends_only_on_seed_and_epoch():
    a = ResumableLoader(list(range(20)), batch_size=4, seed=1)
    b = ResumableLoader(list(range(20)), batch_size=4, seed=1)
    c = ResumableLoader(list(range(20)), batch_size=4, seed=2)
    assert _batches(a, 12) == _batches(b, 12)
    assert _batches(ResumableLoader(list(range(20)), batch_size=4, seed=1), 5) != _batches(c, 5)


def test_no_shuffle_keeps_dataset_order():
    loader = ResumableLoader(list(range(7)), batch_size=2, shuffle=False, drop_last=True)
    assert len(loader) == 3
    assert list(loader) == [[0, 1], [2, 3], [4, 5]]


def test_resume_mid_epoch_continues_exactly():
    data = list(range(23))
    reference = _batches(ResumableLoader(data, batch_size=4, seed=3), 11)
    first = ResumableLoader(data, batch_size=4, seed=3)
    seen = _batches(first, 3)
    state = first.state_dict()
    assert (state["epoch"], state["offset"]) == (0, 3)
    resumed = ResumableLoader(data, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    assert seen + _batches(resumed, 8) == reference


def test_resume_exactly_at_epoch_boundary_starts_next_epoch():
    data = list(range(12))
    reference = _batches(ResumableLoader(data, batch_size=4, seed=9), 6)
    first = ResumableLoader(data, batch_size=4, seed=9)
    seen = list(first)  # one whole epoch
    state = first.state_dict()
    assert (state["epoch"], state["offset"]) == (1, 0)
    resumed = ResumableLoader(data, batch_size=4, seed=9)
    resumed.load_state_dict(state)
    next_epoch = list(resumed)
    assert len(next_epoch) == 3  # not an empty epoch
    assert seen + next_epoch == reference


def test_state_saved_while_holding_the_last_batch_points_past_it():
    loader = ResumableLoader(list(range(6)), batch_size=3, seed=0)
    iterator = iter(loader)
    next(iterator)
    last = next(iterator)
    assert (loader.epoch, loader.offset) == (1, 0)
    reference = ResumableLoader(list(range(6)), batch_size=3, seed=0)
    assert list(reference)[-1] == last
    resumed = ResumableLoader(list(range(6)), batch_size=3, seed=0)
    resumed.load_state_dict(loader.state_dict())
    assert list(resumed) == list(reference)  # epoch 1, not a repeat of epoch 0's tail


def test_state_at_offset_equal_to_len_means_next_epoch():
    loader = ResumableLoader(list(range(8)), batch_size=4, seed=0)
    state = loader.state_dict() | {"epoch": 2, "offset": 2}
    loader.load_state_dict(state)
    assert (loader.epoch, loader.offset) == (3, 0)
    assert len(list(loader)) == 2


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 9),
    drop_last=st.booleans(),
    stop=st.integers(0, 30),
    total=st.integers(1, 30),
)
def test_resume_anywhere_equals_uninterrupted(n, batch_size, drop_last, stop, total):
    if drop_last and n < batch_size:
        return
    data = list(range(n))
    make = lambda: ResumableLoader(data, batch_size=batch_size, seed=4, drop_last=drop_last)  # noqa: E731
    reference = _batches(make(), stop + total)
    first = make()
    head = _batches(first, stop) if stop else []
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + _batches(resumed, total) == reference


def test_mismatched_settings_refuse_to_resume():
    state = ResumableLoader(list(range(10)), batch_size=2, seed=1).state_dict()
    with pytest.raises(ValueError, match="batch_size: saved 2, now 5"):
        ResumableLoader(list(range(10)), batch_size=5, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="num_samples: saved 10, now 11"):
        ResumableLoader(list(range(11)), batch_size=2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        ResumableLoader(list(range(10)), batch_size=2, seed=1).load_state_dict({"epoch": 0})


def test_too_few_samples_for_one_batch_is_an_error():
    with pytest.raises(ValueError, match="fewer than batch_size=4"):
        ResumableLoader([1, 2, 3], batch_size=4, drop_last=True)
    assert len(ResumableLoader([1, 2, 3], batch_size=4, drop_last=False)) == 1


def test_collate_fn_is_applied(char_tokenizer):
    from hybridflow.data import ArithmeticConfig, PromptDataConfig, RLPromptDataset, rl_records

    ds = RLPromptDataset(None, char_tokenizer, PromptDataConfig(), rows=rl_records(ArithmeticConfig(), "train", 10))
    loader = ResumableLoader(ds, batch_size=4, seed=0, collate_fn=ds.collate)
    batches = list(loader)
    assert [len(b) for b in batches] == [4, 4]
    assert batches[0].batch["input_ids"].shape[0] == 4
