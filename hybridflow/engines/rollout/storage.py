"""Give a model's weight memory back between rollouts and take it again, in place.

A colocated actor trains and generates on the same device, so the generation weights
must not stay allocated while training. `ReleasableStorage` shrinks the storage of a
fixed set of tensors to zero bytes (the tensor objects, their shapes and every view of
them stay valid, so name tables and modules need no rebuilding) and grows it back on
resume. With keep_values the values are copied to host memory first and restored; on a
CPU device there is nowhere cheaper to put them, so they simply stay.
"""

from __future__ import annotations

import torch


class ReleasableStorage:
    """The storages of `tensors` (each storage owned by exactly one of them)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self._sizes = [t.untyped_storage().nbytes() for t in tensors]
        self.released = False
        self._offloaded: list[torch.Tensor] | None = None

    def nbytes(self) -> int:
        """Bytes allocated right now (0 after a release)."""
        return sum(t.untyped_storage().nbytes() for t in self.tensors)

    def release(self, *, keep_values: bool) -> bool:
        """Free the storage; returns True when the values are gone (reload them after resume)."""
        if self.released:
            return self._offloaded is None
        if keep_values and self.tensors[0].device.type == "cpu":
            return False  # host memory is where they would go anyway: nothing to free
        self._offloaded = [t.detach().to("cpu", copy=True) for t in self.tensors] if keep_values else None
        for t in self.tensors:
            t.untyped_storage().resize_(0)
        self.released = True
        return not keep_values

    def resume(self) -> None:
        """Re-allocate the storage; the values come back if they were offloaded."""
        if not self.released:
            return
        for i, (t, size) in enumerate(zip(self.tensors, self._sizes)):
            t.untyped_storage().resize_(size)
            if self._offloaded is not None:
                t.copy_(self._offloaded[i])
        self._offloaded = None
        self.released = False
