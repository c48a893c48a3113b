"""Matrix products of the generation model: the stock kernel, or fp32 panels for bf16 on CPUs."""

from __future__ import annotations

import torch

from hybridflow.engines.precision import cpu_has_fast_bf16
from hybridflow.engines.rollout.settings import MATMUL_MODES


# Elements of one converted fp32 weight panel (512 Ki x 4 B = 2 MiB, about L2 + a slice of
# L3): measured on the dev CPU, 256 Ki to 1 Mi elements run fastest; smaller panels pay
# more Python calls per product, larger ones (the whole matrix) fall out of cache.
_PANEL_ELEMS = 1 << 19
# Below this many rows the conversion of the weight (once per call, whatever the rows)
# costs more than the emulated bf16 kernel loses: those calls use the native kernel.
_MIN_ROWS = 8
# Inputs/outputs larger than this (elements) get a fresh tensor instead of a reused buffer:
# such products (long prefills) are large enough to amortise the allocation, and a
# buffer that size should not stay alive between calls.
_MAX_BUFFERED = 1 << 23


def resolve_matmul(mode: str, dtype: torch.dtype, device_type: str) -> str:
    """The concrete kernel for config value `mode` ("auto" resolved for this dtype and device)."""
    if mode not in MATMUL_MODES:
        raise ValueError(f"matmul must be one of {MATMUL_MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    emulated_bf16 = dtype == torch.bfloat16 and device_type == "cpu" and not cpu_has_fast_bf16()
    return "fp32_panels" if emulated_bf16 else "native"


def native_matmul(x: torch.Tensor, w_in_out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [m, k] @ w [k, n] (+ bias) with torch's kernel in the tensors' dtype."""
    return torch.mm(x, w_in_out) if bias is None else torch.addmm(bias, x, w_in_out)


class PanelMatmul:
    """`x @ w (+ bias)` by fp32 sgemm over weight panels converted into reused buffers."""

    def __init__(self, panel_elems: int = _PANEL_ELEMS) -> None:
        self.panel_elems = panel_elems
        self._buffers: dict[str, torch.Tensor] = {}

    def _buffer(self, key: str, numel: int, device: torch.device) -> torch.Tensor:
        """`numel` fp32 elements: a prefix of the reused buffer `key`, or fresh when too large."""
        if numel > _MAX_BUFFERED:
            return torch.empty(numel, dtype=torch.float32, device=device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel or buf.device != device:
            buf = torch.empty(numel, dtype=torch.float32, device=device)
            self._buffers[key] = buf
        return buf[:numel]

    def release(self) -> None:
        """Drop the buffers (they come back, at their old size, on the next call)."""
        self._buffers.clear()

    def __call__(self, x: torch.Tensor, w_in_out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [m, k] @ w [k, n] (+ bias); `w` may be a transposed view (lm_head.t())."""
        (m, k), n = x.shape, w_in_out.shape[1]
        if m < _MIN_ROWS or x.dtype == torch.float32:
            return native_matmul(x, w_in_out, bias)
        dev = x.device
        x32 = self._buffer("x", m * k, dev).view(m, k)
        x32.copy_(x)
        out32 = self._buffer("out", m * n, dev).view(m, n)
        # panel width: a multiple of 16 columns (one AVX-512 register of fp32)
        width = max(16, (self.panel_elems // k) // 16 * 16)
        panel = self._buffer("panel", k * min(width, n), dev)
        for start in range(0, n, width):
            stop = min(n, start + width)
            dst = panel[: k * (stop - start)].view(k, stop - start)
            dst.copy_(w_in_out[:, start:stop])  # bf16 -> fp32 conversion of this panel only
            # a column slice of out32 is a valid BLAS output (leading dimension n): no copy
            torch.mm(x32, dst, out=out32[:, start:stop])
        if bias is not None:
            out32.add_(bias)
        return out32.to(x.dtype)
