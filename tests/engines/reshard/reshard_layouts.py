"""Synthetic training layouts (no processes) mirroring what FSDP2 and FSDP2 x TP produce.

With N = dp * tp ranks, rank r = dp_rank * tp + tp_rank (tp innermost, as in the training
engine's mesh). A TP-split parameter nests FSDP's chunks inside TP's, so rank r holds
chunk tp_rank * dp + dp_rank of N; a parameter TP leaves whole (norms) is sharded over
dp only. Those facts were read off real DTensors (see test_reshard_dist.py, which checks
the layout the real engine reports against this one).
"""

from __future__ import annotations

import torch

from hybridflow.engines.reshard import ParamLayout, TrainingLayout, aligned_shard_dim, generation_shard_dim


def llama_shapes(hidden: int = 64, inter: int = 128, heads: int = 8, kv_heads: int = 4, vocab: int = 256,
                 layers: int = 2) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of an untied Llama in named_parameters order."""
    d = hidden // heads
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (heads * d, hidden)),
            (p + "self_attn.k_proj.weight", (kv_heads * d, hidden)),
            (p + "self_attn.v_proj.weight", (kv_heads * d, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, heads * d)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def fsdp_layout(shapes: list[tuple[str, tuple[int, ...]]], dp: int, tp: int = 1, *, aligned: bool = True,
                dtype: torch.dtype = torch.float32) -> TrainingLayout:
    """The layout FSDP2 over dp (x TP over tp) gives; aligned: FSDP shards on the TP dim."""
    world = dp * tp
    params = []
    for name, shape in shapes:
        split = generation_shard_dim(name) is not None
        if split:
            dim = aligned_shard_dim(name) if aligned else 0
            chunks = tuple((r % tp) * dp + r // tp for r in range(world))
            params.append(ParamLayout(name, shape, dim, world, chunks, dtype))
        else:
            params.append(ParamLayout(name, shape, 0, dp, tuple(r // tp for r in range(world)), dtype))
    return TrainingLayout(tuple(params), world)


def local_chunk(full: torch.Tensor, p: ParamLayout, rank: int) -> torch.Tensor:
    """Rank `rank`'s training shard of `full` under layout `p`."""
    if p.dim is None:
        return full
    size = p.shape[p.dim] // p.num_chunks
    return full.narrow(p.dim, p.chunks[rank] * size, size)


def stage_of_name(name: str, num_layers: int, pp: int) -> int:
    """The pipeline stage holding a parameter (engines/train/pipeline.py's cut): the
    embedding on the first, final norm and lm_head on the last, layers in contiguous runs."""
    from hybridflow.engines.train.pipeline import stage_layer_ranges

    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        return next(s for s, run in enumerate(stage_layer_ranges(num_layers, pp)) if layer in run)
    return 0 if name.startswith("model.embed_tokens") else pp - 1


def pipeline_layout(shapes: list[tuple[str, tuple[int, ...]]], pp: int, dp: int, tp: int = 1,
                    num_layers: int = 2) -> TrainingLayout:
    """pp stages, each sharded as `fsdp_layout` over its dp x tp ranks (pp outermost)."""
    params = []
    for s in range(pp):
        mine = [(n, shape) for n, shape in shapes if stage_of_name(n, num_layers, pp) == s]
        params += [ParamLayout(p.name, p.shape, p.dim, p.num_chunks, p.chunks, p.train_dtype, stage=s)
                   for p in fsdp_layout(mine, dp, tp).params]
    return TrainingLayout(tuple(params), pp * dp * tp, pp)
