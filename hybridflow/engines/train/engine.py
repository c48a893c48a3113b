"""TrainEngine: one model loaded, sharded over a (dp, tp) or (pp, dp, tp) mesh, and optionally trained."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor, Shard

from hybridflow.engines.models import load_model
from hybridflow.engines.precision import resolve_dtype
from hybridflow.engines.train import batching
from hybridflow.engines.train.config import TrainEngineConfig
from hybridflow.engines.train.distributed import DP, PP, TP, build_device_mesh, current_device, device_type
from hybridflow.engines.train.flops import matmul_parameter_count, peak_flops
from hybridflow.engines.train.lora import apply_lora, hf_model_of, hf_name
from hybridflow.engines.train.packed_attention import for_packing
from hybridflow.engines.train.optim import (
    build_lr_scheduler,
    build_optimizer,
    clip_grad_norm,
    trainable_parameters,
)
from hybridflow.engines.train.pipeline import PipelineRunner, build_stage
from hybridflow.engines.train.parallelize import (
    apply_activation_checkpointing,
    apply_fsdp,
    apply_tensor_parallel,
    compile_layers,
)
from hybridflow.engines.train.vocab_head import can_fuse_head
from hybridflow.errors import ConfigError

Tensor = torch.Tensor


class TrainEngine:
    """A sharded model (see module docstring). `kind` is "causal_lm", "critic" or "reward"."""

    def __init__(
        self,
        config: TrainEngineConfig,
        *,
        kind: str,
        trainable: bool,
        fsdp_shard_dim: Callable[[str], int] | None = None,
    ) -> None:
        """fsdp_shard_dim: HF parameter name -> the dim FSDP shards it on (None: dim 0 for
        all); the resharder passes `reshard.aligned_shard_dim` to align with generation TP."""
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised; call "
                "hybridflow.engines.train.init_distributed() (or init_process_group) first"
            )
        self.config = config
        self.kind = kind
        self.trainable = trainable
        self.dp_size = config.check_parallel(dist.get_world_size(), device_type() == "cuda", trainable=trainable)
        self.device = current_device()
        self.device_mesh: DeviceMesh = build_device_mesh(config.tp_size, config.pp_size)
        self.dp_group = self.device_mesh[DP].get_group()
        self.dp_rank = self.device_mesh[DP].get_local_rank()
        # Pipeline stage of this rank (0 of 1 without pipelining) and its point-to-point group.
        self.pp_rank = self.device_mesh[PP].get_local_rank() if config.pp_size > 1 else 0
        self.pp_group = self.device_mesh[PP].get_group() if config.pp_size > 1 else None
        self.compute_dtype = resolve_dtype(config.dtype, self.device.type)
        self.fsdp_shard_dim = fsdp_shard_dim
        self.model = self._build_model()
        self.pipeline: PipelineRunner | None = None
        if config.pp_size > 1:
            self.pipeline = PipelineRunner(self.model, self.model, self.pp_group, self.device)
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if trainable:
            self.optimizer = build_optimizer(self.model, config.optim)
            self.lr_scheduler = build_lr_scheduler(self.optimizer, config.optim)
        self.global_step = 0
        # Drives mini-batch shuffling; seeded identically on all ranks and checkpointed.
        self.shuffle_generator = torch.Generator().manual_seed(config.seed)
        self._flops_params = matmul_parameter_count(hf_model_of(self.model))
        self._offloaded = False

    # ------------------------------------------------------------------ build

    def _build_model(self) -> nn.Module:
        cfg = self.config
        torch.manual_seed(cfg.seed)
        store_dtype = torch.float32 if self.trainable else self.compute_dtype
        attention = for_packing(cfg.attn_implementation) if cfg.pack_sequences else cfg.attn_implementation
        model = load_model(cfg.model_path, self.kind, dtype=store_dtype, attn_implementation=attention,
                           trust_remote_code=cfg.trust_remote_code)
        if cfg.pp_size > 1:
            if self.kind == "reward" or cfg.lora.enabled:
                raise ValueError(f"pipeline parallelism (pp_size={cfg.pp_size}) is supported for a causal LM (actor, "
                                 "reference) or a critic without LoRA, not for "
                                 f"{'LoRA' if cfg.lora.enabled else 'a reward model'}; use pp_size=1")
            model = build_stage(model, self.pp_rank, cfg.pp_size)
        if cfg.lora.enabled:
            if self.kind != "causal_lm":
                raise ValueError(f"LoRA is supported for the actor (causal LM) only, not for a {self.kind} model")
            model = apply_lora(model, cfg.lora)
        if cfg.gradient_checkpointing and self.trainable:
            apply_activation_checkpointing(hf_model_of(model))
        if cfg.fused_head and not can_fuse_head(hf_model_of(model)):
            raise ConfigError(f"needs a plain bias-free Linear output head; {type(hf_model_of(model)).__name__}'s is "
                              f"{type(hf_model_of(model).get_output_embeddings()).__name__}: set it to false",
                              "fused_head")
        if cfg.compile_kernels:
            compile_layers(hf_model_of(model))
        if cfg.tp_size > 1:
            apply_tensor_parallel(model, self.device_mesh[TP])
        mixed = self.trainable and self.compute_dtype != torch.float32
        mp_policy = (
            MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
            if mixed
            else MixedPrecisionPolicy()
        )
        if self._wraps_fsdp(mixed):
            apply_fsdp(model, self.device_mesh[DP], mp_policy=mp_policy,
                       shard_placement_fn=self._shard_placement_fn(model))
        else:
            # FSDP2 puts its shards on the mesh's device; the plain module must be moved
            # (found by benchmarks/gpu/gpu_check.py: a lone bf16 reference stayed on the host).
            model.to(self.device)
        return model

    def _wraps_fsdp(self, mixed: bool) -> bool:
        """FSDP2 only where it does something: sharding over dp > 1, tensor parallelism,
        casting to a lower compute dtype, or offloading. A lone full-precision replica runs
        as the plain module: FSDP2's hooks and DTensor parameters cost it 15-25% of a small
        model's update on CPU (benchmarks/rl/bench_vs_trl.py) and buy nothing. Everything
        downstream (optimizer, gradient norm, checkpoints, resharding, export) takes plain
        parameters as well as DTensors."""
        return self.dp_size > 1 or self.config.tp_size > 1 or mixed or self.config.param_offload

    def _shard_placement_fn(self, model: nn.Module) -> Callable[[nn.Parameter], Shard] | None:
        if self.fsdp_shard_dim is None:
            return None
        # FSDP2 hands over parameter objects: name them now, after tensor parallelism.
        names = {id(p): hf_name(n) for n, p in model.named_parameters()}
        return lambda p: Shard(self.fsdp_shard_dim(names[id(p)]))

    # ------------------------------------------------------------------ access

    def named_sharded_parameters(self) -> Iterator[tuple[str, DTensor]]:
        """(Hugging Face name, sharded DTensor) for every parameter.

        Each DTensor carries its device mesh and placements: Shard(0) over "dp" from
        FSDP2 (or the dim `fsdp_shard_dim` picks) and, for TP-split weights, the TP
        placement over "tp". With LoRA the base weights are reported under their HF
        names and adapter tensors under their peft names (`...lora_A.default.weight`);
        merging is up to the caller.
        """
        # FSDP2 keeps the root (and, with one dp rank, every layer) unsharded after a
        # forward without backward (e.g. compute_log_prob); those parameters would then be
        # full plain tensors. Resharding first keeps the promise above (a no-op if sharded).
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        for name, param in self.model.named_parameters():
            yield hf_name(name), param

    def trainable_parameters(self) -> list[nn.Parameter]:
        return trainable_parameters(self.model)

    # ------------------------------------------------------------------ micro-batching

    def micro_batches(self, batch: Mapping[str, Tensor], *, for_update: bool) -> list[list[int]]:
        """Index groups of `batch` for forward passes; the same number on every rank (collective)."""
        mb = self.config.micro_batch
        n = batching.batch_len(batch)
        if mb.use_dynamic_bsz:
            budget = mb.max_tokens_per_device if for_update else mb.forward_max_tokens_per_device
            costs = batching.sequence_costs(batch["attention_mask"], self.config.pack_sequences)
            return batching.micro_batch_indices_by_tokens(costs, budget, group=None)
        size = mb.micro_batch_size_per_device if for_update else mb.forward_micro_batch_size_per_device
        groups = batching.micro_batch_indices_by_count(n, size)
        batching.check_same_count(len(groups), "micro-batches", group=None)
        return groups

    def forward_in_micro_batches(
        self,
        batch: Mapping[str, Tensor],
        fn: Callable[[dict[str, Tensor]], dict[str, Tensor]],
    ) -> dict[str, Tensor]:
        """Run `fn` without gradients per micro-batch and put the outputs back in batch order.

        Tensor-parallel ranks of one dp group must receive identical batches.
        """
        batch = self.to_device(batch)
        groups = self.micro_batches(batch, for_update=False)
        n = batching.batch_len(batch)
        outputs: dict[str, list[Tensor]] = {}
        order: list[int] = []
        self.model.eval()
        with torch.no_grad():
            for idx in groups:
                out = fn(batching.select(batch, idx))
                for key, value in out.items():
                    outputs.setdefault(key, []).append(value)
                order.extend(idx)
        inverse = torch.empty(n, dtype=torch.long)
        inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(n)
        return {k: torch.cat(v)[inverse.to(v[0].device)].cpu() for k, v in outputs.items()}

    def pipeline_forward(self, batch: Mapping[str, Tensor], *, temperature: float,
                         with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """The last stage's output through the pipeline without gradients (log-probs and
        entropy of a causal LM, values of a critic), returned on every stage."""
        batch = self.to_device({k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")})
        batching.check_same_count(batching.batch_len(batch), "sequences in the batch", group=None)
        self.model.eval()
        out, entropy = self.pipeline.forward(
            batch, micro_size=self.config.micro_batch.forward_micro_batch_size_per_device, temperature=temperature,
            chunk_size=self.config.logits_chunk_size, with_entropy=with_entropy,
        )
        return out.cpu(), (entropy.cpu() if entropy is not None else None)

    def to_device(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    # ------------------------------------------------------------------ metrics

    def peak_flops(self) -> float:
        if self.config.peak_flops_per_device is not None:
            return self.config.peak_flops_per_device
        return peak_flops(self.compute_dtype)

    def flops_config(self) -> tuple[int, int, int]:
        """(matmul parameters, layers, hidden size) for `flops.training_flops`."""
        hf_config = hf_model_of(self.model).config
        layers = len(self.model.layer_range) if self.pipeline is not None else hf_config.num_hidden_layers
        return self._flops_params, layers, hf_config.hidden_size

    # ------------------------------------------------------------------ offload (GPU)

    def offload(self) -> None:
        """Move parameters (param_offload) and optimizer state (optimizer_offload) to CPU."""
        self._move_state(torch.device("cpu"))
        self._offloaded = True

    def onload(self) -> None:
        """Bring offloaded parameters and optimizer state back to this rank's GPU."""
        if self._offloaded:
            self._move_state(self.device)
            self._offloaded = False

    def _move_state(self, device: torch.device) -> None:
        if self.config.param_offload:
            # FSDP2 modules move their sharded DTensor parameters with Module.to.
            self.model.to(device)
        if self.config.optimizer_offload and self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":
                        state[key] = value.to(device, non_blocking=True)
        if device.type == "cpu" and torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ updates

    def require_trainable(self, op: str) -> None:
        if self.optimizer is None:
            raise RuntimeError(f"{op} needs a trainable engine; this one was built with trainable=False")

    def optimizer_step(self) -> tuple[float, bool]:
        """Clip, then step if the gradient norm is finite. Returns (norm, stepped)."""
        norm = clip_grad_norm(self.trainable_parameters(), self.config.optim.grad_clip, pp_group=self.pp_group)
        finite = bool(torch.isfinite(torch.tensor(norm)))
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, finite
