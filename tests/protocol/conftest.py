"""Fixtures for the protocol tests: a small DataProto builder and an exact comparison."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hybridflow.protocol import DataProto


def build_proto(n: int, seq: int = 5, seed: int = 0) -> DataProto:
    """n samples whose values encode the row number, so reorderings are visible."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.arange(n)
    lengths = torch.randint(1, seq + 1, (n,), generator=gen)
    mask = (torch.arange(seq)[None, :] >= seq - lengths[:, None]).long()  # left padded
    return DataProto.from_dict(
        tensors={
            "input_ids": rows[:, None] * 100 + torch.arange(seq)[None, :],
            "attention_mask": mask,
            "old_log_probs": torch.randn(n, seq, generator=gen),
            "ref_log_probs": torch.randn(n, seq, generator=gen).to(torch.bfloat16),
            "response_mask": torch.rand(n, seq, generator=gen) > 0.5,
        },
        non_tensors={"uid": [f"u{i}" for i in range(n)], "ground_truth": [[i, i + 1] for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def assert_protos_equal(a: DataProto, b: DataProto) -> None:
    """Same keys, dtypes, shapes and values (bit-exact; object arrays element by element)."""
    assert list(a.batch) == list(b.batch)
    for key in a.batch:
        x, y = a.batch[key], b.batch[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), key
    assert list(a.non_tensor_batch) == list(b.non_tensor_batch)
    for key in a.non_tensor_batch:
        x, y = a.non_tensor_batch[key], b.non_tensor_batch[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert x.tolist() == y.tolist(), key
    assert a.meta_info == b.meta_info


@pytest.fixture
def make_proto() -> Callable[..., DataProto]:
    return build_proto


@pytest.fixture
def protos_equal() -> Callable[[DataProto, DataProto], None]:
    return assert_protos_equal


def rows_of(proto: DataProto) -> list[int]:
    """The original row numbers of build_proto samples, read back from input_ids."""
    return (proto.batch["input_ids"][:, 0] // 100).tolist()


@pytest.fixture
def row_ids() -> Callable[[DataProto], list[int]]:
    return rows_of


