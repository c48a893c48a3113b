"""dtype selection: explicit names map directly; "auto" follows the hardware."""

import pytest
import torch

from hybridflow.engines.precision import cpu_has_fast_bf16, resolve_dtype


def test_explicit_names():
    assert resolve_dtype("bf16", "cpu") is torch.bfloat16
    assert resolve_dtype("fp32", "cuda") is torch.float32


def test_auto_follows_hardware():
    assert resolve_dtype("auto", "cuda") is torch.bfloat16
    expected = torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    assert resolve_dtype("auto", "cpu") is expected


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("fp16", "cpu")
