"""Unpickling files a run reads back, without running code planted in them.

`pickle.load` calls whatever function a pickle names, so a file that a checkpoint or a
run directory hands back (DCP's `.metadata`, a saved DataProto) could run anything. A
`RestrictedUnpickler` resolves only the globals of an explicit allow-list; any other
global ends the load with `UnsafePickleError`, before it is called, naming the file and
the global it asked for.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Collection
from typing import Any

from hybridflow.errors import UserInputError

_DCP = "torch.distributed.checkpoint.metadata"
# What torch.distributed.checkpoint (torch 2.13) writes into `.metadata`, found by reading
# the globals of real checkpoints (model + optimizer, every dtype we train in).
DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    *((_DCP, name) for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata",
                                "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
                                "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout from its name (torch.strided)
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # StorageMeta.checkpoint_id
    ("collections", "OrderedDict"),
})

# numpy arrays and scalars (object arrays of str / dict / list included: their elements are
# plain data, the only globals they name are these). numpy >= 2 moved core to _core.
NUMPY_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    *((core, name) for core in ("numpy.core.multiarray", "numpy._core.multiarray")
      for name in ("_reconstruct", "scalar")),
    *((core, "_frombuffer") for core in ("numpy.core.numeric", "numpy._core.numeric")),
    ("numpy", "ndarray"), ("numpy", "dtype"),
})


class UnsafePickleError(UserInputError):
    """A file holds a pickle that names a global outside its allow-list (refused, not run)."""


def _is_torch_dtype(module: str, name: str) -> bool:
    # torch.float32 & co. pickle as the global `torch.<name>`; resolve only real dtypes.
    if module != "torch":
        return False
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


def _is_numpy_dtype_class(module: str, name: str) -> bool:
    # numpy >= 1.25 pickles dtypes as numpy.dtypes.Float64DType & co.
    return module == "numpy.dtypes" and name.endswith("DType") and name.isidentifier()


class RestrictedUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only `allowed` globals (module, name) and torch dtypes."""

    def __init__(self, file: io.BufferedIOBase, allowed: Collection[tuple[str, str]], what: str,
                 **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.allowed, self.what = allowed, what

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed or _is_torch_dtype(module, name) or _is_numpy_dtype_class(module, name):
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"{self.what} asks to load {module}.{name}, which is not data this file may hold: it was not written "
            "by hybridflow (or was tampered with) and is not loaded, since code inside it could run")


def restricted_loads(data: bytes | bytearray | memoryview, allowed: Collection[tuple[str, str]], what: str,
                     *, buffers: list | None = None) -> Any:
    """`pickle.loads` resolving only `allowed` globals; a damaged stream is an UnsafePickleError too."""
    return _guarded(lambda: RestrictedUnpickler(io.BytesIO(data), allowed, what, buffers=buffers).load(), what)


def restricted_load(file: io.BufferedIOBase, allowed: Collection[tuple[str, str]], what: str) -> Any:
    """`pickle.load` from an open binary file, resolving only `allowed` globals."""
    return _guarded(lambda: RestrictedUnpickler(file, allowed, what).load(), what)


def _guarded(load: Callable[[], Any], what: str) -> Any:
    try:
        return load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError, RecursionError, OverflowError) as err:  # a damaged length or nesting
        raise UnsafePickleError(f"{what} is damaged and cannot be read ({type(err).__name__}: {err})") from None
