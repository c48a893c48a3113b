"""The paper's Table 2 adapted to FSDP training: closed-form per-rank costs of a transition.

Symbols (derivation in docs/reshard.md): N training ranks (dp x tp, FSDP over dp, TP over
tp), t_g generation TP size, B = N / t_g the micro-DP group size, K_r = N / tp the number
of distinct training shards of a replicated parameter (norms: FSDP shards them over dp
only). P_s / P_r: parameters (elements) the generation engine splits / replicates; e_g,
e_t: bytes per element in the generation (transfer) and training dtypes;
M_s = e_g P_s, M_r = e_g P_r, M = M_s + M_r.

    comm   hybrid          (N - t_g) / (N t_g) * M_s + (K_r - 1) / K_r * M_r
           plain, gather   (N - 1) / N * M_s         + (K_r - 1) / K_r * M_r
    train shard  T = e_t (P_s / N + P_r / K_r)
    generation   G = M_s / t_g + M_r
    buffers hybrid: one parameter's generation shard, the largest one that needs a
                    gather (split ones only when B > 1, replicated ones when K_r > 1)
            plain, gather_all: the whole gathered model, M (terms whose group is 1 drop)
    peak = T + G + buffers
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import torch

from hybridflow.engines.reshard.grouping import ReshardMethod
from hybridflow.engines.reshard.placement import generation_shard_dim


@dataclass(frozen=True)
class ModelSizes:
    """Element counts of a model, split by how the generation engine lays parameters out."""

    split_numel: int
    replicated_numel: int
    largest_split_numel: int
    largest_replicated_numel: int

    @classmethod
    def from_shapes(cls, shapes: Iterable[tuple[str, tuple[int, ...]]]) -> "ModelSizes":
        """From (HF name, full shape) pairs (tied weights listed once)."""
        split, repl = [], []
        for name, shape in shapes:
            n = 1
            for s in shape:
                n *= s
            (repl if generation_shard_dim(name) is None else split).append(n)
        return cls(sum(split), sum(repl), max(split, default=0), max(repl, default=0))

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> "ModelSizes":
        return cls.from_shapes((n, tuple(p.shape)) for n, p in model.named_parameters())


@dataclass(frozen=True)
class Costs:
    """Per-rank bytes of one transition."""

    comm_bytes: int
    train_shard_bytes: int
    generation_bytes: int
    buffer_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.train_shard_bytes + self.generation_bytes + self.buffer_bytes


def predicted_costs(sizes: ModelSizes, method: ReshardMethod | str, *, world_size: int, train_tp: int,
                    gen_tp: int, gen_bytes: int, train_bytes: int) -> Costs:
    """Closed-form costs of the module docstring (exact when every size divides evenly)."""
    method = ReshardMethod.parse(method)
    n, t_g = world_size, gen_tp
    if n % train_tp or n % t_g:
        raise ValueError(f"train_tp={train_tp} and gen_tp={t_g} must divide world_size={n}")
    k_r, block = n // train_tp, n // t_g
    m_s, m_r = gen_bytes * sizes.split_numel, gen_bytes * sizes.replicated_numel
    repl_comm = Fraction(k_r - 1, k_r) * m_r
    if method is ReshardMethod.HYBRID:
        comm = Fraction(n - t_g, n * t_g) * m_s + repl_comm
        buffers = max(
            gen_bytes * sizes.largest_split_numel // t_g if block > 1 else 0,
            gen_bytes * sizes.largest_replicated_numel if k_r > 1 else 0,
        )
    else:
        comm = Fraction(n - 1, n) * m_s + repl_comm
        buffers = (m_s if n > 1 else 0) + (m_r if k_r > 1 else 0)
    train = Fraction(train_bytes * sizes.split_numel, n) + Fraction(train_bytes * sizes.replicated_numel, k_r)
    generation = Fraction(m_s, t_g) + m_r
    return Costs(_exact(comm, "comm"), _exact(train, "train shard"), _exact(generation, "generation"), buffers)


def _exact(value: Fraction, what: str) -> int:
    if value.denominator != 1:
        raise ValueError(f"{what} bytes {value} are not whole: model sizes do not divide evenly over the ranks")
    return int(value)
