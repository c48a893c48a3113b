"""Reading DCP checkpoints without running code planted in them."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from hybridflow.restricted_pickle import DCP_METADATA_GLOBALS, UnsafePickleError, restricted_load

METADATA_FILE = ".metadata"


class CheckpointSecurityError(UnsafePickleError):
    """A checkpoint file holds Python objects other than its data (refused: loading could run code)."""


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


def check_dcp_metadata(checkpoint_dir: str | Path) -> None:
    """Read every `.metadata` under `checkpoint_dir` the safe way (raises CheckpointSecurityError)."""
    for path in sorted(Path(checkpoint_dir).rglob(METADATA_FILE)):
        read_dcp_metadata(path.parent)


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
                f"code inside it could run. ({str(err).splitlines()[0]})") from None
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
        refused = [exc for exc, _ in err.failures.values() if isinstance(exc, CheckpointSecurityError)]
        if refused:
            raise refused[0] from None
        raise
