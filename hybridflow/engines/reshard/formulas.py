"""The paper's Table 2 adapted to FSDP training: closed-form per-rank costs of a transition."""

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
                    gen_tp: int, gen_bytes: int, train_bytes: int, pp_size: int = 1,
                    stage: ModelSizes | None = None) -> Costs:
    """Closed-form costs of the module docstring for a rank of pipeline stage `stage`
    (its parameters' sizes; required when pp_size > 1), exact when every size divides evenly."""
    method = ReshardMethod.parse(method)
    n, t_g, p = world_size, gen_tp, pp_size
    if n % (train_tp * p) or (n // p) % t_g:
        raise ValueError(f"train_tp={train_tp} x pp_size={p} must divide world_size={n}, and gen_tp={t_g} "
                         "the ranks of a stage")
    if p > 1 and stage is None:
        raise ValueError("pp_size > 1 needs the sizes of the rank's own pipeline stage (stage=)")
    stage = sizes if stage is None else stage
    n_s = n // p
    k_r, block = n_s // train_tp, n_s // t_g
    m_s, m_r = gen_bytes * sizes.split_numel, gen_bytes * sizes.replicated_numel
    held = Fraction(stage.split_numel, n_s) + Fraction(stage.replicated_numel, k_r)  # elements of the shard
    generation = Fraction(m_s, t_g) + m_r
    comm = (generation if method is ReshardMethod.HYBRID else m_s + m_r) - gen_bytes * held
    if method is ReshardMethod.HYBRID:
        buffers = max(
            gen_bytes * sizes.largest_split_numel // t_g if block > 1 or p > 1 else 0,
            gen_bytes * sizes.largest_replicated_numel if k_r > 1 or p > 1 else 0,
        )
    elif p > 1:
        buffers = m_s + m_r
    else:
        buffers = (m_s if n > 1 else 0) + (m_r if k_r > 1 else 0)
    train = train_bytes * held
    return Costs(_exact(comm, "comm"), _exact(train, "train shard"), _exact(generation, "generation"), buffers)


def _exact(value: Fraction, what: str) -> int:
    if value.denominator != 1:
        raise ValueError(f"{what} bytes {value} are not whole: model sizes do not divide evenly over the ranks")
    return int(value)
