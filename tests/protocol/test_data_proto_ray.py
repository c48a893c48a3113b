"""DataProto through Ray's real object store: exact values and safe in-place writes.

Objects above Ray's inline limit (100 KiB) live in shared memory and come back as
read-only numpy arrays; the batch here is well above it. A worker process deserializes
with the same code as the driver, so one ray.put/ray.get here covers both sides (a task
would add seconds of worker start-up for no new code path). Uses the session's shared
Ray (fixture ``ray_local`` in tests/conftest.py).
"""

from __future__ import annotations

import warnings

import ray
import torch

from hybridflow.protocol import DataProto


def big_proto() -> DataProto:
    gen = torch.Generator().manual_seed(0)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.randint(0, 50_000, (64, 512), generator=gen),
            "attention_mask": torch.ones(64, 512, dtype=torch.int64),
            "ref_log_probs": torch.randn(64, 512, generator=gen).to(torch.bfloat16),
            "response_mask": torch.rand(64, 512, generator=gen) > 0.3,
        },
        non_tensors={"uid": [f"uid-{i}" for i in range(64)]},
        meta_info={"temperature": 1.0},
    )


def test_put_get_is_exact_and_writable(ray_local):
    proto = big_proto()
    ref = ray.put(proto)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps a read-only array
        first = ray.get(ref)
    for key, tensor in proto.batch.items():
        assert first.batch[key].dtype == tensor.dtype and torch.equal(first.batch[key], tensor), key
    assert first.non_tensor_batch["uid"].tolist() == proto.non_tensor_batch["uid"].tolist()
    first.batch["input_ids"].zero_()
    again = ray.get(ref)  # the stored object is unchanged by the write above
    assert torch.equal(again.batch["input_ids"], proto.batch["input_ids"])
