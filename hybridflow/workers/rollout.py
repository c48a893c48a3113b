"""`RolloutWorker`: a generation-only role on its own pool (trainer.mode one_step_off / async).

Each rank holds a native rollout engine (tensor parallel over consecutive ranks when
rollout.tensor_model_parallel_size > 1) and a `StreamingRollout` over it, so generation
can stop between scheduler iterations, take new weights and continue the same sequences
(partial rollouts, engines/rollout/partial.py). Weights arrive from the actor's training
rank 0 over a `WeightBridge` (engines/reshard/cross_pool.py), never through the controller:

    rollout.init_model()
    rollout.join_weight_bridge(host, port, world, manifest, bucket_bytes)   # with the actor's
    rollout.receive_weights(version)             # paired with actor.send_weights()
    parts = rollout.generate_stream(prompts_per_rank, max_steps).get()

`generate_stream` takes one DataProto of new prompts (or None) per rank, adds them to the
stream, runs at most `max_steps` scheduler iterations (None: until everything queued is
finished) and returns, per rank, the prompt groups that finished (tensor-parallel ranks
other than 0 return []). Sampling seeds follow the hybrid actor's rule (workers/
generation.py), so a rollout pool that is never ahead of training generates exactly what
the synchronous run's actor generates.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybridflow.controller import CallFuture, Dispatch, Worker, WorkerGroup, register
from hybridflow.engines.models import load_hf_config
from hybridflow.engines.reshard.cross_pool import TensorMeta, WeightBridge
from hybridflow.engines.rollout import build_rollout_engine
from hybridflow.engines.rollout.partial import StreamingRollout
from hybridflow.protocol import DataProto
from hybridflow.workers.common import require
from hybridflow.workers.config import ActorRolloutRefConfig
from hybridflow.workers.generation import (
    call_sampling_params,
    counts_as_sampled_call,
    rollout_engine_config,
    tokenizer_if_present,
)


class RolloutWorker(Worker):
    """Generation only; weights from the training pool (see module docstring)."""

    def __init__(self, config: ActorRolloutRefConfig) -> None:
        if not isinstance(config, ActorRolloutRefConfig):
            raise TypeError(f"RolloutWorker needs an ActorRolloutRefConfig, got {type(config).__name__}")
        self.config = config
        self.stream: StreamingRollout | None = None
        self.bridge: WeightBridge | None = None
        self.dp_rank = 0
        self.tp_rank = 0
        self.version = -1  # no weights yet
        self._generate_calls = 0

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the engine (collective: creates the tensor-parallel groups); weights come
        with the first `receive_weights`."""
        self.init_process_group()
        r = self.config.rollout
        tp = r.tensor_model_parallel_size
        if self.world_size % tp:
            raise ValueError(f"rollout.tensor_model_parallel_size={tp} does not divide the rollout pool's "
                             f"{self.world_size} ranks")
        groups = [dist.new_group(list(range(s, s + tp))) for s in range(0, self.world_size, tp)] if tp > 1 else None
        self.dp_rank, self.tp_rank = divmod(self.rank, tp)
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        engine_cfg = rollout_engine_config(r, device)
        engine = build_rollout_engine(r.name, load_hf_config(self.config.model_path), engine_cfg,
                                      process_group=groups[self.dp_rank] if groups else None,
                                      tokenizer=tokenizer_if_present(self.config.model_path),
                                      model_path=self.config.model_path)
        self.stream = StreamingRollout(engine, slots=r.max_num_seqs, max_len=engine.max_len)

    @property
    def dp_size(self) -> int:
        return self.world_size // self.config.rollout.tensor_model_parallel_size

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_bridge(self, host: str, port: int, world_size: int, manifest: list[TensorMeta],
                           bucket_bytes: int) -> None:
        """Join the actor's weight bridge as receiver 1 + rank (collective with the actor's join)."""
        self.bridge = WeightBridge(host, port, 1 + self.rank, world_size, manifest, bucket_bytes)

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, version: int) -> dict[str, float]:
        """Take the weights the actor sends (paired with `send_weights`); in-flight sequences
        continue under them (their KV cache is recomputed). Metrics under weight_sync/*."""
        require(self.bridge, "the weight bridge (join_weight_bridge)")
        require(self.stream, "the rollout engine")
        stats = self.bridge.receive(lambda views: self.stream.load_weights(views, version=version))
        self.version = version
        return {**stats.as_metrics("weight_sync"), "weight_sync/in_flight": float(self.stream.in_flight)}

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)
    def generate_stream(self, prompts: DataProto | None, max_steps: int | None) -> list[DataProto]:
        """Add this rank's new prompts (None: none), run up to `max_steps` iterations, and
        return the finished prompt groups (one DataProto per group batch, with
        policy_version); [] on tensor-parallel ranks other than 0."""
        require(self.stream, "the rollout engine")
        if self.version < 0:
            raise RuntimeError("the rollout pool has no weights yet: receive_weights must run before generation")
        if prompts is not None and len(prompts):
            params = call_sampling_params(self.config.rollout, prompts.meta_info, self._generate_calls, self.dp_rank)
            if counts_as_sampled_call(params, prompts.meta_info):
                self._generate_calls += 1
            self.stream.add(prompts, params)
        self.stream.run(max_steps)
        finished = self.stream.pop_finished()
        return finished if self.tp_rank == 0 else []

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def in_flight(self) -> int:
        """Sequences queued or being generated on this rank."""
        require(self.stream, "the rollout engine")
        return self.stream.in_flight

    @register(dispatch=Dispatch.RANK_ZERO)
    def generation_weights(self) -> dict[str, torch.Tensor]:
        """Rank 0's generation weights by HF name, copied out in the engine's dtype (for
        checking a transfer; with tensor parallelism, rank 0's pieces)."""
        require(self.stream, "the rollout engine")
        return {name: view.detach().clone() for name, view in self.stream.engine.model.weights.views.items()}


def connect_weight_bridge(actor: WorkerGroup, rollout: WorkerGroup, bucket_bytes: int) -> None:
    """Create the WeightBridge between the actor's training rank 0 and every rollout rank."""
    host, port, manifest = actor.weight_bridge_endpoint()
    world = 1 + rollout.world_size
    joins = [actor.join_weight_bridge(host, port, world, manifest, bucket_bytes),
             rollout.join_weight_bridge(host, port, world, manifest, bucket_bytes)]
    for future in joins:
        future.get()


def start_weight_sync(actor: WorkerGroup, rollout: WorkerGroup, version: int) -> tuple[CallFuture, CallFuture]:
    """Send the actor's current weights to the rollout pool as `version`; returns the two
    calls' futures (the rollout pool takes them after the generation calls queued before)."""
    return actor.send_weights(), rollout.receive_weights(version)
