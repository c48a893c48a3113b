"""DataProto pickling (the Ray path), save/load, and the read-only buffer handling."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto

ALL_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn]


def mixed_proto(n: int = 6) -> DataProto:
    """One tensor per dtype, with values that would not survive a lossy conversion."""
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for dtype in ALL_DTYPES:
        raw = torch.randn(n, 3, generator=gen) * 50
        tensors[str(dtype)] = raw > 0 if dtype == torch.bool else raw.to(dtype)
    tensors["bf16_specials"] = torch.tensor([[float("nan"), float("inf"), -0.0]] * n, dtype=torch.bfloat16)
    return DataProto.from_dict(
        tensors=tensors,
        non_tensors={"raw_prompt": [f"prompt {i} é" for i in range(n)], "ground_truth": [{"a": i} for i in range(n)],
                     "score": np.arange(n, dtype=np.float32)},
        meta_info={"temperature": 0.7, "metrics": {"kl": [0.1, 0.2]}},
    )


def assert_bit_exact(a: DataProto, b: DataProto) -> None:
    assert list(a.batch) == list(b.batch)
    for key, x in a.batch.items():
        y = b.batch[key]
        assert y.dtype == x.dtype and y.shape == x.shape, key
        # Compare bits so NaN, -0.0 and float8 values count as equal only when identical.
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        assert torch.equal(x.view(width) if x.dtype != torch.bool else x, y.view(width) if y.dtype != torch.bool else y), key
    for key, x in a.non_tensor_batch.items():
        y = b.non_tensor_batch[key]
        assert y.dtype == x.dtype and y.tolist() == x.tolist(), key
    assert a.meta_info == b.meta_info


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_round_trip_keeps_dtypes_and_values(protocol):
    proto = mixed_proto()
    assert_bit_exact(proto, pickle.loads(pickle.dumps(proto, protocol=protocol)))


def test_state_holds_numpy_not_torch():
    """The point of the custom state: nothing torch-pickled travels through Ray."""
    state = mixed_proto().__getstate__()
    for array, dtype_name in state["batch"].values():
        assert isinstance(array, np.ndarray) and array.flags.c_contiguous
        assert isinstance(getattr(torch, dtype_name), torch.dtype)
    assert state["batch"]["torch.bfloat16"][0].dtype == np.int16


def out_of_band_round_trip(proto: DataProto, writable: bool) -> tuple[DataProto, list]:
    """What Ray does: protocol 5 with the array buffers handed over separately."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(proto, protocol=5, buffer_callback=buffers.append)
    raw = [bytearray(b.raw()) if writable else bytes(b.raw()) for b in buffers]
    return pickle.loads(payload, buffers=raw), raw


def test_tensors_go_out_of_band():
    buffers: list[pickle.PickleBuffer] = []
    proto = DataProto.from_dict(tensors={"input_ids": torch.arange(4096).view(4, 1024)})
    payload = pickle.dumps(proto, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and buffers[0].raw().nbytes == 4096 * 8
    assert len(payload) < 2048  # only the header is in-band


def test_read_only_buffers_are_copied_so_writes_stay_local():
    proto = mixed_proto()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when wrapping a non-writable array
        received, raw = out_of_band_round_trip(proto, writable=False)
    assert_bit_exact(proto, received)
    snapshot = [bytes(b) for b in raw]
    received.batch["torch.int64"].add_(1)  # would write into shared memory if aliased
    assert [bytes(b) for b in raw] == snapshot


def test_writable_buffers_are_adopted_without_copy():
    proto = DataProto.from_dict(tensors={"old_log_probs": torch.randn(8, 16).bfloat16()})
    received, raw = out_of_band_round_trip(proto, writable=True)
    address = np.frombuffer(raw[0], dtype=np.uint8).ctypes.data
    assert received.batch["old_log_probs"].data_ptr() == address
    assert received.batch["old_log_probs"].dtype == torch.bfloat16


def test_views_and_grad_tensors_serialize_their_values():
    base = torch.arange(24.0).view(4, 6)
    proto = DataProto.from_dict(tensors={"t": base.t().contiguous().t()[:, 1:4], "g": torch.ones(4, requires_grad=True)})
    back = pickle.loads(pickle.dumps(proto, protocol=5))
    assert torch.equal(back.batch["t"], proto.batch["t"])
    assert not back.batch["g"].requires_grad and torch.equal(back.batch["g"], torch.ones(4))


def test_deepcopy_is_independent():
    proto = mixed_proto()
    clone = copy.deepcopy(proto)
    assert_bit_exact(proto, clone)
    clone.batch["torch.float32"].zero_()
    clone.non_tensor_batch["ground_truth"][0]["a"] = 99
    assert proto.batch["torch.float32"].abs().sum() > 0 and proto.non_tensor_batch["ground_truth"][0] == {"a": 0}


def test_save_load_round_trip_exact(tmp_path):
    proto = mixed_proto()
    path = tmp_path / "batch.dp"
    proto.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = DataProto.load(path)
    assert_bit_exact(proto, loaded)
    loaded.batch["torch.int32"].add_(1)  # loaded tensors are ordinary writable tensors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.dp"]  # no temporary file left


def test_save_replaces_an_existing_file(tmp_path):
    path = tmp_path / "batch.dp"
    mixed_proto(2).save(path)
    mixed_proto(5).save(str(path))
    assert len(DataProto.load(path)) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.dp"]


def test_failed_save_keeps_the_old_file(tmp_path):
    path = tmp_path / "batch.dp"
    mixed_proto(2).save(path)
    broken = mixed_proto(3)
    broken.meta_info["callback"] = lambda: None  # cannot be pickled
    with pytest.raises((pickle.PicklingError, AttributeError)):
        broken.save(path)
    assert len(DataProto.load(path)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.dp"]


def test_load_rejects_foreign_and_truncated_files(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"x": torch.ones(2)}, foreign)
    with pytest.raises(ValueError, match="not a DataProto file"):
        DataProto.load(foreign)
    path = tmp_path / "batch.dp"
    mixed_proto().save(path)
    cut = tmp_path / "cut.dp"
    cut.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        DataProto.load(cut)


def test_unknown_state_version_is_explained():
    state = mixed_proto(1).__getstate__()
    state["version"] = 99
    with pytest.raises(ValueError, match="version 99"):
        DataProto.__new__(DataProto).__setstate__(state)
