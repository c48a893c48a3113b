"""Reading DCP checkpoints without running code planted in them."""

from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem

from hybridflow.errors import DamagedFileError
from hybridflow.restricted_pickle import DCP_METADATA_GLOBALS, UnsafePickleError, restricted_load

METADATA_FILE = ".metadata"


class CheckpointSecurityError(UnsafePickleError):
    """A checkpoint file holds Python objects other than its data (refused: loading could run code)."""


class CheckpointFileError(DamagedFileError):
    """A checkpoint file is damaged, cut short or not what hybridflow wrote; the message names it."""


DAMAGED_HINT = "the checkpoint cannot be loaded; resume from an older one, or start from an exported model"


def unpickler_reason(err: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler refused, in one line (its message is a page of
    advice to load the file unrestricted, which is exactly what must not be done here)."""
    text = str(err)
    marker = "WeightsUnpickler error:"
    reason = text.split(marker, 1)[1] if marker in text else text
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    return lines[0] if lines and marker in text else "not a file torch.save wrote"


def read_dcp_metadata(directory: str | Path) -> Metadata:
    """The `Metadata` of the DCP checkpoint in `directory`, unpickled with DCP's classes only."""
    path = Path(directory) / METADATA_FILE
    with open(path, "rb") as f:
        try:
            metadata = restricted_load(f, DCP_METADATA_GLOBALS, what=str(path))
        except UnsafePickleError as err:
            raise CheckpointSecurityError(str(err)) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointSecurityError(f"{str(path)} holds a {type(metadata).__name__}, not DCP metadata: it was "
                                      "not written by torch.distributed.checkpoint")
    return metadata


def verify_dcp(directory: str | Path) -> Metadata:
    """Check every entry of the DCP checkpoint in `directory` (module docstring); its metadata."""
    directory = Path(directory)
    metadata = read_dcp_metadata(directory)
    sizes: dict[str, int] = {}
    try:
        entries = [(index, entry, metadata.storage_data.get(index)) for index, entry in _entries(metadata, directory)]
    except (AttributeError, TypeError, ValueError) as err:  # DCP's classes, filled with something else
        raise CheckpointFileError(f"{directory / METADATA_FILE} is damaged ({type(err).__name__}: {err}); "
                                  f"{DAMAGED_HINT}") from None
    for index, entry, info in entries:
        where = f"{directory / METADATA_FILE}: the entry {index.fqn!r}"
        if info is None:
            raise CheckpointFileError(f"{where} has no place in any shard file; {DAMAGED_HINT}")
        name = str(getattr(info, "relative_path", ""))
        if Path(name).name != name or name in ("", ".", "..") or name == METADATA_FILE:
            raise CheckpointSecurityError(f"{where} points to {name!r}, not a shard file beside it; the checkpoint "
                                          "was not written by hybridflow (or was tampered with) and is not loaded")
        if name not in sizes:
            shard = directory / name
            sizes[name] = shard.stat().st_size if shard.is_file() else -1
        _check_entry(directory / name, sizes[name], info, index, entry)
    return metadata


def _entries(metadata: Metadata, directory: Path):
    """(storage index, what is stored there) of every entry: each chunk of a tensor (its sizes
    and dtype), and each non-tensor entry (None)."""
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, BytesStorageMetadata):
            yield MetadataIndex(fqn), None
        elif isinstance(item, TensorStorageMetadata):
            dtype = item.properties.dtype
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"the entry {fqn!r} has no dtype")
            for chunk in item.chunks:
                yield MetadataIndex(fqn, chunk.offsets), (dtype, [int(n) for n in chunk.sizes])
        else:
            raise CheckpointFileError(f"{directory / METADATA_FILE}: the entry {fqn!r} is a "
                                      f"{type(item).__name__}; {DAMAGED_HINT}")


def _check_entry(shard: Path, shard_size: int, info: Any, index: MetadataIndex, tensor: tuple | None) -> None:
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    where = f"{shard}: the entry {index.fqn!r}"
    if shard_size < 0:
        raise CheckpointFileError(f"{shard} is missing ({index.fqn!r} is stored there); {DAMAGED_HINT}")
    if not (isinstance(offset, int) and isinstance(length, int) and 0 <= offset and 0 < length
            and offset + length <= shard_size):
        raise CheckpointFileError(f"{where} lies at bytes {offset}+{length}, past the file's {shard_size} bytes: the "
                                  f"file is cut short or damaged; {DAMAGED_HINT}")
    if getattr(info, "transform_descriptors", None):
        raise CheckpointFileError(f"{where} is stored transformed ({info.transform_descriptors}), which hybridflow "
                                  "never writes; the checkpoint was not written by hybridflow")
    with open(shard, "rb") as handle:
        entry = _Window(handle, offset, length)
        try:
            if tensor is None:
                _load_bytes_entry(entry)
            else:
                _check_tensor_header(entry, *tensor)
        except pickle.UnpicklingError as err:
            raise CheckpointSecurityError(
                f"{where} holds Python objects other than tensors and plain data ({unpickler_reason(err)}); it was "
                "not written by hybridflow (or was tampered with) and is not loaded, since code inside it could "
                "run") from None
        except (zipfile.BadZipFile, ValueError, KeyError, EOFError, OSError, RuntimeError, TypeError,
                AttributeError, IndexError, OverflowError, MemoryError, RecursionError) as err:
            raise CheckpointFileError(f"{where} is damaged ({type(err).__name__}: {_first_line(err)}); "
                                      f"{DAMAGED_HINT}") from None


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else "")[:300]


