"""optim.grad_norm / clip_grad_norm on DTensor gradients (gloo, world 4) against the norm
of the whole gradients, and the number of all-reduces it issues.

Meshes and placements as FSDP2 and FSDP2 x TP leave gradients: a 1-D dp mesh sharded on
dim 0 (uneven sizes on purpose: 7 rows over 4 ranks leaves one rank 1 row), a 2-D
(dp, tp) mesh with a tensor-parallel gradient sharded on both dimensions, and one the tp
dimension replicates (its copies must not be counted twice), and FSDP2-over-TP's strided
shard (a placement whose is_shard() is False). Tolerance 1e-5 relative (fp32
summation order).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybridflow.engines.local_ranks import run_ranks

SHAPES = [(7, 3), (16, 5), (5,), (8, 8), (8, 4)]


def _full_grads() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _case(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard
    from torch import nn

    from hybridflow.engines.train.optim import clip_grad_norm, grad_norm

    dp_mesh = init_device_mesh("cpu", (world,))
    mesh_2d = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    layouts = [(dp_mesh, [Shard(0)]), (dp_mesh, [Shard(0)]), (mesh_2d, [Shard(0), Replicate()]),
               (mesh_2d, [Shard(0), Shard(1)]), (mesh_2d, [_StridedShard(0, split_factor=2), Shard(0)])]
    full = _full_grads()
    params = []
    for tensor, (mesh, placements) in zip(full, layouts):
        p = nn.Parameter(distribute_tensor(torch.zeros_like(tensor), mesh, placements))
        p.grad = distribute_tensor(tensor.clone(), mesh, placements)
        params.append(p)
    plain = nn.Parameter(torch.zeros(3))
    plain.grad = torch.tensor([1.0, 2.0, 2.0])  # a parameter that is not a DTensor
    params.append(plain)

    calls = []
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        norm = float(grad_norm(params))
    finally:
        dist.all_reduce = original
    expected = float(torch.sqrt(sum(t.square().sum() for t in full) + 9.0))
    clipped_to = 0.5 * expected
    clip_grad_norm(params, clipped_to)
    after = float(grad_norm(params))
    scaled = all(torch.allclose(p.grad.full_tensor(), t * clipped_to / expected, rtol=1e-5, atol=1e-7)
                 for p, t in zip(params, full))
    return {"norm": norm, "expected": expected, "all_reduces": len(calls), "after": after,
            "clipped_to": clipped_to, "scaled": scaled}


def test_grad_norm_of_sharded_gradients_matches_whole_and_reduces_once_per_group():
    for res in run_ranks(_case, 4):
        assert abs(res["norm"] - res["expected"]) < 1e-5 * res["expected"], res
        # dp group: 1; (dp, tp) replicated on tp: 1; sharded on both: 2 (one per sharded
        # dimension), also with FSDP2-over-TP's strided shard on dp: 2. The norm of each
        # DTensor on its own would take one per tensor and more.
        assert res["all_reduces"] == 6, res
        assert res["scaled"], res
        assert abs(res["after"] - res["clipped_to"]) < 1e-4 * res["clipped_to"], res
