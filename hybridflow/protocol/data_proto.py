"""DataProto: the batch that travels between the controller and the workers.

A DataProto holds three things:

- ``batch``: torch tensors that all share dimension 0, the number of samples;
- ``non_tensor_batch``: numpy arrays (often ``dtype=object``: strings, dicts) with one
  entry per sample along dimension 0;
- ``meta_info``: step-wide values (temperature, micro-batch size, metrics).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Union

import numpy as np
import torch

from hybridflow.errors import DamagedFileError
from hybridflow.protocol import _checks, serialization
from hybridflow.protocol.partition import balanced_partition

# chunk(k, pad=True) records how many padding samples it added under this meta_info key,
# so a collector that sees only the chunks can call `merged.unpad(merged.meta_info.pop(PAD_SIZE_KEY))`.
PAD_SIZE_KEY = "_pad_size"

Index = Union[int, slice, Sequence[int], Sequence[bool], np.ndarray, torch.Tensor]


class DataProto:
    """A batch of samples: tensors, per-sample numpy arrays and step-wide meta info."""

    def __init__(self, batch: dict[str, torch.Tensor] | None = None,
                 non_tensor_batch: dict[str, np.ndarray] | None = None,
                 meta_info: dict[str, Any] | None = None) -> None:
        self.batch: dict[str, torch.Tensor] = dict(batch or {})
        self.non_tensor_batch: dict[str, np.ndarray] = dict(non_tensor_batch or {})
        self.meta_info: dict[str, Any] = dict(meta_info or {})
        self._check_types()
        len(self)  # raises when the keys disagree on the number of samples

    @classmethod
    def from_dict(cls, tensors: dict[str, torch.Tensor] | None = None,
                  non_tensors: dict[str, Any] | None = None,
                  meta_info: dict[str, Any] | None = None) -> DataProto:
        """Build a DataProto; lists/tuples in ``non_tensors`` become 1-D object arrays."""
        converted = {key: _to_object_array(key, value) for key, value in (non_tensors or {}).items()}
        return cls(batch=tensors, non_tensor_batch=converted, meta_info=meta_info)

    # ----------------------------------------------------------------- size and access

    def __len__(self) -> int:
        sizes = {key: value.shape[0] for key, value in self.batch.items()}
        sizes.update({key: value.shape[0] for key, value in self.non_tensor_batch.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(
                f"DataProto keys disagree on the number of samples (dimension 0): {sizes}; "
                f"every tensor and non-tensor array must have the same first dimension"
            )
        return next(iter(sizes.values()), 0)

    def __repr__(self) -> str:
        tensors = {k: f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}" for k, v in self.batch.items()}
        arrays = {k: f"{v.dtype}{list(v.shape)}" for k, v in self.non_tensor_batch.items()}
        return (f"DataProto(len={len(self)}, batch={tensors}, non_tensor_batch={arrays}, "
                f"meta_info_keys={list(self.meta_info)})")

    def __getitem__(self, index: Index) -> DataProto:
        """Samples at ``index``; an int gives a DataProto of one sample (dimension kept)."""
        length = len(self)
        if isinstance(index, torch.Tensor | np.ndarray) and index.ndim == 0:
            index = index.item()
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            if not -length <= index < length:
                raise IndexError(f"index {index} is out of range for a DataProto of {length} samples")
            position = int(index) % length
            return self._take(slice(position, position + 1))
        if isinstance(index, slice):
            if index.step is None or index.step > 0:
                return self._take(index)
            # torch tensors cannot be sliced with a negative step; gather instead.
            return self._take(np.ascontiguousarray(np.arange(length)[index]))
        return self._take(_checks.as_index_array(index, length))

    def _take(self, rows: slice | np.ndarray) -> DataProto:
        tensor_rows = rows if isinstance(rows, slice) else torch.from_numpy(rows)
        return DataProto(
            batch={key: value[tensor_rows] for key, value in self.batch.items()},
            non_tensor_batch={key: value[rows] for key, value in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    # ------------------------------------------------------------- combine and divide

    @staticmethod
    def concat(items: Sequence[DataProto]) -> DataProto:
        """Samples of all ``items`` in order; keys must match, meta_info is merged.

        A meta_info key present in several items must have the same value in all of them.
        """
        items = list(items)
        if not items:
            raise ValueError("DataProto.concat needs at least one DataProto, got an empty list")
        _check_same_layout(items)
        first = items[0]
        batch = {key: torch.cat([item.batch[key] for item in items]) for key in first.batch}
        non_tensor = {key: np.concatenate([item.non_tensor_batch[key] for item in items])
                      for key in first.non_tensor_batch}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=_merge_meta(items))

    def chunk(self, k: int, pad: bool = False) -> list[DataProto]:
        """``k`` parts of equal length, in order.

        When ``len(self)`` is not divisible by ``k``: ``pad=False`` raises; ``pad=True``
        first pads like :meth:`pad_to_divisor` and writes the pad count into every part's
        ``meta_info[PAD_SIZE_KEY]`` (also when it is 0).
        """
        k = _checks.positive_int(k, "chunk: k (number of parts)")
        length = len(self)
        if length % k and not pad:
            raise ValueError(
                f"cannot chunk {length} samples into {k} equal parts; pass pad=True, or use "
                f"pad_to_divisor({k}) before and unpad(pad_size) after"
            )
        source, pad_size = self.pad_to_divisor(k) if pad else (self, 0)
        size = len(source) // k
        parts = [source._take(slice(i * size, (i + 1) * size)) for i in range(k)]
        if pad:
            for part in parts:
                part.meta_info[PAD_SIZE_KEY] = pad_size
        return parts

    def pad_to_divisor(self, k: int) -> tuple[DataProto, int]:
        """Append copies of the first samples (cycling) until the length divides by ``k``.

        Returns ``(padded, pad_size)``; ``padded.unpad(pad_size)`` gives the original rows.
        """
        k = _checks.positive_int(k, "pad_to_divisor: k (divisor)")
        length = len(self)
        pad_size = -length % k
        if pad_size == 0:
            return self._take(slice(None)), 0
        rows = np.concatenate([np.arange(length), np.arange(pad_size) % length])
        return self._take(rows), pad_size

    def unpad(self, pad_size: int) -> DataProto:
        """Drop the last ``pad_size`` samples (the ones :meth:`pad_to_divisor` added)."""
        length = len(self)
        is_int = isinstance(pad_size, (int, np.integer)) and not isinstance(pad_size, bool)
        if not is_int or not 0 <= pad_size <= length:
            raise ValueError(
                f"unpad: pad_size must be an int between 0 and {length} (the length), got {pad_size!r}"
            )
        return self._take(slice(0, length - int(pad_size)))

    def split(self, size: int) -> list[DataProto]:
        """Consecutive parts of ``size`` samples (the last may be smaller), e.g. micro-batches.

        An empty DataProto gives one empty part, so ``concat(split(x))`` is always ``x``.
        """
        size = _checks.positive_int(size, "split: size (samples per part)")
        length = len(self)
        return [self._take(slice(start, start + size)) for start in range(0, max(length, 1), size)]

    def repeat(self, n: int, interleave: bool = True) -> DataProto:
        """Each sample ``n`` times: ``a,a,b,b`` if interleaved (n responses per prompt), else ``a,b,a,b``."""
        n = _checks.positive_int(n, "repeat: n (copies per sample)")
        rows = np.arange(len(self))
        return self._take(np.repeat(rows, n) if interleave else np.tile(rows, n))

    def reorder(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> None:
        """Permute the samples in place: sample ``i`` becomes the old sample ``indices[i]``."""
        length = len(self)
        rows = _checks.as_index_array(indices, length)
        if not _checks.is_permutation(rows, length):
            raise ValueError(
                f"reorder needs a permutation of range({length}); use data[indices] to select "
                f"or duplicate samples instead"
            )
        tensor_rows = torch.from_numpy(rows)
        for key, value in self.batch.items():
            self.batch[key] = value[tensor_rows]
        for key, value in self.non_tensor_batch.items():
            self.non_tensor_batch[key] = value[rows]

    # ------------------------------------------------------------------- keys

    def select(self, batch_keys: Iterable[str] | None = None, non_tensor_keys: Iterable[str] | None = None,
               meta_info_keys: Iterable[str] | None = None) -> DataProto:
        """A new DataProto with only the named keys; ``None`` keeps every key of that part.

        Values are shared with ``self`` (no copy).
        """
        picks = [_checks.resolve_keys(source, keys, default_all=True, section=section, operation="select")
                 for source, keys, section in self._sections(batch_keys, non_tensor_keys, meta_info_keys)]
        return DataProto(batch={key: self.batch[key] for key in picks[0]},
                         non_tensor_batch={key: self.non_tensor_batch[key] for key in picks[1]},
                         meta_info={key: self.meta_info[key] for key in picks[2]})

    def pop(self, batch_keys: Iterable[str] | None = None, non_tensor_keys: Iterable[str] | None = None,
            meta_info_keys: Iterable[str] | None = None) -> DataProto:
        """Remove the named keys from ``self`` and return them; ``None`` pops nothing of that part.

        All keys are checked before anything is removed, so a KeyError leaves ``self`` intact.
        """
        picks = [_checks.resolve_keys(source, keys, default_all=False, section=section, operation="pop")
                 for source, keys, section in self._sections(batch_keys, non_tensor_keys, meta_info_keys)]
        return DataProto(batch={key: self.batch.pop(key) for key in picks[0]},
                         non_tensor_batch={key: self.non_tensor_batch.pop(key) for key in picks[1]},
                         meta_info={key: self.meta_info.pop(key) for key in picks[2]})

    def union(self, other: DataProto) -> DataProto:
        """Add ``other``'s keys to ``self`` (in place) and return ``self`` for chaining.

        Both must have the same number of samples (unless one holds only meta_info). A key
        present in both must hold equal values. Nothing changes when a check fails.
        """
        if not isinstance(other, DataProto):
            raise TypeError(f"union needs a DataProto, got {type(other).__name__}")
        has_rows = [bool(proto.batch or proto.non_tensor_batch) for proto in (self, other)]
        if all(has_rows) and len(self) != len(other):
            raise ValueError(f"union needs the same number of samples, got {len(self)} and {len(other)}")
        pairs = [(self.batch, other.batch, "batch"),
                 (self.non_tensor_batch, other.non_tensor_batch, "non_tensor_batch"),
                 (self.meta_info, other.meta_info, "meta_info")]
        for mine, theirs, section in pairs:
            for key, value in theirs.items():
                if key in mine and not _checks.same_value(mine[key], value):
                    raise ValueError(
                        f"union: {section} key {key!r} is in both DataProtos with different values "
                        f"({_checks.short_repr(mine[key])} vs {_checks.short_repr(value)}); pop or "
                        f"rename it on one side first"
                    )
        for mine, theirs, _ in pairs:
            mine.update(theirs)
        return self

    def to(self, device: str | torch.device) -> DataProto:
        """A new DataProto with the tensors on ``device`` (non-tensors and meta_info shared)."""
        return DataProto(batch={key: value.to(device) for key, value in self.batch.items()},
                         non_tensor_batch=self.non_tensor_batch, meta_info=self.meta_info)

    # ------------------------------------------------------------- load balancing

    def balanced_partition_indices(self, k: int, equal_size: bool = True) -> list[list[int]]:
        """Index lists of a balanced split by token count (``attention_mask.sum(-1)``).

        See :func:`hybridflow.protocol.partition.balanced_partition` for the algorithm.
        """
        mask = self.batch.get("attention_mask")
        if mask is None or mask.dim() < 2:
            raise KeyError(
                "balanced partition needs batch['attention_mask'] of shape (batch, seq_len) to "
                f"measure lengths; batch keys: {sorted(self.batch)}. Use balanced_partition(seqlens, k) "
                "with your own lengths otherwise"
            )
        return balanced_partition(mask.sum(dim=-1).tolist(), k, equal_size=equal_size)

    def balanced_partition(self, k: int, equal_size: bool = True) -> list[DataProto]:
        """``k`` parts with near-equal token counts; samples keep their relative order.

        To restore the original order of per-part results, compute the indices with
        :meth:`balanced_partition_indices`, split with :meth:`partition_by`, and put the
        results back with :meth:`merge_partitions`.
        """
        return self.partition_by(self.balanced_partition_indices(k, equal_size=equal_size))

    def partition_by(self, index_lists: Sequence[Sequence[int]]) -> list[DataProto]:
        """One DataProto per index list (``[self[idx] for idx in index_lists]``)."""
        return [self[list(indices)] for indices in index_lists]

    @staticmethod
    def merge_partitions(parts: Sequence[DataProto], index_lists: Sequence[Sequence[int]]) -> DataProto:
        """Inverse of :meth:`partition_by`: concatenate ``parts`` back into the original order.

        ``parts[i]`` must hold the samples at positions ``index_lists[i]`` and the index
        lists together must cover every position exactly once.
        """
        if len(parts) != len(index_lists):
            raise ValueError(f"merge_partitions got {len(parts)} parts but {len(index_lists)} index lists")
        for number, (part, indices) in enumerate(zip(parts, index_lists)):
            if len(part) != len(indices):
                raise ValueError(f"merge_partitions: part {number} has {len(part)} samples but its "
                                 f"index list has {len(indices)}")
        positions = np.asarray([i for indices in index_lists for i in indices], dtype=np.int64)
        if not _checks.is_permutation(positions, positions.shape[0]):
            raise ValueError("merge_partitions: the index lists must cover 0..n-1 exactly once")
        inverse = np.empty_like(positions)
        inverse[positions] = np.arange(positions.shape[0])  # where each original position sits in the concat
        return DataProto.concat(parts)._take(inverse)

    # ------------------------------------------------------------------ persistence

    def __getstate__(self) -> dict[str, Any]:
        return serialization.to_state(self.batch, self.non_tensor_batch, self.meta_info)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch, self.non_tensor_batch, self.meta_info = serialization.from_state(state)

    def save(self, path: str | os.PathLike) -> None:
        """Write to ``path`` atomically; :meth:`load` restores it exactly (bf16, object arrays)."""
        serialization.save_state(self.__getstate__(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> DataProto:
        """Read a file written by :meth:`save` (arrays and plain data only: a planted payload is refused)."""
        proto = cls.__new__(cls)
        state = serialization.load_state(path)
        try:
            proto.__setstate__(state)
            proto._check_types()
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RuntimeError) as err:
            raise DamagedFileError(f"{os.fspath(path)!r} is not a DataProto hybridflow wrote ({type(err).__name__}: "
                                   f"{err}); the file is damaged") from None
        return proto

    # ------------------------------------------------------------------ helpers

    def _sections(self, batch_keys, non_tensor_keys, meta_info_keys) -> list[tuple[dict, Any, str]]:
        return [(self.batch, batch_keys, "batch"),
                (self.non_tensor_batch, non_tensor_keys, "non_tensor_batch"),
                (self.meta_info, meta_info_keys, "meta_info")]

    def _check_types(self) -> None:
        for key, value in self.batch.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"batch[{key!r}] must be a torch.Tensor, got {type(value).__name__}; "
                                f"convert with torch.as_tensor or put it in non_tensor_batch")
            if value.dim() == 0:
                raise ValueError(f"batch[{key!r}] is a 0-d tensor; per-sample tensors need dimension 0 = "
                                 f"batch size, put step-wide scalars in meta_info")
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                raise TypeError(f"non_tensor_batch[{key!r}] must be a numpy array with one entry per sample, "
                                f"got {type(value).__name__}; DataProto.from_dict converts lists")


def _to_object_array(key: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"non_tensors[{key!r}] must be a list, tuple or numpy array, got {type(value).__name__}"
        )
    # Filling an empty object array element by element keeps it 1-D even when every
    # element is itself a list of equal length (np.array would build a 2-D array).
    array = np.empty(len(value), dtype=object)
    for i, element in enumerate(value):
        array[i] = element
    return array


def _check_same_layout(items: list[DataProto]) -> None:
    first = items[0]
    for number, item in enumerate(items):
        if not isinstance(item, DataProto):
            raise TypeError(f"DataProto.concat: item {number} is a {type(item).__name__}, not a DataProto")
        for section, mine, theirs in (("batch", item.batch, first.batch),
                                      ("non_tensor_batch", item.non_tensor_batch, first.non_tensor_batch)):
            if set(mine) != set(theirs):
                raise ValueError(
                    f"DataProto.concat: item {number} has {section} keys {sorted(mine)} but item 0 has "
                    f"{sorted(theirs)}; select or pop keys so all items match"
                )
        for key, value in item.batch.items():
            reference = first.batch[key]
            if value.dtype != reference.dtype or value.shape[1:] != reference.shape[1:]:
                raise ValueError(
                    f"DataProto.concat: batch[{key!r}] of item {number} is {value.dtype}{list(value.shape)} "
                    f"but item 0 has {reference.dtype}{list(reference.shape)}; dtypes and all dimensions "
                    f"but the first must match (pad sequences to one length first)"
                )


def _merge_meta(items: list[DataProto]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for number, item in enumerate(items):
        for key, value in item.meta_info.items():
            if key in merged and not _checks.same_value(merged[key], value):
                raise ValueError(
                    f"DataProto.concat: meta_info[{key!r}] differs between items "
                    f"({_checks.short_repr(merged[key])} vs {_checks.short_repr(value)} in item {number}); "
                    f"pop it before concatenating or make it agree"
                )
            merged.setdefault(key, value)
    return merged
