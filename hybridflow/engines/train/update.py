"""The update loop of every trained engine (actor, critic, reward model): epochs x mini-batches
x micro-batches, driven from the engine's own update method (`Update`).

For each mini-batch (one optimizer step), the global token and sequence counts over
all micro-batches and dp ranks are gathered first (`AggregationScale`), so every
micro-batch loss is normalised by the whole mini-batch and multiplied by dp to cancel
FSDP's gradient averaging: the accumulated gradient equals the full mini-batch's,
whatever the micro-batch split. Loss metrics are summed over micro-batches and
averaged over ranks, which reproduces the full mini-batch loss exactly; ratio-type
metrics (clip fractions, KL) are averaged over micro-batches and ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hybridflow.algorithms import AggregationScale, compute_aggregation_scale, torch_all_reduce_sum
from hybridflow.engines.train import batching
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.flops import training_flops

Tensor = torch.Tensor
# One micro-batch's (loss to backpropagate, summed metrics, averaged metrics).
MicroLoss = Callable[[dict[str, Tensor]], tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]]


@dataclass
class _MetricLog:
    """Per-mini-batch metric values, reduced at the end of an update."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(float(value))

    def reduce(self, group: dist.ProcessGroup | None) -> dict[str, float]:
        # Same key order on every rank: the keys are fixed by the loss configuration.
        names = sorted(self.values)
        local = torch.tensor([sum(self.values[n]) / len(self.values[n]) for n in names], dtype=torch.float64)
        dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
        local /= dist.get_world_size(group)
        return dict(zip(names, local.tolist()))


class Update:
    """One update call of `engine` on this rank's `batch`, read top down by its caller:

        update = Update(engine, batch, prefix="actor", loss_scale_factor=None)
        for micro, agg in update.mini_batches():      # epochs x mini-batches
            update.record(*accumulate(micro, lambda mb: loss_of(mb, agg)))   # forward + backward
        return update.finish()                        # metrics averaged over the group

    After the caller's body records a mini-batch's (summed, averaged) loss metrics, the
    optimizer steps (gradient clipping, grad_norm) before the next mini-batch comes."""

    def __init__(self, engine: TrainEngine, batch: Mapping[str, Tensor], *, prefix: str,
                 loss_scale_factor: float | None) -> None:
        engine.require_trainable(f"update ({prefix})")
        self.engine, self.prefix, self.loss_scale_factor = engine, prefix, loss_scale_factor
        self.batch = engine.to_device(batch)
        self.n = batching.batch_len(self.batch)
        # Mini-batch counts must match on all ranks, or the optimizer steps would not line up.
        batching.check_same_count(self.n, "sequences in the update batch", group=None)
        self.log = _MetricLog()
        self.seq_lens: list[int] = []
        self.lr = engine.optimizer.param_groups[0]["lr"]
        self._recorded: tuple[dict[str, float], dict[str, float]] | None = None
        engine.model.train()
        self.start = time.perf_counter()

    def mini_batches(self) -> Iterator[tuple[list[dict[str, Tensor]], AggregationScale]]:
        """Each mini-batch's micro-batches and its `AggregationScale` (module docstring);
        the optimizer step of each follows its `record`."""
        engine, mb_cfg = self.engine, self.engine.config.micro_batch
        per_rank = mb_cfg.mini_batch_size // engine.dp_size
        for _ in range(mb_cfg.epochs):
            order = (torch.randperm(self.n, generator=engine.shuffle_generator) if mb_cfg.shuffle
                     else torch.arange(self.n))
            for mini in batching.split_mini_batches(batching.select(self.batch, order), per_rank):
                micro = [batching.select(mini, idx) for idx in engine.micro_batches(mini, for_update=True)]
                agg = compute_aggregation_scale(
                    [m["response_mask"] for m in micro],
                    dp_size=engine.dp_size,
                    all_reduce_sum=torch_all_reduce_sum(engine.dp_group),
                    loss_scale_factor=self.loss_scale_factor,
                )
                self._recorded = None
                yield micro, agg
                if self._recorded is None:
                    raise RuntimeError("Update.record(summed, averaged) was not called for the mini-batch")
                for m in micro:
                    self.seq_lens.extend(m["attention_mask"].sum(dim=-1).tolist())
                norm, stepped = engine.optimizer_step()
                for k, v in {**self._recorded[0], **self._recorded[1]}.items():
                    self.log.add(f"{self.prefix}/{k}", v)
                self.log.add(f"{self.prefix}/grad_norm", norm)
                self.log.add(f"{self.prefix}/skipped_steps", 0.0 if stepped else 1.0)

    def record(self, summed: dict[str, float], averaged: dict[str, float]) -> None:
        """The mini-batch's loss metrics (summed over micro-batches) and ratio metrics (averaged)."""
        self._recorded = (summed, averaged)

    def finish(self) -> dict[str, float]:
        """Step the lr schedule; the metrics averaged over the group, with throughput."""
        engine = self.engine
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - self.start
        engine.lr_scheduler.step()
        engine.global_step += 1
        metrics = self.log.reduce(group=None)
        metrics[f"{self.prefix}/lr"] = self.lr
        metrics.update(_throughput(engine, self.seq_lens, elapsed))
        return metrics


def accumulate(micro: list[dict[str, Tensor]], micro_loss: MicroLoss) -> tuple[dict[str, float], dict[str, float]]:
    """Forward and backward of each micro-batch in turn (gradients accumulate); returns the
    loss metrics summed over micro-batches and the ratio metrics averaged over them."""
    per_micro = []
    for m in micro:
        loss, sums, means = micro_loss(m)
        loss.backward()
        per_micro.append((sums, means))
    return batching.merge_micro_metrics(per_micro)


def _throughput(engine: TrainEngine, seq_lens: list[int], elapsed: float) -> dict[str, float]:
    """Tokens/s of the whole group and MFU per device (valid tokens only; see flops.py)."""
    n_params, layers, hidden = engine.flops_config()
    local = torch.tensor(
        [float(sum(seq_lens)), training_flops(n_params, layers, hidden, seq_lens), elapsed], dtype=torch.float64
    )
    # Tensor-parallel ranks process the same sequences: count them once per dp group. The
    # stages of a pipeline too: the tokens once (stage 0), the flops of each stage's layers.
    if engine.config.tp_size > 1 and engine.device_mesh["tp"].get_local_rank() != 0:
        local[:2] = 0.0
    if engine.pp_rank != 0:
        local[0] = 0.0
    dist.all_reduce(local, op=dist.ReduceOp.SUM)
    world = dist.get_world_size()
    tokens, flops, elapsed_sum = local.tolist()
    wall = max(elapsed_sum / world, 1e-9)
    return {
        "perf/tokens_per_s": tokens / wall,
        "perf/mfu": flops / world / wall / engine.peak_flops(),
    }
