"""DataProto construction, indexing and the batch operations the controller relies on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.protocol import PAD_SIZE_KEY, DataProto

# --------------------------------------------------------------------- construction


def test_from_dict_turns_lists_into_one_dimensional_object_arrays():
    proto = DataProto.from_dict(tensors={"x": torch.zeros(3, 2)},
                                non_tensors={"ground_truth": [[1, 2], [3, 4], [5, 6]], "uid": ("a", "b", "c")})
    gt = proto.non_tensor_batch["ground_truth"]
    assert gt.dtype == object and gt.shape == (3,) and gt[1] == [3, 4]
    assert proto.non_tensor_batch["uid"].tolist() == ["a", "b", "c"]
    assert len(proto) == 3


def test_mismatched_dim0_is_rejected_with_the_sizes():
    with pytest.raises(ValueError, match="disagree on the number of samples") as info:
        DataProto.from_dict(tensors={"input_ids": torch.zeros(4, 2)}, non_tensors={"uid": ["a", "b", "c"]})
    assert "'input_ids': 4" in str(info.value) and "'uid': 3" in str(info.value)


def test_mismatch_introduced_by_direct_assignment_is_caught_on_use(make_proto):
    proto = make_proto(4)
    proto.batch["advantages"] = torch.zeros(5, 5)
    with pytest.raises(ValueError, match="advantages"):
        proto.chunk(2)


@pytest.mark.parametrize("tensors, non_tensors, error", [
    ({"x": [1, 2]}, None, TypeError),
    ({"x": torch.tensor(1.0)}, None, ValueError),
    (None, {"uid": "abc"}, TypeError),
])
def test_bad_value_types_are_rejected(tensors, non_tensors, error):
    with pytest.raises(error):
        DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def test_empty_proto_has_length_zero():
    assert len(DataProto()) == 0
    assert len(DataProto.from_dict(meta_info={"temperature": 0.7})) == 0


# --------------------------------------------------------------------------- indexing


def test_int_index_keeps_the_sample_dimension(make_proto, row_ids):
    proto = make_proto(5)
    one = proto[-2]
    assert len(one) == 1 and row_ids(one) == [3]
    assert one.non_tensor_batch["uid"].tolist() == ["u3"]
    assert one.meta_info == proto.meta_info and one.meta_info is not proto.meta_info


@pytest.mark.parametrize("index, expected", [
    (slice(1, 4), [1, 2, 3]),
    (slice(None, None, -2), [5, 3, 1]),
    ([4, 0, 0], [4, 0, 0]),
    (np.array([-1, 2]), [5, 2]),
    (torch.tensor([3, 1]), [3, 1]),
    ([True, False, True, False, False, True], [0, 2, 5]),
    (np.array([False] * 5 + [True]), [5]),
    (torch.tensor([True] * 6), [0, 1, 2, 3, 4, 5]),
    ([], []),
    (torch.tensor(2), [2]),
])
def test_getitem_index_forms(make_proto, row_ids, index, expected):
    proto = make_proto(6)
    picked = proto[index]
    assert row_ids(picked) == expected
    assert picked.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in expected]
    assert picked.batch["ref_log_probs"].dtype == torch.bfloat16


@pytest.mark.parametrize("index, error", [
    (6, IndexError), (-7, IndexError), ([0, 6], IndexError), ([True, False], IndexError),
    ([0.5], IndexError), ("input_ids", TypeError),
])
def test_getitem_rejects_bad_indices(make_proto, index, error):
    with pytest.raises(error):
        make_proto(6)[index]


# ------------------------------------------------------------------ concat / chunk


def test_chunk_then_concat_is_identity(make_proto, protos_equal):
    proto = make_proto(12)
    parts = proto.chunk(4)
    assert [len(p) for p in parts] == [3, 3, 3, 3]
    protos_equal(DataProto.concat(parts), proto)


def test_chunk_not_divisible_says_how_to_fix(make_proto):
    with pytest.raises(ValueError, match="pad=True"):
        make_proto(10).chunk(4)


def test_chunk_with_pad_records_pad_size_and_unpads(make_proto, protos_equal):
    proto = make_proto(10)
    parts = proto.chunk(4, pad=True)
    assert [len(p) for p in parts] == [3, 3, 3, 3]
    assert all(p.meta_info[PAD_SIZE_KEY] == 2 for p in parts)
    merged = DataProto.concat(parts)
    protos_equal(merged.unpad(merged.meta_info.pop(PAD_SIZE_KEY)), proto)


def test_concat_merges_meta_info_and_rejects_conflicts(make_proto):
    a, b = make_proto(2), make_proto(3, seed=1)
    a.meta_info["step"] = 4
    b.meta_info["micro_batch_size"] = 2
    merged = DataProto.concat([a, b])
    assert len(merged) == 5 and merged.meta_info == {"temperature": 1.0, "step": 4, "micro_batch_size": 2}
    b.meta_info["temperature"] = 0.5
    with pytest.raises(ValueError, match="temperature"):
        DataProto.concat([a, b])


def test_concat_rejects_mismatched_keys_and_dtypes(make_proto):
    a, b = make_proto(2), make_proto(2)
    b.pop(batch_keys=["old_log_probs"])
    with pytest.raises(ValueError, match="old_log_probs"):
        DataProto.concat([a, b])
    c = make_proto(2)
    c.batch["old_log_probs"] = c.batch["old_log_probs"].double()
    with pytest.raises(ValueError, match="dtypes"):
        DataProto.concat([a, c])
    with pytest.raises(ValueError, match="empty list"):
        DataProto.concat([])


# ----------------------------------------------------------------- pad / unpad / split


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 40), k=st.integers(1, 12))
def test_pad_unpad_round_trip(length, k):
    proto = DataProto.from_dict(tensors={"x": torch.arange(length) * 10}, non_tensors={"uid": list(range(length))})
    padded, pad_size = proto.pad_to_divisor(k)
    assert len(padded) % k == 0 and 0 <= pad_size < k and len(padded) == length + pad_size
    # Padding repeats samples from the start, cycling when k exceeds the length.
    assert padded.batch["x"].tolist() == [10 * (i % length) for i in range(length + pad_size)]
    back = padded.unpad(pad_size)
    assert back.batch["x"].tolist() == proto.batch["x"].tolist()
    assert back.non_tensor_batch["uid"].tolist() == list(range(length))


def test_unpad_rejects_impossible_sizes(make_proto):
    for bad in (-1, 4, 1.0):
        with pytest.raises(ValueError, match="pad_size"):
            make_proto(3).unpad(bad)


def test_split_sizes_and_round_trip(make_proto, protos_equal):
    proto = make_proto(7)
    parts = proto.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    protos_equal(DataProto.concat(parts), proto)
    assert [len(p) for p in proto[[]].split(3)] == [0]
    with pytest.raises(ValueError, match="positive integer"):
        proto.split(0)


# ------------------------------------------------------------- select / pop / union


def test_select_keeps_named_keys_and_shares_values(make_proto):
    proto = make_proto(3)
    picked = proto.select(batch_keys=["input_ids"], non_tensor_keys=[], meta_info_keys=None)
    assert list(picked.batch) == ["input_ids"] and picked.non_tensor_batch == {}
    assert picked.meta_info == {"temperature": 1.0}
    assert picked.batch["input_ids"] is proto.batch["input_ids"]


def test_select_unknown_key_names_the_available_ones(make_proto):
    with pytest.raises(KeyError, match="available batch keys") as info:
        make_proto(3).select(batch_keys=["input_ids", "values"])
    assert "'values'" in str(info.value) and "attention_mask" in str(info.value)
    with pytest.raises(TypeError, match="list"):
        make_proto(3).select(batch_keys="input_ids")


def test_pop_removes_and_returns(make_proto):
    proto = make_proto(3)
    popped = proto.pop(batch_keys=["old_log_probs"], non_tensor_keys=["uid"], meta_info_keys=["temperature"])
    assert list(popped.batch) == ["old_log_probs"] and list(popped.non_tensor_batch) == ["uid"]
    assert popped.meta_info == {"temperature": 1.0} and proto.meta_info == {}
    assert "old_log_probs" not in proto.batch and "uid" not in proto.non_tensor_batch
    assert len(popped) == len(proto) == 3


def test_pop_unknown_key_leaves_self_intact(make_proto):
    proto = make_proto(3)
    with pytest.raises(KeyError, match="ghost"):
        proto.pop(batch_keys=["input_ids", "ghost"])
    assert "input_ids" in proto.batch


def test_union_adds_keys_and_returns_self(make_proto):
    proto = make_proto(3)
    extra = DataProto.from_dict(tensors={"values": torch.ones(3, 5), "input_ids": proto.batch["input_ids"].clone()},
                                non_tensors={"data_source": ["gsm8k"] * 3}, meta_info={"temperature": 1.0})
    assert proto.union(extra) is proto
    assert set(proto.batch) >= {"values", "input_ids"} and "data_source" in proto.non_tensor_batch
    assert proto.union(DataProto.from_dict(meta_info={"step": 1})).meta_info["step"] == 1


@pytest.mark.parametrize("other", [
    DataProto.from_dict(tensors={"input_ids": torch.zeros(3, 5, dtype=torch.long)}),
    DataProto.from_dict(non_tensors={"uid": ["x", "y", "z"]}),
    DataProto.from_dict(meta_info={"temperature": 0.3}),
])
def test_union_conflict_raises_and_changes_nothing(make_proto, other):
    proto = make_proto(3)
    proto.batch["keep"] = torch.ones(3)
    before = (dict(proto.batch), dict(proto.non_tensor_batch), dict(proto.meta_info))
    other.batch["new_key"] = torch.zeros(3)
    with pytest.raises(ValueError, match="different values"):
        proto.union(other)
    assert (proto.batch, proto.non_tensor_batch, proto.meta_info) == before


def test_union_needs_equal_lengths(make_proto):
    with pytest.raises(ValueError, match="same number of samples"):
        make_proto(3).union(make_proto(4))


# ------------------------------------------------------------------ repeat / reorder


def test_repeat_interleave_and_tile(make_proto, row_ids):
    proto = make_proto(3)
    inter = proto.repeat(2)
    assert row_ids(inter) == [0, 0, 1, 1, 2, 2]
    assert inter.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1", "u2", "u2"]
    tiled = proto.repeat(2, interleave=False)
    assert row_ids(tiled) == [0, 1, 2, 0, 1, 2]
    assert tiled.non_tensor_batch["ground_truth"].tolist() == [[0, 1], [1, 2], [2, 3]] * 2
    assert torch.equal(inter.batch["ref_log_probs"][2], proto.batch["ref_log_probs"][1])
    with pytest.raises(ValueError):
        proto.repeat(0)


def test_reorder_permutes_in_place(make_proto, row_ids):
    proto = make_proto(4)
    proto.reorder(torch.tensor([2, 0, 3, 1]))
    assert row_ids(proto) == [2, 0, 3, 1]
    assert proto.non_tensor_batch["uid"].tolist() == ["u2", "u0", "u3", "u1"]
    with pytest.raises(ValueError, match="permutation"):
        proto.reorder([0, 0, 1, 2])


def test_to_moves_tensors_only(make_proto):
    proto = make_proto(2)
    moved = proto.to("meta")
    assert all(t.device.type == "meta" for t in moved.batch.values())
    assert moved.non_tensor_batch["uid"] is proto.non_tensor_batch["uid"]
    assert proto.batch["input_ids"].device.type == "cpu"


# -------------------------------------------------------------- balanced partition


def test_balanced_partition_parts_and_order_restoration(make_proto, protos_equal):
    proto = make_proto(12, seq=9, seed=3)
    indices = proto.balanced_partition_indices(3)
    parts = proto.partition_by(indices)
    assert [len(p) for p in parts] == [4, 4, 4]
    assert sorted(i for idx in indices for i in idx) == list(range(12))
    lengths = proto.batch["attention_mask"].sum(-1)
    for part, idx in zip(parts, indices):
        assert torch.equal(part.batch["attention_mask"].sum(-1), lengths[idx])
    protos_equal(DataProto.merge_partitions(parts, indices), proto)
    assert [len(p) for p in proto.balanced_partition(3)] == [4, 4, 4]


def test_balanced_partition_needs_attention_mask(make_proto):
    proto = make_proto(4)
    proto.pop(batch_keys=["attention_mask"])
    with pytest.raises(KeyError, match="attention_mask"):
        proto.balanced_partition(2)


def test_merge_partitions_rejects_inconsistent_indices(make_proto):
    proto = make_proto(4)
    parts = proto.partition_by([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="exactly once"):
        DataProto.merge_partitions(parts, [[0, 1], [1, 3]])
    with pytest.raises(ValueError, match="part 1"):
        DataProto.merge_partitions(parts, [[0, 1], [2]])
