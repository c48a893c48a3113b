"""How a model is parallelised: tensor-parallel plans, FSDP2 sharding, activation checkpointing."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from hybridflow.engines.models import MOE_FAMILIES, model_family
from hybridflow.engines.train.pipeline import SkippedLayer

QK_NORM_FAMILIES = ("qwen3", "gemma3_text")


class HeadShardedNorm(ParallelStyle):
    """A norm over the last dim applied to [..., heads, head_dim] with heads sharded over tp."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def replicate_params(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for pname, param in list(mod.named_parameters(recurse=False)):
                dparam = nn.Parameter(distribute_tensor(param, mesh, [Replicate()]), param.requires_grad)
                mod.register_parameter(pname, dparam)

        def to_head_sharded(mod: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
            x = inputs[0]
            return (DTensor.from_local(x, mesh, [Shard(x.dim() - 2)], run_check=False), *inputs[1:])

        def to_local(mod: nn.Module, output: DTensor, mesh: DeviceMesh) -> torch.Tensor:
            return output.to_local()

        return distribute_module(module, device_mesh, replicate_params, to_head_sharded, to_local)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM, a TokenScoreModel or a pipeline stage (all keep them
    at model.layers) that this rank holds: a stage's placeholders for other stages' layers
    (`SkippedLayer`) are left out."""
    if hasattr(model, "get_base_model"):  # a peft wrapper
        model = model.get_base_model()
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"{type(model).__name__} has no model.layers; only HF decoder models of the "
            "supported families (and TokenScoreModel) can be parallelised"
        )
    return [layer for layer in layers if not isinstance(layer, SkippedLayer)]


def check_tp_divisibility(config, tp_size: int) -> None:
    """Raise a clear error when heads or MLP width cannot be split evenly over tp."""
    sizes = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
    }
    bad = {k: v for k, v in sizes.items() if v % tp_size != 0}
    if bad:
        raise ValueError(
            f"tensor parallel size {tp_size} does not divide {bad}; pick tp_size dividing "
            "the number of attention heads and key/value heads"
        )


def _is_lora_layer(module: nn.Module) -> bool:
    """A peft LoRA wrapper around a Linear (it keeps the original as `base_layer`)."""
    return hasattr(module, "base_layer") and hasattr(module, "lora_A")


def lora_aware_plan(layer: nn.Module, plan: dict[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """`plan` for one decoder layer, with each LoRA-wrapped entry split into base + adapters."""
    out: dict[str, ParallelStyle] = {}
    for path, style in plan.items():
        module = layer.get_submodule(path)
        if not _is_lora_layer(module):
            out[path] = style
            continue
        out[f"{path}.base_layer"] = style
        for adapter in module.lora_A:
            if isinstance(style, ColwiseParallel):
                # A: [r, in] replicated (plain); B: [out, r] split on out like W.
                out[f"{path}.lora_B.{adapter}"] = ColwiseParallel()
            elif isinstance(style, RowwiseParallel):
                # A: [r, in] split on in like W, output reduced; B: [out, r] replicated (plain).
                out[f"{path}.lora_A.{adapter}"] = RowwiseParallel()
            else:
                raise ValueError(f"LoRA on {path} ({type(style).__name__} under TP) is not supported")
    return out


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard `model` (a HF model, TokenScoreModel or peft wrapper) in place over `tp_mesh`
    with the plan in the module docstring."""
    family = model_family(model)
    if family in MOE_FAMILIES:
        raise ValueError(
            f"tensor parallelism for the mixture-of-experts family {family!r} is not supported (its experts are "
            "fused 3-D tensors without a TP plan); use tp_size=1: FSDP shards the experts over dp"
        )
    if hasattr(model, "get_base_model"):  # peft: the plan's paths are those of the HF model
        model = model.get_base_model()
    check_tp_divisibility(model.config, tp_mesh.size())
    layer_plan: dict[str, ParallelStyle] = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    if family in QK_NORM_FAMILIES:
        layer_plan["self_attn.q_norm"] = HeadShardedNorm()
        layer_plan["self_attn.k_norm"] = HeadShardedNorm()
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, lora_aware_plan(layer, layer_plan))

    # A pipeline stage holds the embedding only on its first stage and lm_head only on its last.
    embed = getattr(model.model, "embed_tokens", None)
    top_plan: dict[str, ParallelStyle] = {}
    if embed is not None:
        top_plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    lm_head = getattr(model, "lm_head", None)
    tied = lm_head is not None and embed is not None and lm_head.weight is embed.weight
    if lm_head is not None:
        top_plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    for path in top_plan:
        if _is_lora_layer(model.get_submodule(path)):
            raise ValueError(
                f"LoRA on {path} with tensor parallelism is not supported; leave "
                f"{path.rsplit('.', 1)[-1]} out of lora.target_modules or use tp_size=1"
            )
    if top_plan:
        parallelize_module(model, tp_mesh, top_plan)
    if tied:
        # Each plan made its own DTensor of the shared weight, with equal Shard(0) blocks.
        model.lm_head.weight = model.model.embed_tokens.weight


def apply_fsdp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    *,
    mp_policy: MixedPrecisionPolicy,
    shard_placement_fn: Callable[[nn.Parameter], Shard | None] | None = None,
) -> None:
    """FSDP2 along dp: one unit per decoder layer, the rest (embeddings, norm, head) at the root.

    Per-layer units let the all-gather of layer i+1 overlap the compute of layer i and
    bound the unsharded memory to about one layer. The root keeps its parameters
    unsharded after forward (they are needed again first in backward). With a single
    dp rank there is no memory to win by resharding layers after forward, only a
    second all-gather (a full copy and cast of every weight) in backward, so layers
    stay unsharded too. `shard_placement_fn` (FSDP2's) picks each parameter's shard dim
    (default dim 0); the resharder uses it to align FSDP shards with generation TP shards.
    """
    reshard_layers = dp_mesh.size() > 1
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=reshard_layers,
                    shard_placement_fn=shard_placement_fn)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=False,
                shard_placement_fn=shard_placement_fn)


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute decoder-layer activations in backward (non-reentrant, works with FSDP2)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def compile_layers(model: nn.Module) -> None:
    """torch.compile each decoder layer in place: inductor fuses its RMSNorms, rotary and
    SwiGLU elementwise work into a few kernels (the launch-bound part of a small model's
    step). Before tensor parallelism and FSDP2, which hook the compiled modules as usual."""
    for layer in decoder_layers(model):
        layer.compile()
