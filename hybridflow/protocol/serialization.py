"""How a DataProto crosses process boundaries (Ray's object store) and reaches disk.

Pickling a torch tensor goes through torch's storage serializer, which copies the data
into the pickle stream. Ray pickles with protocol 5 and moves numpy arrays out-of-band
(zero-copy into the object store), so we ship every tensor as a numpy array plus its
torch dtype name and rebuild the tensor with ``torch.from_numpy`` on the other side.
``benchmarks/controller/bench_protocol_serialization.py`` measures the difference.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridflow.errors import DamagedFileError
from hybridflow.restricted_pickle import NUMPY_GLOBALS, restricted_loads

STATE_VERSION = 1
_FILE_MAGIC = b"HFDATAPROTO1\n"

# torch dtypes that torch.Tensor.numpy() supports directly.
_NUMPY_NATIVE = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64,
    torch.complex64, torch.complex128,
}
# Same-width integer carriers for dtypes without a numpy equivalent (bf16, float8...).
_CARRIER_BY_ITEMSIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor_to_numpy(tensor: torch.Tensor) -> tuple[np.ndarray, str]:
    """A contiguous CPU numpy array holding ``tensor``'s bits, and the torch dtype name.

    Shares memory with ``tensor`` when it is already a contiguous CPU tensor.
    """
    # Contiguous so that pickle protocol 5 can hand the array out-of-band (numpy only
    # does that for contiguous arrays; others are copied into the stream).
    t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    dtype_name = str(t.dtype).removeprefix("torch.")
    if t.dtype in _NUMPY_NATIVE:
        return t.numpy(), dtype_name
    carrier = _CARRIER_BY_ITEMSIZE.get(t.element_size())
    if carrier is None:
        raise TypeError(
            f"cannot serialize a tensor of dtype {t.dtype} (element size {t.element_size()} "
            f"bytes); convert it to a standard dtype before putting it in a DataProto"
        )
    return t.view(carrier).numpy(), dtype_name


def numpy_to_tensor(array: np.ndarray, dtype_name: str) -> torch.Tensor:
    """Inverse of :func:`tensor_to_numpy`; copies only if ``array`` is read-only."""
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"serialized DataProto names an unknown torch dtype {dtype_name!r}; it was "
            f"probably written by a newer torch (this is {torch.__version__})"
        )
    if not array.flags.writeable:
        array = array.copy()  # see the module docstring: never alias shared memory
    tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def to_state(batch: dict[str, torch.Tensor], non_tensor_batch: dict[str, np.ndarray],
             meta_info: dict[str, Any]) -> dict[str, Any]:
    """The picklable form of a DataProto: tensors replaced by (numpy array, dtype name)."""
    return {
        "version": STATE_VERSION,
        "batch": {key: tensor_to_numpy(value) for key, value in batch.items()},
        "non_tensor_batch": dict(non_tensor_batch),
        "meta_info": dict(meta_info),
    }


def from_state(state: dict[str, Any]) -> tuple[dict, dict, dict]:
    """Inverse of :func:`to_state`: (batch, non_tensor_batch, meta_info)."""
    version = state.get("version") if isinstance(state, dict) else None
    if version != STATE_VERSION:
        raise ValueError(
            f"cannot read a serialized DataProto of format version {version!r}; this "
            f"hybridflow reads version {STATE_VERSION}. Re-create it with this version."
        )
    batch = {key: numpy_to_tensor(array, name) for key, (array, name) in state["batch"].items()}
    return batch, dict(state["non_tensor_batch"]), dict(state["meta_info"])


def save_state(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``state`` to ``path`` atomically (temporary file in the same folder + os.replace).

    Layout: magic, pickled state (protocol 5) with the array buffers kept out-of-band,
    then each buffer raw. Reading the buffers into bytearrays gives writable arrays,
    so load needs no second copy.
    """
    target = Path(path)
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
    # Same folder so os.replace is a rename on one filesystem (atomic): a reader sees
    # the old file or the new one, never half of one.
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_FILE_MAGIC)
            _write_block(f, header)
            f.write(len(buffers).to_bytes(8, "little"))
            for buffer in buffers:
                _write_block(f, buffer.raw())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Read a file written by :func:`save_state`. The header is unpickled admitting numpy's
    array reconstruction only (hybridflow/restricted_pickle.py): tensors travel as numpy
    arrays, the rest is plain data, so a planted payload is refused, not run."""
    with open(path, "rb") as f:
        magic = f.read(len(_FILE_MAGIC))
        if magic != _FILE_MAGIC:
            raise DamagedFileError(
                f"{os.fspath(path)!r} is not a DataProto file (bad header); write it with "
                f"DataProto.save"
            )
        header = _read_block(f, path)
        count = int.from_bytes(_read_exact(f, 8, path), "little")
        if count > os.fstat(f.fileno()).st_size // 8:  # each block takes at least its 8-byte length
            raise DamagedFileError(f"{os.fspath(path)!r} is damaged: it claims {count} buffers")
        buffers = [_read_block(f, path) for _ in range(count)]
    return restricted_loads(header, NUMPY_GLOBALS, what=os.fspath(path), buffers=buffers)


def _write_block(f, data: bytes | memoryview) -> None:
    f.write(len(memoryview(data).cast("B")).to_bytes(8, "little"))
    f.write(data)


def _read_block(f, path: str | os.PathLike) -> bytearray:
    size = int.from_bytes(_read_exact(f, 8, path), "little")
    return _read_exact(f, size, path)


def _read_exact(f, size: int, path: str | os.PathLike) -> bytearray:
    # A damaged length must not allocate more than the file holds.
    if size > os.fstat(f.fileno()).st_size - f.tell():
        raise DamagedFileError(f"{os.fspath(path)!r} is truncated; the DataProto file is incomplete")
    data = bytearray(size)
    if f.readinto(data) != size:
        raise DamagedFileError(f"{os.fspath(path)!r} is truncated; the DataProto file is incomplete")
    return data
