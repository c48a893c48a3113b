"""State that a run reads back cannot run code: `save_plain_state` trees (JSON + safetensors)
come back bit for bit and refuse what would need pickle; a DataProto file with a planted
payload is refused by `DataProto.load`, not run."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto, serialization
from hybridflow.protocol.plain_state import load_plain_state, save_plain_state
from hybridflow.restricted_pickle import UnsafePickleError
from tests.payload import Payload


def test_a_tree_round_trips_bit_for_bit(tmp_path):
    gen = torch.Generator().manual_seed(3)
    tree = [{"obs": np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32),
             "generator": gen.get_state(), "episodes": (np.arange(4.0), np.arange(4)),
             "scaler": {"mean": np.float64(0.1), "count": 1e-4, "returns": np.zeros(4)},
             "envs": None, "version": 3, "name": "é", "flags": [True, None, 2.5], "bf16": torch.ones(2).bfloat16()}]
    save_plain_state(tmp_path / "runners", tree)
    back = load_plain_state(tmp_path / "runners")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runners.json", "runners.safetensors"]
    (got,), (want,) = back, tree
    assert got.keys() == want.keys()
    assert np.array_equal(got["obs"], want["obs"]) and got["obs"].dtype == np.float32
    assert torch.equal(got["generator"], want["generator"]) and torch.equal(got["bf16"], want["bf16"])
    assert isinstance(got["episodes"], tuple) and got["episodes"][1].dtype == want["episodes"][1].dtype
    assert got["scaler"]["mean"] == want["scaler"]["mean"] and isinstance(got["scaler"]["mean"], np.float64)
    assert [got[k] for k in ("envs", "version", "name", "flags")] == [None, 3, "é", [True, None, 2.5]]


@pytest.mark.parametrize("value", [b"bytes", object(), np.array([{"a": 1}], dtype=object), {1: "int key"}])
def test_what_would_need_pickle_is_refused_when_saving(tmp_path, value):
    with pytest.raises(TypeError, match="state.x|x:"):
        save_plain_state(tmp_path / "s", {"x": value})


def test_a_dataproto_file_with_a_planted_payload_is_refused_not_run(tmp_path):
    proto = DataProto.from_dict({"a": torch.ones(2, 3)}, non_tensors={"uid": ["p", "q"]}, meta_info={"t": 1.0})
    marker = tmp_path / "payload-ran"
    state = proto.__getstate__()
    state["meta_info"]["evil"] = Payload(marker)
    serialization.save_state(state, tmp_path / "planted.dataproto")  # the file layout DataProto.save writes
    with pytest.raises(UnsafePickleError, match=r"planted.dataproto asks to load pathlib\.Path\.touch"):
        DataProto.load(tmp_path / "planted.dataproto")
    assert not marker.exists()
    with open(tmp_path / "planted.dataproto", "rb") as f:  # what the loader did before: plain pickle
        f.read(len(serialization._FILE_MAGIC))
        header = serialization._read_block(f, "planted")
        buffers = [serialization._read_block(f, "planted")
                   for _ in range(int.from_bytes(serialization._read_exact(f, 8, "planted"), "little"))]
    pickle.loads(header, buffers=buffers)
    assert marker.exists()
