"""`ActorRolloutRefWorker`: the hybrid-engine role (actor training, generation, reference)."""

from __future__ import annotations

import gc
from pathlib import Path

from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engines.models import load_hf_config
from hybridflow.engines.reshard import HybridEngine, TransitionStats, aligned_shard_dim
from hybridflow.engines.reshard.cross_pool import TensorMeta, WeightBridge, free_port, full_tensors, manifest_of
from hybridflow.engines.rollout import SamplingParams
from hybridflow.engines.rollout.batch_io import left_pad_prompts
from hybridflow.envs.agent.loop import AgentLoop
from hybridflow.engines.train import ActorEngine
from hybridflow.engines.train.actor import FORWARD_KEYS, OLD_LOG_PROBS, update_keys
from hybridflow.engines.train.checkpoint import load_checkpoint, load_extra, save_checkpoint, write_checkpoint
from hybridflow.engines.train.export import export_hf
from hybridflow.engines.train.flops import FlopFacts, engine_flop_facts
from hybridflow.protocol import DataProto
from hybridflow.workers.common import (
    batch_tensors,
    engine_on_device,
    max_over_world,
    mean_over_world,
    register_engine_mesh,
    require,
    timed,
    uses_offload,
)
from hybridflow.workers.config import ActorRolloutRefConfig
from hybridflow.workers.generation import (
    call_sampling_params,
    counts_as_sampled_call,
    rollout_engine_config,
    tokenizer_if_present,
)
from hybridflow.workers.generation_weights import generation_named_parameters

ACTOR_MESH = "actor"
ROLLOUT_MESH = "rollout"
# Transition numbers reported per generation call (max over ranks: the worst rank).
_RESHARD_FIELDS = ("comm_bytes", "comm_calls", "train_shard_bytes", "generation_bytes", "buffer_bytes", "peak_bytes")


