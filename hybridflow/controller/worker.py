"""`Worker`: the base class of one SPMD rank of a worker group."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

from hybridflow.controller.network import rendezvous_store


@dataclass(frozen=True)
class WorkerContext:
    """Where one rank sits: its group, its node and the group's rendezvous address."""

    role: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    def env(self) -> dict[str, str]:
        """The torch.distributed environment variables for this rank."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    @classmethod
    def from_env(cls, role: str = "") -> WorkerContext:
        """Read the variables back; a process without them is rank 0 of 1 (a local test)."""
        env = os.environ
        return cls(
            role=role,
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 0)),
        )


@dataclass(frozen=True)
class MeshCoord:
    """A rank's place for one named mesh: which data-parallel rank it serves, and whether
    the controller collects its output (e.g. only tensor-parallel rank 0 of each dp group)."""

    dp_rank: int
    dp_size: int
    is_collect: bool


class Worker:
    """One rank of a worker group. Subclass it; decorate methods with `@register`.

    Calling ``super().__init__()`` is optional: the runtime sets the context first.
    """

    _hf_ctx: WorkerContext

    def __init__(self) -> None:
        if "_hf_ctx" not in self.__dict__:  # built outside a WorkerGroup (plain unit use)
            self._hf_ctx = WorkerContext.from_env(role=type(self).__name__)

    # ---------------------------------------------------------------- place in the group

    @property
    def context(self) -> WorkerContext:
        if "_hf_ctx" not in self.__dict__:
            self._hf_ctx = WorkerContext.from_env(role=type(self).__name__)
        return self._hf_ctx

    @property
    def rank(self) -> int:
        return self.context.rank

    @property
    def world_size(self) -> int:
        return self.context.world_size

    @property
    def local_rank(self) -> int:
        return self.context.local_rank

    @property
    def local_world_size(self) -> int:
        return self.context.local_world_size

    @property
    def master_addr(self) -> str:
        return self.context.master_addr

    @property
    def master_port(self) -> int:
        return self.context.master_port

    @property
    def role(self) -> str:
        return self.context.role

    # ------------------------------------------------------------------- dispatch meshes

    def register_dispatch_mesh(self, name: str, *, dp_rank: int, dp_size: int, is_collect: bool) -> None:
        """Declare this rank's coordinates for ``Dispatch.MESH(name)`` calls.

        Every rank of the group must declare the mesh (usually in ``__init__``), with one
        collecting rank per data-parallel rank.
        """
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"register_dispatch_mesh({name!r}): dp_rank={dp_rank} is outside 0..{dp_size - 1}")
        self._hf_meshes()[name] = MeshCoord(dp_rank=int(dp_rank), dp_size=int(dp_size), is_collect=bool(is_collect))

    def dispatch_mesh(self, name: str) -> MeshCoord | None:
        """The coordinates registered under ``name``, or None."""
        return self._hf_meshes().get(name)

    def _hf_meshes(self) -> dict[str, MeshCoord]:
        return self.__dict__.setdefault("_hf_mesh_coords", {})

    # ------------------------------------------------------------------ process groups

    def init_process_group(self, backend: str | None = None, timeout_s: float = 1800.0) -> None:
        """Join the group's default torch.distributed process group (once per process).

        Default backend: gloo without GPUs; with GPUs one group that runs CUDA tensors
        over nccl and CPU tensors over gloo (``"cpu:gloo,cuda:nccl"``). Colocated roles
        share the process, so a second call (from another role) is a no-op.
        """
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        use_cuda = torch.cuda.is_available()
        if backend is None:
            backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
        if use_cuda:
            # Ray exposes only this actor's GPU(s) through CUDA_VISIBLE_DEVICES.
            torch.cuda.set_device(0)
        ctx = self.context
        kwargs: dict[str, Any] = {}
        if use_cuda and "nccl" in backend:
            kwargs["device_id"] = torch.device("cuda", 0)
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend=backend,
            store=rendezvous_store(ctx.master_addr, ctx.master_port, ctx.rank, ctx.world_size, timeout),
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=timeout,
            **kwargs,
        )

