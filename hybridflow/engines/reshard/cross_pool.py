"""Weights from the training pool to a separate rollout pool, by torch.distributed.

With `trainer.mode` one_step_off or async (docs/async.md) the actor trains in one set of
processes and a rollout worker group generates in another, so the 3D-HybridEngine's
in-place reshard does not apply. A `WeightBridge` is a process group that spans both
pools: bridge rank 0 is the actor's training rank 0, bridge ranks 1..R are the rollout
ranks. It is a gloo group created from its own TCPStore (hosted by the sender), so it
lives beside each pool's default process group without touching either.
"""

from __future__ import annotations

import datetime
import math
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hybridflow.controller.network import rendezvous_store

DEFAULT_BUCKET_BYTES = 64 << 20


@dataclass(frozen=True)
class TensorMeta:
    """One entry of the manifest: a full tensor's name, shape and dtype (by name)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.torch_dtype).element_size()


@dataclass(frozen=True)
class TransferStats:
    """What one sync cost one bridge rank."""

    version: int
    bytes: int
    buckets: int
    tensors: int
    seconds: float

    def as_metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}/{k}": float(v) for k, v in asdict(self).items()}


def manifest_of(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    """The manifest of (name, possibly sharded) parameters: full shapes, training dtypes."""
    return [TensorMeta(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named]


def buckets_of(manifest: list[TensorMeta], bucket_bytes: int) -> list[list[int]]:
    """Indices of the manifest grouped into buckets: consecutive, one dtype, at most
    `bucket_bytes` each (a single tensor larger than that gets a bucket of its own)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    out: list[list[int]] = []
    size, dtype = 0, None
    for i, meta in enumerate(manifest):
        if out and meta.dtype == dtype and size + meta.nbytes <= bucket_bytes:
            out[-1].append(i)
            size += meta.nbytes
        else:
            out.append([i])
            size, dtype = meta.nbytes, meta.dtype
    return out


def bridge_backend(cuda_available: bool) -> str:
    """The bridge's torch.distributed backend: nccl between GPU pools, gloo on CPU."""
    return "nccl" if cuda_available else "gloo"


def free_port(host: str) -> int:
    """A TCP port free on `host` right now (the bridge's store binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class WeightBridge:
    """The process group between training rank 0 (bridge rank 0) and the rollout ranks."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, manifest: list[TensorMeta],
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = 600.0,
                 backend: str | None = None) -> None:
        """Collective over the bridge: every member calls it with the same host, port,
        world size and manifest; rank 0 hosts the store. `backend` None: `bridge_backend`
        of this process (nccl with a CUDA device, else gloo)."""
        if world_size < 2:
            raise ValueError(f"a weight bridge needs a sender and at least one receiver, got world_size={world_size}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.backend = backend or bridge_backend(torch.cuda.is_available())
        if self.backend not in ("nccl", "gloo"):
            raise ValueError(f"weight bridge backend must be 'nccl' or 'gloo', got {self.backend!r}")
        self.store = rendezvous_store(host, port, rank, world_size, timeout)
        self._check_backends_agree(rank, world_size)
        if self.backend == "nccl":
            # GPU pools: the buckets live on this process's GPU and move GPU to GPU.
            self.device = torch.device("cuda", torch.cuda.current_device())
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.group = dist.ProcessGroupNCCL(self.store, rank, world_size, opts)
        else:  # CPU pools
            self.device = torch.device("cpu")
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        self.rank, self.world_size = rank, world_size
        self.manifest = list(manifest)
        self.buckets = buckets_of(self.manifest, bucket_bytes)

    def _check_backends_agree(self, rank: int, world_size: int) -> None:
        """Every member publishes its backend in the store; a training pool on GPUs and a
        rollout pool on CPUs (or the reverse) cannot share one bridge."""
        self.store.set(f"backend/{rank}", self.backend)
        theirs = {self.store.get(f"backend/{r}").decode() for r in range(world_size)}
        if theirs != {self.backend}:
            raise RuntimeError(f"weight bridge members disagree on the backend ({sorted(theirs)}): put the training "
                               "and rollout pools on the same kind of device (resources.use_gpu)")

    def _broadcast(self, flat: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([flat], opts).wait()

    def _header(self, version: int = -1) -> int:
        head = torch.tensor([version], dtype=torch.int64, device=self.device)
        self._broadcast(head)
        return int(head.item())

    def send(self, full_tensors: Iterator[tuple[str, torch.Tensor | None]], version: int) -> TransferStats:
        """Bridge rank 0: broadcast the header (`version`), then the tensors, in manifest
        order, bucket by bucket.

        `full_tensors` yields (name, full tensor) on rank 0; it is consumed in step with
        the buckets so at most one bucket and one tensor are held at a time."""
        if self.rank != 0:
            raise RuntimeError("WeightBridge.send runs on bridge rank 0 (training rank 0); the others receive")
        start, moved = time.perf_counter(), 0
        self._header(version)
        for bucket in self.buckets:
            metas = [self.manifest[i] for i in bucket]
            flat = torch.empty(sum(m.numel for m in metas), dtype=metas[0].torch_dtype, device=self.device)
            offset = 0
            for meta in metas:
                name, tensor = next(full_tensors)
                if name != meta.name or tuple(tensor.shape) != meta.shape or tensor.dtype != meta.torch_dtype:
                    raise RuntimeError(f"weight sync: got {name} {tuple(tensor.shape)} {tensor.dtype}, the manifest "
                                       f"expects {meta.name} {meta.shape} {meta.dtype} (parameters changed since the "
                                       "bridge was built)")
                flat[offset:offset + meta.numel].copy_(tensor.reshape(-1))
                offset += meta.numel
            self._broadcast(flat)
            moved += flat.numel() * flat.element_size()
        return TransferStats(version, moved, len(self.buckets), len(self.manifest), time.perf_counter() - start)

    def receive(self, load: Callable[[list[tuple[str, torch.Tensor]]], None]) -> TransferStats:
        """Bridge ranks >= 1: receive one sync (header, then every bucket) and `load` each
        bucket's full tensors (views into a bucket allocated for this sync: they stay valid
        as long as the caller keeps them). The stats carry the sync's version."""
        if self.rank == 0:
            raise RuntimeError("WeightBridge.receive runs on the rollout ranks (bridge rank >= 1)")
        version = self._header()
        start, moved = time.perf_counter(), 0
        for bucket in self.buckets:
            metas = [self.manifest[i] for i in bucket]
            flat = torch.empty(sum(m.numel for m in metas), dtype=metas[0].torch_dtype, device=self.device)
            self._broadcast(flat)
            moved += flat.numel() * flat.element_size()
            views, offset = [], 0
            for meta in metas:
                views.append((meta.name, flat[offset:offset + meta.numel].view(meta.shape)))
                offset += meta.numel
            load(views)
        return TransferStats(version, moved, len(self.buckets), len(self.manifest), time.perf_counter() - start)


def full_tensors(named: Iterable[tuple[str, torch.Tensor]], keep: bool) -> Iterator[tuple[str, torch.Tensor | None]]:
    """(name, full CPU tensor) of sharded parameters; collective over the training pool
    (every rank must iterate to the end). Ranks with `keep` False get (name, None)."""
    for name, param in named:
        full = param.detach().full_tensor() if isinstance(param, DTensor) else param.detach()
        yield name, full if keep else None
