"""HybridEngine: the actor's switch between its training layout and its generation layout.

    hybrid = HybridEngine.build(actor.named_sharded_parameters, hf_config,
                                RolloutConfig(dtype=torch.bfloat16), gen_tp=2, method="hybrid",
                                backend="native")  # any registered rollout backend (rollout.name)
    stats = hybrid.to_generation()        # gather into the rollout engine's TP layout
    out = hybrid.rollout.generate(prompts, sampling)
    hybrid.to_training()                  # release the generation copy
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from hybridflow.engines.reshard.accounting import CommMeter, MemoryLedger, nbytes
from hybridflow.engines.reshard.grouping import (
    GatherSpec,
    GenerationGrouping,
    ReshardMethod,
    all_gather_groups,
    plan_for_rank,
)
from hybridflow.engines.reshard.layout import TrainingLayout, local_shard
from hybridflow.engines.reshard.placement import generation_shard_dim
from hybridflow.engines.rollout import RolloutConfig, RolloutEngine, build_rollout_engine

NamedParameters = Callable[[], Iterable[tuple[str, torch.Tensor]]]


@dataclass(frozen=True)
class TransitionStats:
    """What one training -> generation transition cost this rank (see accounting.py)."""

    method: str
    world_size: int
    gen_tp: int
    comm_bytes: int
    comm_calls: int
    train_shard_bytes: int
    generation_bytes: int
    buffer_bytes: int  # peak of the transient gather buffers
    peak_bytes: int
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


class HybridEngine:
    """Reshards training parameters into a rollout engine (see module docstring)."""

    def __init__(self, named_parameters: NamedParameters, rollout: RolloutEngine, layout: TrainingLayout,
                 grouping: GenerationGrouping, groups: dict[tuple[int, ...], dist.ProcessGroup],
                 transfer_dtype: torch.dtype, bucket_bytes: int | None = None) -> None:
        self.named_parameters = named_parameters
        self.rollout = rollout
        self.layout = layout
        self.grouping = grouping
        self.rank = dist.get_rank()
        self.plan: list[GatherSpec] = plan_for_rank(layout, grouping, self.rank)
        self.groups = groups
        self.transfer_dtype = transfer_dtype
        if bucket_bytes is not None and bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1 (or None: one parameter per call), got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self.load_calls = 0  # load_weights calls of the last transition
        self._check_rollout()
        # Training owns the memory until the first transition.
        self.rollout.release_memory()

    @classmethod
    def build(cls, named_parameters: NamedParameters, hf_config, rollout_config: RolloutConfig, *,
              gen_tp: int, method: ReshardMethod | str, backend: str = "native", tokenizer=None,
              model_path: str | None = None, bucket_bytes: int | None | str = "engine") -> "HybridEngine":
        """Collective: describe the layout, create process groups, build the rollout engine.

        `backend` is a registered rollout backend name (`rollout.name`); it is built on this
        rank's generation TP group, with `tokenizer` (stop strings) and `model_path`.
        `bucket_bytes`: "engine" takes the backend's `sync_bucket_bytes`; None streams one
        parameter per call; a number stages buckets of that size (module docstring).
        """
        layout = TrainingLayout.from_named_parameters(named_parameters())
        grouping = GenerationGrouping.build(layout, gen_tp, method)
        groups = create_process_groups(layout, grouping)
        tp_group = groups.get(grouping.tp_group_of(dist.get_rank()))
        rollout = build_rollout_engine(backend, hf_config, rollout_config, process_group=tp_group,
                                       tokenizer=tokenizer, model_path=model_path)
        bucket = rollout.sync_bucket_bytes if bucket_bytes == "engine" else bucket_bytes
        return cls(named_parameters, rollout, layout, grouping, groups, rollout_config.dtype, bucket)

    # ------------------------------------------------------------------ transitions
    @torch.no_grad()
    def to_generation(self) -> TransitionStats:
        """Fill the rollout engine with the current training weights (collective)."""
        start = time.perf_counter()
        meter, ledger = CommMeter(), MemoryLedger()
        params = dict(self.named_parameters())
        if set(params) != {s.name for s in self.plan if self.rank in s.members}:
            raise RuntimeError("the training parameters changed names since the HybridEngine was built")
        locals_ = {name: local_shard(p).detach() for name, p in params.items()}
        ledger.set_train(sum(nbytes(t) for t in locals_.values()))
        self.rollout.resume_memory()
        ledger.set_generation(self.rollout.weight_storage_bytes())
        bucket = _Bucket(self.rollout, self.bucket_bytes, self.transfer_dtype, ledger)
        if self.grouping.method is ReshardMethod.HYBRID:
            self._stream(locals_, meter, ledger, bucket)
        else:
            self._gather_whole_model(locals_, meter, ledger, bucket)
        bucket.flush()
        self.load_calls = bucket.calls
        return TransitionStats(
            method=self.grouping.method.value, world_size=self.layout.world_size, gen_tp=self.grouping.tp_size,
            comm_bytes=meter.bytes, comm_calls=meter.calls, train_shard_bytes=ledger.train,
            generation_bytes=ledger.generation, buffer_bytes=ledger.peak_buffers, peak_bytes=ledger.peak,
            seconds=time.perf_counter() - start,
        )

    def to_training(self) -> None:
        """Release the generation copy (and KV cache); training state is untouched."""
        self.rollout.release_memory()

    def _stream(self, locals_: dict[str, torch.Tensor], meter: CommMeter, ledger: MemoryLedger,
                bucket: "_Bucket") -> None:
        # Each gather yields exactly this rank's generation shard: handed over (unbucketed:
        # loaded and its buffer freed) before the next gather, so without buckets at most
        # one parameter's shard is in flight.
        for spec in self.plan:
            piece, size = self._fetch(spec, locals_, meter, ledger)
            bucket.add(spec, piece, size)
            del piece

    def _gather_whole_model(self, locals_: dict[str, torch.Tensor], meter: CommMeter, ledger: MemoryLedger,
                            bucket: "_Bucket") -> None:
        # The baselines materialise every full parameter before handing them over (the
        # paper's gather-then-partition); the engine cuts its own piece from each.
        gathered = [(spec, *self._fetch(spec, locals_, meter, ledger)) for spec in self.plan]
        for spec, piece, size in gathered:
            bucket.add(spec, piece, size)
        del gathered

    def _fetch(self, spec: GatherSpec, locals_: dict[str, torch.Tensor], meter: CommMeter,
               ledger: MemoryLedger) -> tuple[torch.Tensor, int]:
        """This rank's copy of one parameter as `spec` lays it out: gathered inside its pipeline
        stage by the holders, then (with stages) broadcast over the pipeline group by `source`.
        Returns it and its buffer bytes."""
        holder = self.rank in spec.members
        piece, size = self._gather(spec, locals_[spec.name], meter, ledger) if holder else (None, 0)
        if spec.source is None:
            return piece, size
        # Gathers along dim d leave the tensor as a dim-d-first buffer seen through movedim:
        # broadcast that contiguous buffer and view the received one the same way.
        d = spec.dim or 0
        if size == 0:
            # Nothing gathered (a one-member group, or a rank of another stage): a buffer in
            # the transfer dtype to broadcast from or into.
            shape = list(spec.shape)
            device = next(iter(locals_.values())).device  # where the training shards live
            buffer = torch.empty([shape.pop(d), *shape], dtype=self.transfer_dtype, device=device)
            if holder:
                buffer.copy_(piece.movedim(d, 0))
            piece, size = buffer.movedim(0, d), nbytes(buffer)
            ledger.alloc(size)
        meter.broadcast(piece.movedim(d, 0), spec.source, self.groups[spec.pipe_group])
        return piece, size

    def _gather(self, spec: GatherSpec, local: torch.Tensor, meter: CommMeter,
                ledger: MemoryLedger) -> tuple[torch.Tensor, int]:
        """(the gathered tensor, its buffer bytes); a one-member group needs no buffer."""
        if spec.group_size == 1:
            return local, 0  # load_weights converts the dtype while copying into place
        if spec.pieces is not None:
            return self._gather_ragged(spec, local, meter, ledger)
        g, d = spec.group_size, spec.dim
        moved = local.movedim(d, 0)  # gather along `d` by stacking chunks on a leading axis
        buffer = torch.empty((g, *moved.shape), dtype=self.transfer_dtype, device=local.device)
        ledger.alloc(nbytes(buffer))
        me = spec.members.index(self.rank)
        buffer[spec.positions[me]].copy_(moved)
        meter.all_gather(buffer, spec.positions, me, self.groups[spec.members])
        full_moved = buffer.view(g * moved.shape[0], *moved.shape[1:])
        return full_moved.movedim(0, d), nbytes(buffer)

    def _gather_ragged(self, spec: GatherSpec, local: torch.Tensor, meter: CommMeter,
                       ledger: MemoryLedger) -> tuple[torch.Tensor, int]:
        """The whole tensor from pieces of unequal length: each is padded to the longest for
        one all-gather, then copied to its offset."""
        d = spec.dim
        moved = local.movedim(d, 0)
        width = max(length for _, length in spec.pieces)
        buffer = torch.zeros((spec.group_size, width, *moved.shape[1:]), dtype=self.transfer_dtype,
                             device=local.device)
        full = torch.empty((spec.shape[d], *moved.shape[1:]), dtype=self.transfer_dtype, device=local.device)
        ledger.alloc(nbytes(buffer) + nbytes(full))
        me = spec.members.index(self.rank)
        buffer[me, : moved.shape[0]].copy_(moved)
        meter.all_gather(buffer, spec.positions, me, self.groups[spec.members])
        for member, (offset, length) in enumerate(spec.pieces):
            full[offset : offset + length].copy_(buffer[member, :length])
        ledger.free(nbytes(buffer))
        return full.movedim(0, d), nbytes(full)

    def _check_rollout(self) -> None:
        r = self.rollout
        want_rank = self.grouping.gen_rank[self.rank]
        if r.tp_size != self.grouping.tp_size or r.tp_rank != want_rank:
            raise ValueError(
                f"rollout engine is TP rank {r.tp_rank} of {r.tp_size}, the grouping needs rank "
                f"{want_rank} of {self.grouping.tp_size}; build it with the group from create_process_groups"
            )
        for spec in self.plan:
            if r.shard_dim(spec.name) != generation_shard_dim(spec.name):
                raise ValueError(f"{spec.name}: the rollout engine splits dim {r.shard_dim(spec.name)}, "
                                 f"the resharder assumed {generation_shard_dim(spec.name)}")


class _Bucket:
    """Parameters on their way to the rollout engine, handed over in `load_weights` calls.

    limit None: each parameter is loaded as it comes and its buffer freed (the engine
    converts the dtype while copying into place). A limit: parameters are staged in the
    rollout dtype (a copy only where the dtype differs; the gather buffer it came from is
    freed at once) until the next one would pass `limit` bytes, or its `sharded` flag
    differs (a parameter the engine replicates is whole either way and joins any bucket),
    then loaded in one call. The boundary is decided on the parameter's full size,
    which every rank of a generation group knows alike, so all of them make the same calls.
    """

    def __init__(self, rollout: RolloutEngine, limit: int | None, dtype: torch.dtype, ledger: MemoryLedger) -> None:
        self.rollout, self.limit, self.dtype, self.ledger = rollout, limit, dtype, ledger
        self.items: list[tuple[str, torch.Tensor]] = []
        self.sharded: bool | None = None  # None: only replicated parameters staged so far
        self.full_bytes = 0  # full sizes of the staged parameters (the boundary rule)
        self.buffer_bytes = 0  # ledger bytes the staged tensors hold
        self.calls = 0

    def add(self, spec: GatherSpec, piece: torch.Tensor, size: int) -> None:
        if self.limit is None:
            self.items, self.sharded, self.buffer_bytes = [(spec.name, piece)], spec.is_gen_shard, size
            self.flush()
            return
        full = math.prod(spec.shape) * self.dtype.itemsize
        sharded = spec.is_gen_shard if self.rollout.shard_dim(spec.name) is not None else None
        clash = None not in (sharded, self.sharded) and sharded != self.sharded
        if self.items and (clash or self.full_bytes + full > self.limit):
            self.flush()
        staged = piece.to(self.dtype)
        if staged is not piece:  # converted: the copy is the buffer now
            self.ledger.alloc(nbytes(staged))
            self.ledger.free(size)
            size = nbytes(staged)
        self.items.append((spec.name, staged))
        self.sharded = self.sharded if sharded is None else sharded
        self.full_bytes += full
        self.buffer_bytes += size

    def flush(self) -> None:
        if not self.items:
            return
        self.rollout.load_weights(self.items, sharded=bool(self.sharded))
        self.calls += 1
        self.ledger.free(self.buffer_bytes)
        self.items, self.sharded, self.full_bytes, self.buffer_bytes = [], None, 0, 0


def create_process_groups(layout: TrainingLayout, grouping: GenerationGrouping) -> dict[tuple[int, ...], dist.ProcessGroup]:
    """Collective: one process group per distinct gather group and generation TP group (size > 1)."""
    wanted = set(all_gather_groups(layout, grouping)) | {g for g in grouping.tp_groups if len(g) > 1}
    # Every rank must create every group, in the same order.
    return {members: dist.new_group(list(members)) for members in sorted(wanted)}

