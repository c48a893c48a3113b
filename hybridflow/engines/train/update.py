"""The update loop shared by actor and critic: epochs x mini-batches x micro-batches.

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
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hybridflow.algorithms import AggregationScale, compute_aggregation_scale, torch_all_reduce_sum
from hybridflow.engines.train import batching
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.flops import training_flops

Tensor = torch.Tensor
# (loss to backpropagate, summed metrics, averaged metrics)
MicroStep = Callable[[dict[str, Tensor], AggregationScale], tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]]
# Forward and backward of a whole mini-batch's micro-batches -> (summed, averaged) metrics:
# how a pipeline runs them (a schedule interleaves the micro-batches across stages).
MiniStep = Callable[[list[dict[str, Tensor]], AggregationScale], tuple[dict[str, float], dict[str, float]]]


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


def run_update(
    engine: TrainEngine,
    batch: Mapping[str, Tensor],
    *,
    prefix: str,
    micro_step: MicroStep,
    loss_scale_factor: float | None,
    mini_step: MiniStep | None = None,
    signal_key: str | None = None,
) -> dict[str, float]:
    """Train `engine` on this rank's `batch`; returns metrics averaged over the group.

    mini_step: runs the forward and backward passes of one mini-batch's micro-batches
    (a pipeline schedule); None runs `micro_step` on each micro-batch in turn.
    signal_key: a per-token tensor of the batch (the actor's advantages) whose mini-batch,
    when it is 0 on every response token of every rank, is skipped whole: no passes, no
    optimizer step (`{prefix}/skipped_no_signal` counts it); None steps on every mini-batch."""
    engine.require_trainable(f"update ({prefix})")
    mb_cfg = engine.config.micro_batch
    per_rank = mb_cfg.mini_batch_size // engine.dp_size
    batch = engine.to_device(batch)
    n = batching.batch_len(batch)
    # Mini-batch counts must match on all ranks, or the optimizer steps would not line up.
    batching.check_same_count(n, "sequences in the update batch", group=None)
    log = _MetricLog()
    seq_lens: list[int] = []
    lr = engine.optimizer.param_groups[0]["lr"]
    engine.model.train()
    start = time.perf_counter()
    for _ in range(mb_cfg.epochs):
        order = torch.randperm(n, generator=engine.shuffle_generator) if mb_cfg.shuffle else torch.arange(n)
        for mini in batching.split_mini_batches(batching.select(batch, order), per_rank):
            if signal_key is not None:
                silent = not _has_signal(mini, signal_key)
                log.add(f"{prefix}/skipped_no_signal", float(silent))
                if silent:  # the optimizer's moments and step count stay as they are
                    continue
            micro = [batching.select(mini, idx) for idx in engine.micro_batches(mini, for_update=True)]
            agg = compute_aggregation_scale(
                [m["response_mask"] for m in micro],
                dp_size=engine.dp_size,
                all_reduce_sum=torch_all_reduce_sum(engine.dp_group),
                loss_scale_factor=loss_scale_factor,
            )
            if mini_step is None:
                summed, averaged = _accumulate(micro, agg, micro_step)
            else:
                summed, averaged = mini_step(micro, agg)
            for m in micro:
                seq_lens.extend(m["attention_mask"].sum(dim=-1).tolist())
            norm, stepped = engine.optimizer_step()
            for k, v in {**summed, **averaged}.items():
                log.add(f"{prefix}/{k}", v)
            log.add(f"{prefix}/grad_norm", norm)
            log.add(f"{prefix}/skipped_steps", 0.0 if stepped else 1.0)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    with warnings.catch_warnings():
        # The schedule counts trainer steps, also those whose optimizer step was skipped for
        # no signal; torch warns when the scheduler steps before the optimizer ever has.
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before", category=UserWarning)
        engine.lr_scheduler.step()
    engine.global_step += 1
    metrics = log.reduce(group=None)
    metrics[f"{prefix}/lr"] = lr
    metrics.update(_throughput(engine, seq_lens, elapsed))
    return metrics


def _has_signal(mini: Mapping[str, Tensor], key: str) -> bool:
    """Whether `mini[key]` is non-zero on a response token of this mini-batch on any rank
    (every rank of the engine's group takes the same decision: one all-reduce)."""
    flag = (mini[key] * mini["response_mask"]).ne(0).any().to(torch.float32).reshape(1)  # on the batch's device
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def _accumulate(micro: list[dict[str, Tensor]], agg: AggregationScale,
                micro_step: MicroStep) -> tuple[dict[str, float], dict[str, float]]:
    """Forward and backward of each micro-batch in turn (gradients accumulate); returns the
    loss metrics summed over micro-batches and the ratio metrics averaged over them."""
    per_micro = []
    for m in micro:
        loss, sums, means = micro_step(m, agg)
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
