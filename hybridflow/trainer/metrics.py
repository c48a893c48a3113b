"""Per-step metrics computed on the controller from the step's final batch.

Names (all floats):
- score/{mean,std,max,min}: the task score of each response (sum of token_level_scores);
- reward/{mean,max,min}: the reward optimised (score minus the KL penalty when in reward),
  plus the reward manager's reward/{errors,timeouts,empty_responses,worker_restarts};
- adv/{mean,std,max,min}, returns/{mean,max,min}, values/{mean,max,min} over response tokens;
- actor/entropy (token mean under the rollout policy), actor/ref_kl (k1, when a reference exists);
- response_length/{mean,max,min,clip_ratio} (clip_ratio: share stopped by the length limit),
  prompt_length/{mean,max};
- perf/tokens_per_s (prompt + response tokens of the step / step wall time) and perf/mfu:
  the step's estimated model FLOPs (generation and scoring forwards 2N per token, updates
  6N per token, plus attention, see engines/train/flops.py) over step time x ranks x peak
  FLOP/s of one rank. Update-only numbers from the engines are perf/{actor,critic}_update_*.
- timing_s/<phase>: controller wall time of each phase (gen, reward, old_log_prob, ref,
  values, kl_reward, adv, update_critic, update_actor) and of the step; the workers add
  timing_s/generate and timing_s/reshard_to_generation (the weight sync into the rollout
  engine) and timing_s/update_*_in_worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hybridflow.algorithms import masked_mean
from hybridflow.engines.train.flops import training_flops
from hybridflow.protocol import DataProto


def _stats(prefix: str, values: torch.Tensor, ops: tuple[str, ...] = ("mean", "max", "min")) -> dict[str, float]:
    values = values.double()
    if values.numel() == 0:
        return {f"{prefix}/{op}": 0.0 for op in ops}
    table = {"mean": values.mean, "max": values.max, "min": values.min, "std": values.std}
    return {f"{prefix}/{op}": float(table[op]()) if op != "std" or values.numel() > 1 else 0.0 for op in ops}


def _token_values(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask.bool()]


def data_metrics(batch: DataProto) -> dict[str, float]:
    """Statistics of what the step generated and computed (see the module docstring)."""
    b = batch.batch
    mask = b["response_mask"]
    out: dict[str, float] = {}
    out.update(_stats("score", b["token_level_scores"].sum(-1), ("mean", "std", "max", "min")))
    if "token_level_rewards" in b:
        out.update(_stats("reward", b["token_level_rewards"].sum(-1)))
    if "advantages" in b:
        out.update(_stats("adv", _token_values(b["advantages"], mask), ("mean", "std", "max", "min")))
        out.update(_stats("returns", _token_values(b["returns"], mask)))
    if "values" in b:
        out.update(_stats("values", _token_values(b["values"], mask)))
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
class FlopModel:
    """What the FLOP estimate needs: matmul parameters, layers, hidden size of the policy
    (and of the critic), and one rank's peak FLOP/s."""

    actor_params: int
    critic_params: int
    layers: int
    hidden: int
    peak_flops_per_rank: float

    def step_flops(self, batch: DataProto, *, forwards: int, critic_forwards: int, actor_update_epochs: int,
                   critic_update_epochs: int) -> float:
        """Generation + `forwards` actor scoring passes + critic passes + updates."""
        seq_lens = batch.batch["attention_mask"].sum(-1).tolist()
        actor_train = training_flops(self.actor_params, self.layers, self.hidden, seq_lens)
        critic_train = training_flops(self.critic_params, self.layers, self.hidden, seq_lens)
        # A forward is a third of forward + backward; generation is one forward per token.
        generation = actor_train / 3
        return (generation + forwards * actor_train / 3 + critic_forwards * critic_train / 3
                + actor_update_epochs * actor_train + critic_update_epochs * critic_train)


def throughput_metrics(batch: DataProto, step_seconds: float, world_size: int, flops: float,
                       flop_model: FlopModel) -> dict[str, float]:
    tokens = float(batch.batch["attention_mask"].sum())
    seconds = max(step_seconds, 1e-9)
    return {
        "perf/tokens_per_s": tokens / seconds,
        "perf/mfu": flops / seconds / (world_size * flop_model.peak_flops_per_rank),
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