class ActorRolloutRefWorker(Worker):
    """Actor + rollout + reference policy on every rank (see module docstring)."""

    def __init__(self, config: ActorRolloutRefConfig) -> None:
        if not isinstance(config, ActorRolloutRefConfig):
            raise TypeError(f"ActorRolloutRefWorker needs an ActorRolloutRefConfig, got {type(config).__name__}")
        self.config = config
        self.actor: ActorEngine | None = None
        self.ref: ActorEngine | None = None  # a separate frozen policy; None with LoRA or without KL
        self.hybrid: HybridEngine | None = None
        self.rollout_dp_rank = 0
        self._generate_calls = 0
        self.bridge: WeightBridge | None = None  # to a separate rollout pool (trainer.mode != sync), rank 0 only

    # ------------------------------------------------------------------ build

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build actor, reference and hybrid engine (collective), then declare both meshes."""
        self.init_process_group()
        cfg = self.config
        trust = cfg.engine.trust_remote_code
        self.actor = ActorEngine(cfg.engine, cfg.loss, fsdp_shard_dim=aligned_shard_dim)
        if cfg.use_reference and not cfg.engine.lora.enabled:
            self.ref = ActorEngine(cfg.engine, cfg.loss, trainable=False)
        self.hybrid = HybridEngine.build(
            generation_named_parameters(self.actor), load_hf_config(cfg.model_path, trust_remote_code=trust),
            rollout_engine_config(cfg.rollout, self.actor.device, trust),
            gen_tp=cfg.rollout.tensor_model_parallel_size, method=cfg.rollout.reshard_method,
            backend=cfg.rollout.name, tokenizer=tokenizer_if_present(cfg.model_path, trust), model_path=cfg.model_path,
        )
        for engine in (self.actor, self.ref):
            if engine is not None and uses_offload(engine):
                engine.offload()  # generation and the other roles get the device until first use
        register_engine_mesh(self, ACTOR_MESH, self.actor)
        groups = self.hybrid.grouping.tp_groups
        self.rollout_dp_rank = groups.index(self.hybrid.grouping.tp_group_of(self.rank))
        self.register_dispatch_mesh(ROLLOUT_MESH, dp_rank=self.rollout_dp_rank, dp_size=len(groups),
                                    is_collect=self.hybrid.rollout.tp_rank == 0)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def rebuild(self, config: ActorRolloutRefConfig) -> None:
        """Build the role again from `config` in the same processes (the RL actor after
        the SFT warm start): no new Ray actors, imports or rendezvous. The dispatch meshes
        must come out the same, since the controller has them cached (same ranks and
        rollout.tensor_model_parallel_size)."""
        if not isinstance(config, ActorRolloutRefConfig):
            raise TypeError(f"rebuild needs an ActorRolloutRefConfig, got {type(config).__name__}")
        meshes = {name: self.dispatch_mesh(name) for name in (ACTOR_MESH, ROLLOUT_MESH)}
        self.config = config
        self.actor = self.ref = self.hybrid = None  # freed before the new engines are built
        self._generate_calls = 0  # sampling seeds as in a new group
        gc.collect()
        self.init_model()
        now = {name: self.dispatch_mesh(name) for name in meshes}
        if now != meshes:
            raise RuntimeError(f"rebuild changed the dispatch meshes {meshes} -> {now}; build a new group instead")

    # ------------------------------------------------------------------ generation

    # pad=False: with n samples per prompt, padding prompts would come back as n rows each,
    # and the collector removes only one per padded prompt.
    @register(dispatch=Dispatch.MESH(ROLLOUT_MESH, pad=False))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Reshard to the generation layout, sample responses, reshard back.

        Sampling settings come from ``prompts.meta_info`` over the rollout config defaults.
        Non-tensors (uid, data_source, ground_truth, raw_prompt, ...) are repeated per
        sample. ``meta_info["metrics"]`` gets timings (``timing_s/*``, slowest rank) and
        resharding costs (``reshard/*``, worst rank).
        """
        require(self.hybrid, "the hybrid engine")
        params = self._sampling_params(prompts.meta_info)
        timings: dict[str, float] = {}
        with engine_on_device(self.actor), timed(timings, "timing_s/reshard_to_generation"):
            stats = self.hybrid.to_generation()
        try:
            with timed(timings, "timing_s/generate"):
                out = self._generate(prompts, params)
        finally:
            with timed(timings, "timing_s/reshard_to_training"):
                self.hybrid.to_training()
        if counts_as_sampled_call(params, prompts.meta_info):
            self._generate_calls += 1
        loop = {k: v for k, v in out.meta_info.get("metrics", {}).items() if k.startswith("agent_loop/")}
        out.meta_info["metrics"] = max_over_world({**timings, **_reshard_metrics(stats), **loop})
        return out

    def _generate(self, prompts: DataProto, params: SamplingParams) -> DataProto:
        """One-turn generation, or the multi-turn agent loop (rollout.agent.enable; envs/agent/loop.py)."""
        engine, r = self.hybrid.rollout, self.config.rollout
        if not r.agent.enable:
            return engine.generate(prompts, params)
        if engine.tokenizer is None:
            raise RuntimeError(f"multi-turn rollouts need a tokenizer with a chat template in {self.config.model_path}")
        response_length = int(prompts.meta_info.get("response_length", params.max_new_tokens))
        out = AgentLoop(engine, engine.tokenizer, r.agent, response_length, engine.pad_id).run(prompts, params)
        # Each rank renders its own prompts (chat template, tool listing): one width for all (collective).
        width = int(max_over_world({"prompt_width": float(out.batch["prompts"].shape[1])})["prompt_width"])
        return left_pad_prompts(out, width)

    def _sampling_params(self, meta: dict) -> SamplingParams:
        return call_sampling_params(self.config.rollout, meta, self._generate_calls, self.rollout_dp_rank)

    # ------------------------------------------------------------------ log-probs

    @register(dispatch=Dispatch.MESH(ACTOR_MESH))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` [B, R] of the responses under the current actor."""
        require(self.actor, "the actor")
        batch = batch_tensors(data, FORWARD_KEYS, "compute_log_prob")
        with engine_on_device(self.actor):
            log_probs, entropy = self.actor.compute_log_prob(
                batch, temperature=self._temperature(data.meta_info), with_entropy=True)
        return DataProto.from_dict(tensors={"old_log_probs": log_probs, "entropys": entropy})

    @register(dispatch=Dispatch.MESH(ACTOR_MESH))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_probs`` [B, R] under the reference policy."""
        require(self.actor, "the actor")
        if not self.config.use_reference:
            raise RuntimeError("this worker has no reference policy; build it with use_reference=True")
        batch = batch_tensors(data, FORWARD_KEYS, "compute_ref_log_prob")
        temperature = self._temperature(data.meta_info)
        if self.ref is None:  # LoRA: the base model is the reference
            with engine_on_device(self.actor):
                log_probs = self.actor.compute_ref_log_prob(batch, temperature=temperature)
        else:
            with engine_on_device(self.ref):
                log_probs, _ = self.ref.compute_log_prob(batch, temperature=temperature)
        return DataProto.from_dict(tensors={"ref_log_probs": log_probs})

    def _temperature(self, meta: dict) -> float:
        # Log-probs must use the temperature the responses were sampled with; a batch
        # that does not say which is taken to use the rollout default.
        return float(meta["temperature"]) if "temperature" in meta else self.config.rollout.temperature

    # ------------------------------------------------------------------ training

    # pad=False: padding would train on duplicated samples.
    @register(dispatch=Dispatch.MESH(ACTOR_MESH, pad=False))
    def update_actor(self, data: DataProto) -> DataProto:
        """One policy update; returns only ``meta_info["metrics"]`` (averaged over ranks)."""
        require(self.actor, "the actor")
        fused = self.config.fuse_old_log_probs  # the update computes them itself (ActorEngine.update_policy)
        keys = update_keys(self.config.loss) + (() if fused else (OLD_LOG_PROBS,))
        batch = batch_tensors(data, keys, "update_actor")
        timings: dict[str, float] = {}
        with engine_on_device(self.actor), timed(timings, "timing_s/update_actor"):
            metrics = self.actor.update_policy(batch, temperature=self._temperature(data.meta_info),
                                               fused_old_log_probs=fused)
        return DataProto(meta_info={"metrics": mean_over_world({**metrics, **timings})})

    # ------------------------------------------------------------------ weights to a rollout pool

    @register(dispatch=Dispatch.RANK_ZERO)
    def weight_bridge_endpoint(self) -> tuple[str, int, list[TensorMeta]]:
        """(host, free port, manifest of the generation weights) for a WeightBridge that
        training rank 0 hosts (engines/reshard/cross_pool.py)."""
        require(self.actor, "the actor")
        return self.master_addr, free_port(self.master_addr), manifest_of(generation_named_parameters(self.actor)())

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_bridge(self, host: str, port: int, world_size: int, manifest: list[TensorMeta],
                           bucket_bytes: int) -> None:
        """Rank 0 joins the bridge as its sender (collective with the rollout pool's join)."""
        if self.rank == 0:
            self.bridge = WeightBridge(host, port, 0, world_size, manifest, bucket_bytes)

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self, version: int) -> dict[str, float]:
        """Broadcast the current weights to the rollout pool as policy `version` (every rank
        gathers its shards, rank 0 sends; the rollout ranks receive in the background, so
        this does not wait for their generation); rank 0's bytes / buckets / seconds under
        weight_sync/*."""
        require(self.actor, "the actor")
        with engine_on_device(self.actor):
            tensors = full_tensors(generation_named_parameters(self.actor)(), keep=self.rank == 0)
            if self.rank != 0:
                for _ in tensors:  # the gathers are collective over the training pool
                    pass
                return {}
            require(self.bridge, "the weight bridge (join_weight_bridge)")
            return self.bridge.send(tensors, version).as_metrics("weight_sync")

    # ------------------------------------------------------------------ persistence

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, root: str, keep_last: int | None = None) -> str:
        """Save the actor (model, optimizer, schedule, RNG, generation seed counter) under
        ``root/global_step_<n>`` (atomic)."""
        require(self.actor, "the actor")
        with engine_on_device(self.actor):
            return str(save_checkpoint(self.actor, root, keep_last=keep_last, extra=self._worker_state()))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def write_checkpoint(self, path: str) -> str:
        """What `save_checkpoint` saves, written into exactly ``path`` (not atomic: for the
        trainer, which renames its whole step checkpoint into place when complete)."""
        require(self.actor, "the actor")
        with engine_on_device(self.actor):
            return str(write_checkpoint(self.actor, path, extra=self._worker_state()))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> str:
        """Restore the actor and the generation seed counter from a checkpoint dir (or the
        latest under a root); the next generation call reshards the restored weights."""
        require(self.actor, "the actor")
        with engine_on_device(self.actor):
            loaded = load_checkpoint(self.actor, path)
        state = load_extra(loaded)
        if state is not None:  # checkpoints from before the counter was saved have none
            self._generate_calls = int(state["generate_calls"])
        return str(loaded)

    def _worker_state(self) -> dict:
        # Sampling seeds derive from this counter (_sampling_params): a resumed run must
        # continue the same sequence to sample what the uninterrupted run would have.
        return {"generate_calls": self._generate_calls}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def export_hf(self, out_dir: str) -> str:
        """Write the actor as a Hugging Face model directory (LoRA merged)."""
        require(self.actor, "the actor")
        with engine_on_device(self.actor):
            return str(export_hf(self.actor, out_dir))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def flop_facts(self) -> FlopFacts:
        """This rank's actor size and its device's peak FLOP/s, measured in this process
        (once) unless configured: the trainer adds them up for perf/mfu."""
        require(self.actor, "the actor")
        return engine_flop_facts(self.actor)


def _reshard_metrics(stats: TransitionStats) -> dict[str, float]:
    return {f"reshard/{name}": float(getattr(stats, name)) for name in _RESHARD_FIELDS}