def _load_bytes_entry(entry: io.RawIOBase) -> None:
    with warnings.catch_warnings():  # a planted file's pickle protocol warning: refused below anyway
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        torch.load(io.BytesIO(entry.read()), weights_only=True)


@dataclass(frozen=True)
class _Storage:
    dtype: torch.dtype
    key: str
    numel: int


@dataclass(frozen=True)
class _TensorHeader:
    storage: _Storage
    offset: int
    size: tuple
    stride: tuple


def _tensor_header(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> _TensorHeader:
    if not isinstance(storage, _Storage):
        raise ValueError("a tensor without its storage")
    return _TensorHeader(storage, offset, tuple(size), tuple(stride))


class _HeaderUnpickler(pickle.Unpickler):
    """Reads the `data.pkl` of a tensor saved by torch.save into a description (no data
    is read, nothing is called but these builders)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _tensor_header
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name.endswith("Storage"):
            from torch.storage import _get_dtype_from_pickle_storage_type

            return _get_dtype_from_pickle_storage_type(name)  # KeyError for anything else
        raise pickle.UnpicklingError(f"WeightsUnpickler error: Unsupported global: {module}.{name}")

    def persistent_load(self, pid: Any) -> _Storage:
        kind, dtype, key, _location, numel = pid
        if kind != "storage" or not isinstance(dtype, torch.dtype):
            raise ValueError(f"unexpected storage reference {pid!r}")
        return _Storage(dtype, str(key), int(numel))


def _check_tensor_header(entry: io.RawIOBase, dtype: torch.dtype, sizes: list[int]) -> None:
    """The torch.save archive of one tensor chunk holds a tensor of `dtype` and `sizes`
    whose storage record has the bytes it needs (the record's data is not read)."""
    with zipfile.ZipFile(entry) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise ValueError("no tensor header (data.pkl) in the entry")
        header = _HeaderUnpickler(io.BytesIO(archive.read(pickles[0]))).load()
        if not isinstance(header, _TensorHeader):
            raise ValueError(f"the entry holds a {type(header).__name__}, not a tensor")
        prefix = pickles[0][: -len("data.pkl")]
        record = archive.getinfo(f"{prefix}data/{header.storage.key}")
    itemsize = torch.empty((), dtype=header.storage.dtype).element_size()
    if header.storage.dtype != dtype or list(header.size) != sizes:
        raise ValueError(f"a {header.storage.dtype} tensor of shape {list(header.size)} where the metadata says "
                         f"{dtype} {sizes}")
    extent = header.offset + sum((n - 1) * st for n, st in zip(header.size, header.stride)) + 1 if all(
        header.size) else 0
    if record.file_size != header.storage.numel * itemsize or extent > header.storage.numel:
        raise ValueError(f"its storage holds {record.file_size} bytes, the tensor needs {extent * itemsize}")


class _Window(io.RawIOBase):
    """Bytes [offset, offset + length) of an open file, as a seekable read-only file."""

    def __init__(self, handle: io.BufferedReader, offset: int, length: int) -> None:
        self.handle, self.start, self.length, self.position = handle, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = min(max(0, base + position), self.length)
        return self.position

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.length - self.position)
        if count <= 0:
            return 0
        self.handle.seek(self.start + self.position)
        data = self.handle.read(count)
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


class SafeFileSystemReader(dcp.FileSystemReader):
    """FileSystemReader whose `.metadata` may hold only DCP's metadata classes."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata files: hybridflow never writes them
            raise CheckpointSecurityError(f"{self.path}: per-rank DCP metadata is not supported")
        metadata = read_dcp_metadata(self.path)
        # What FileSystemReader.read_metadata does after unpickling.
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class PlainBytesLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that reads non-tensor entries with weights_only=True."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise CheckpointSecurityError(
                f"{self.directory}: the entry {read_item.dest_index.fqn!r} holds Python objects other than tensors "
                f"and plain data; it was not written by hybridflow (or was tampered with) and is not loaded, since "
                f"code inside it could run ({unpickler_reason(err)})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_dcp(state: dict[str, Any], directory: str | Path) -> None:
    """`dcp.load(state, checkpoint_id=directory)` reading only data (see the module docstring)."""
    directory = Path(directory)
    read_dcp_metadata(directory)  # a refusal as itself, not inside DCP's CheckpointException
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(directory), planner=PlainBytesLoadPlanner(directory))
    except CheckpointException as err:
        failures = [exc for exc, _ in err.failures.values()]
        refused = [exc for exc in failures if isinstance(exc, CheckpointSecurityError)]
        if refused:
            raise refused[0] from None
        first = failures[0] if failures else err
        raise CheckpointFileError(f"{directory}: a shard could not be read ({type(first).__name__}: "
                                  f"{_first_line(first)}); {DAMAGED_HINT}") from None
