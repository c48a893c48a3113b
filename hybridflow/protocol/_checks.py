"""Input validation and value comparison shared by DataProto's operations.

Kept apart from ``data_proto.py`` so that the class reads as the list of operations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch


def positive_int(value: Any, what: str) -> int:
    """``value`` if it is an int >= 1, else a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def as_index_array(index: Any, length: int) -> np.ndarray:
    """Normalise a list / numpy / torch index (integers or a boolean mask) to int64 positions.

    Negative positions count from the end, as in Python. Out-of-range positions and masks
    of the wrong length raise IndexError.
    """
    if isinstance(index, torch.Tensor):
        array = index.detach().cpu().numpy()
    elif isinstance(index, (list, tuple, range, np.ndarray)):
        array = np.asarray(index)
    else:
        raise TypeError(
            f"cannot index a DataProto with {type(index).__name__}; use an int, a slice, "
            f"or a list / numpy array / torch tensor of ints or bools"
        )
    if array.ndim != 1:
        raise IndexError(f"DataProto index must be one-dimensional, got shape {tuple(array.shape)}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)  # np.asarray([]) is float64; an empty pick is fine
    if array.dtype == np.bool_:
        if array.shape[0] != length:
            raise IndexError(
                f"boolean mask has length {array.shape[0]} but the DataProto has {length} samples"
            )
        return np.flatnonzero(array).astype(np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise IndexError(f"DataProto index must hold ints or bools, got dtype {array.dtype}")
    array = array.astype(np.int64)
    bad = (array < -length) | (array >= length)
    if bad.any():
        raise IndexError(
            f"index {int(array[bad][0])} is out of range for a DataProto of {length} samples"
        )
    return np.where(array < 0, array + length, array)


def is_permutation(positions: np.ndarray, length: int) -> bool:
    """True when ``positions`` holds every value of range(length) exactly once."""
    return positions.shape[0] == length and bool(np.array_equal(np.sort(positions), np.arange(length)))


def resolve_keys(available: Mapping[str, Any], requested: Iterable[str] | None, *, default_all: bool,
                 section: str, operation: str) -> list[str]:
    """The keys of ``available`` that ``requested`` names, checked.

    ``None`` means every key (``default_all``) or none. A bare string is refused because
    iterating it would silently ask for one key per character.
    """
    if requested is None:
        return list(available) if default_all else []
    if isinstance(requested, str):
        raise TypeError(
            f"{operation}: pass {section} keys as a list, e.g. [{requested!r}], not a bare string"
        )
    keys = list(requested)
    unknown = [key for key in keys if key not in available]
    if unknown:
        raise KeyError(
            f"{operation}: unknown {section} key(s) {unknown}; available {section} keys: {sorted(available)}"
        )
    return keys


def same_value(a: Any, b: Any) -> bool:
    """Whether two batch / meta_info values are equal (tensors and arrays compared exactly)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and _tensors_equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and _arrays_equal(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        # Containers holding tensors make `==` ambiguous; treat them as different so the
        # caller reports a conflict instead of guessing.
        return False


def _tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point() or a.is_complex():
        # NaN marks e.g. masked-out positions; the same NaN in both is agreement.
        return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
    return bool(torch.equal(a, b))


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    try:
        return bool(np.array_equal(a, b))
    except (TypeError, ValueError):
        return bool(all(same_value(x, y) for x, y in zip(a.ravel(), b.ravel())))


def short_repr(value: Any, limit: int = 80) -> str:
    """repr() cut to ``limit`` characters, for error messages about big values."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
