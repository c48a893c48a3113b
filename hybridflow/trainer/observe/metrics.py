"""Per-step metrics computed on the controller from the step's final batch."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from hybridflow.algorithms import masked_mean
from hybridflow.controller import WorkerGroup
from hybridflow.engines.train.flops import FlopFacts
from hybridflow.protocol import DataProto
from hybridflow.workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker


def _stats(prefix: str, values: torch.Tensor, ops: tuple[str, ...] = ("mean", "max", "min")) -> dict[str, float]:
    values = values.double()
    if values.numel() == 0:
        return {f"{prefix}/{op}": 0.0 for op in ops}
    table = {"mean": values.mean, "max": values.max, "min": values.min, "std": values.std}
    return {f"{prefix}/{op}": float(table[op]()) if op != "std" or values.numel() > 1 else 0.0 for op in ops}


def data_metrics(batch: DataProto) -> dict[str, float]:
    """Statistics of what the step generated and computed (see the module docstring)."""
    b = batch.batch
    mask = b["response_mask"]
    tokens = mask.bool()  # the response tokens of every sequence
    out: dict[str, float] = {}
    out.update(_stats("score", b["token_level_scores"].sum(-1), ("mean", "std", "max", "min")))
    if "token_level_rewards" in b:
        out.update(_stats("reward", b["token_level_rewards"].sum(-1)))
    if "advantages" in b:
        out.update(_stats("adv", b["advantages"][tokens], ("mean", "std", "max", "min")))
        out.update(_stats("returns", b["returns"][tokens]))
    if "values" in b:
        out.update(_stats("values", b["values"][tokens]))
    if "entropys" in b:
        out["actor/entropy"] = float(masked_mean(b["entropys"], mask))
    if "ref_log_probs" in b:
        out["actor/ref_kl"] = float(masked_mean(b["old_log_probs"] - b["ref_log_probs"], mask))
    lengths = mask.sum(-1).double()
    out.update(_stats("response_length", lengths))
    if "finish_reason" in batch.non_tensor_batch:
        out["response_length/clip_ratio"] = float(np.mean(batch.non_tensor_batch["finish_reason"] == "length"))
    prompt_lengths = b["attention_mask"].sum(-1).double() - lengths
    out.update(_stats("prompt_length", prompt_lengths, ("mean", "max")))
    return out


@dataclass(frozen=True)
class BatchSummary:
    """What the per-step metrics need of a trained batch: its `data_metrics` and every
    sequence's length (prompt + response tokens). The asynchronous modes compute it next
    to the data (trainer/modes/stream_step.py), so the controller never holds the batch."""

    metrics: dict[str, float]
    seq_lens: list[int]

    @classmethod
    def of(cls, batch: DataProto) -> BatchSummary:
        return cls(data_metrics(batch), sequence_lengths(batch))


def sequence_lengths(batch: DataProto) -> list[int]:
    """Prompt + response tokens of every sequence of `batch`."""
    return batch.batch["attention_mask"].sum(-1).tolist()


@dataclass(frozen=True)
class FlopModel:
    """The models of a step and the peak they run against, as the workers reported them.

    actor: the policy; critics: value models scored and trained every step (critic, and
    Safe-RLHF's cost critic); scorers: frozen sequence scorers run forward once per step
    (reward and cost models); peak_flops: the summed peak FLOP/s of the step's processes.
    """

    actor: FlopFacts
    critics: tuple[FlopFacts, ...]
    scorers: tuple[FlopFacts, ...]
    peak_flops: float

    def step_flops(self, seq_lens: list[int], *, actor_forwards: int, actor_update_epochs: int,
                   critic_update_epochs: int) -> float:
        """Generation + `actor_forwards` actor scoring passes (old and reference log-probs)
        + one forward of every critic and scorer + the actor's and critics' updates, over
        sequences of `seq_lens` tokens (prompt + response, `BatchSummary.seq_lens`)."""
        actor = self.actor.training_flops(seq_lens)
        # A forward is a third of forward + backward; generation is one forward per token.
        total = (1 + actor_forwards) * actor / 3 + actor_update_epochs * actor
        for critic in self.critics:
            train = critic.training_flops(seq_lens)
            total += train / 3 + critic_update_epochs * train
        return total + sum(scorer.training_flops(seq_lens) / 3 for scorer in self.scorers)


def flop_model(groups: Mapping[str, WorkerGroup]) -> FlopModel:
    """Ask every role's ranks for their `flop_facts` (each measures its own device) and
    combine them; a role whose worker has no FLOP estimate is an error."""
    actor: FlopFacts | None = None
    critics: list[FlopFacts] = []
    scorers: list[FlopFacts] = []
    peaks: list[tuple[Hashable, float]] = []
    for role, group in groups.items():
        if not issubclass(group.worker_cls, (ActorRolloutRefWorker, CriticWorker, RewardModelWorker)):
            raise TypeError(f"role {role!r} ({group.worker_cls.__qualname__}) has no FLOP estimate for perf/mfu; "
                            "give its worker a flop_facts method and count it in metrics.flop_model")
        facts = group.flop_facts()
        peaks += [((info["node_id"], info["pid"]), rank.peak_flops) for info, rank in zip(group.worker_info, facts)]
        if issubclass(group.worker_cls, ActorRolloutRefWorker):
            actor = facts[0]  # every rank reports the full (unsharded) model
        elif issubclass(group.worker_cls, CriticWorker):
            critics.append(facts[0])
        else:
            scorers.append(facts[0])
    if actor is None:
        raise ValueError(f"no actor among the roles {sorted(groups)}: the step's FLOPs start from the policy")
    return FlopModel(actor, tuple(critics), tuple(scorers), total_peak_flops(peaks))


def total_peak_flops(peaks: Iterable[tuple[Hashable, float]]) -> float:
    """The summed peak of the devices behind (process, peak FLOP/s) reports. Colocated
    roles share a process and so a device: it counts once, at the highest rate any of its
    roles reported (roles differ there only in compute dtype or a configured peak)."""
    best: dict[Hashable, float] = {}
    for process, peak in peaks:
        if not peak > 0:
            raise ValueError(f"process {process!r} reported a peak of {peak} FLOP/s; set "
                             "actor.peak_flops_per_device (critic.*, ...) to the device's positive peak")
        best[process] = max(best.get(process, 0.0), peak)
    return sum(best.values())


def mfu_note(peak_flops: float, on_gpu: bool, configured: bool) -> str | None:
    """The console line about perf/mfu, or None where the number means little: on CPUs the
    peak is a short matmul measured by each worker at start-up, on a machine that may be
    busy, so the ratio moves with the load; on GPUs it is the spec sheet's (or the
    configured <role>.peak_flops_per_device). perf/mfu is logged either way (docs/trainer.md)."""
    if not (on_gpu or configured):
        return None
    source = "the configured peak_flops_per_device" if configured else "the GPUs' bf16/fp32 spec peaks"
    return (f"perf/mfu: model FLOPs per second over {peak_flops / 1e12:.3g} TFLOP/s, the summed peak of the "
            f"workers' devices ({source})")


def throughput_metrics(tokens: float, step_seconds: float, flops: float, peak_flops: float) -> dict[str, float]:
    """perf/tokens_per_s (`tokens` of the step's sequences over its time), perf/mfu (`flops`
    over the step time x `peak_flops`) and perf/step_flops."""
    seconds = max(step_seconds, 1e-9)
    return {
        "perf/tokens_per_s": tokens / seconds,
        "perf/mfu": flops / seconds / peak_flops,
        "perf/step_flops": flops,
    }


def rename_worker_metrics(metrics: dict[str, float], role: str) -> dict[str, float]:
    """Keep an update's own numbers apart from the step's: the engine's perf/tokens_per_s and
    perf/mfu (of the update alone) become perf/<role>_update_*, and the worker's timer
    timing_s/update_<role> (inside the worker) becomes timing_s/update_<role>_in_worker; the
    controller's timing_s/update_<role> includes dispatch and collection."""
    renamed = {}
    for key, value in metrics.items():
        if key.startswith("perf/"):
            key = f"perf/{role}_update_{key.removeprefix('perf/')}"
        elif key.startswith("timing_s/"):
            key = f"{key}_in_worker"
        renamed[key] = value
    return renamed
