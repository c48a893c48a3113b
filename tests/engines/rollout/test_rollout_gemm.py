"""The fp32-panel matmul (RolloutConfig.matmul="fp32_panels") against an exact reference.

A bf16 GEMM's result is the exact sum of products of bf16 numbers rounded to bf16; the
reference computes that sum in float64. The panel path accumulates in fp32, so it may
differ only by the final rounding: at most one bf16 ulp of the result.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.engines.rollout import RolloutConfig
from hybridflow.engines.rollout.gemm import PanelMatmul, native_matmul


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 numbers at |x| (8 significant bits)."""
    exponent = torch.frexp(x.abs().clamp(min=1e-30)).exponent
    return torch.ldexp(torch.ones_like(x), exponent - 8)


def _exact(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ w.double()
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("transposed", [False, True], ids=["in_out", "lm_head_view"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_panels_equal_exact_bf16_product_within_one_ulp(transposed, with_bias):
    gen = torch.Generator().manual_seed(0)
    m, k, n = 12, 48, 200  # 8 * 48 elements per panel -> 16-column panels, last one partial
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16().t() if transposed else torch.randn(k, n, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    matmul = PanelMatmul(panel_elems=8 * k)
    out = matmul(x, w, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    exact = _exact(x, w, bias)
    assert ((out.double() - exact).abs() <= _bf16_ulp(exact)).all()
    # the buffers are reused: a second, smaller call must not see stale values
    again = matmul(x[:9], w, bias)
    assert ((again.double() - exact[:9]).abs() <= _bf16_ulp(exact[:9])).all()


def test_few_rows_and_fp32_use_the_native_kernel():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(32, 64, generator=gen).bfloat16()
    few = torch.randn(3, 32, generator=gen).bfloat16()
    assert torch.equal(PanelMatmul()(few, w, None), native_matmul(few, w, None))
    x32, w32 = torch.randn(16, 32, generator=gen), torch.randn(32, 64, generator=gen)
    assert torch.equal(PanelMatmul()(x32, w32, None), native_matmul(x32, w32, None))


def test_unknown_matmul_mode_is_rejected():
    with pytest.raises(ValueError, match="matmul must be one of"):
        RolloutConfig(matmul="fp16_panels")


def test_auto_picks_fp32_panels_exactly_for_bf16_on_cpus_without_native_bf16():
    from hybridflow.engines.precision import cpu_has_fast_bf16
    from hybridflow.engines.rollout.gemm import resolve_matmul

    emulated = "native" if cpu_has_fast_bf16() else "fp32_panels"
    assert resolve_matmul("auto", torch.bfloat16, "cpu") == emulated
    assert RolloutConfig(dtype=torch.bfloat16, matmul="auto").matmul == emulated
    assert RolloutConfig(dtype=torch.float32).matmul == "native"  # the default is auto
    assert resolve_matmul("auto", torch.bfloat16, "cuda") == "native"
    assert resolve_matmul("native", torch.bfloat16, "cpu") == "native"  # explicit choices stand
