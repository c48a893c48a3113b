"""Preallocated key/value cache for slot-based decoding.

Layout: [layers, slots, kv_heads, max_len, head_dim] for keys and values. Heads come before
positions (unlike the token-major layout in the issue text) so that
`k[layer, :rows, :, :kv_len]` is directly the [batch, heads, seq, dim] view that
scaled_dot_product_attention wants: no transpose, no copy per step.

The scheduler keeps live sequences in slots 0..n-1 (a compact prefix), which is what lets a
decode step read one contiguous slice instead of gathering scattered slots.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values for `slots` sequences of up to `max_len` tokens each."""

    def __init__(
        self,
        num_layers: int,
        slots: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (num_layers, slots, kv_heads, max_len, head_dim)
        # Zeroed once per allocation: masked positions are multiplied by zero attention weight,
        # and 0 * (uninitialised NaN) would poison the output.
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def fits(self, slots: int, max_len: int, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether this cache can serve a call needing `slots` x `max_len` (for reuse when kept)."""
        return (
            self.slots >= slots
            and self.max_len >= max_len
            and self.k.dtype == dtype
            and self.k.device == torch.device(device)
        )

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` into slot `dst` (all layers)."""
        self.k[:, dst, :, :length].copy_(self.k[:, src, :, :length])
        self.v[:, dst, :, :length].copy_(self.v[:, src, :, :length])

    def move_slots(self, src: list[int], dst: list[int], length: int) -> None:
        """Copy the first `length` positions of slots `src` onto slots `dst` (disjoint), all
        layers, in one indexed copy per buffer."""
        s, d = (torch.tensor(x, dtype=torch.long, device=self.k.device) for x in (src, dst))
        for buf in (self.k, self.v):
            prefix = buf[:, :, :, :length]
            prefix.index_copy_(1, d, prefix.index_select(1, s))
