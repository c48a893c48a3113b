"""Held-out evaluation: responses of the current policy to a prompt batch, scored by the
reward function, reported overall and per data source.

    metrics = evaluate(actor, prompts, reward_manager, generation_groups, cfg.trainer.validation)
    metrics["val/accuracy"], metrics["val/score"]                     # all prompts
    metrics["val/arithmetic/accuracy"], metrics["val/arithmetic/score"]   # per data_source

Greedy by default (trainer.validation: do_sample false, n 1); with n > 1 every response
counts. val/accuracy is the share of responses scoring >= 1 (exactly right for 0/1
rule-based tasks such as the built-in arithmetic); val/score is the mean score.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.config.schema import ValidationSection
from hybridflow.controller import WorkerGroup
from hybridflow.protocol import DataProto

GREEDY = ValidationSection()


def sampling_meta(sampling: ValidationSection) -> dict[str, Any]:
    """The generation call's meta_info for `sampling` (every key explicit: nothing falls
    back to the training rollout's sampling settings except the response length)."""
    return {"do_sample": sampling.do_sample, "n": sampling.n, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": sampling.seed}


def evaluate(actor: WorkerGroup, prompts: DataProto, reward_manager: Any, generation_groups: int,
             sampling: ValidationSection = GREEDY) -> dict[str, float]:
    """Responses of the current policy to `prompts` (sampled per `sampling`), scored."""
    padded, _ = prompts.pad_to_divisor(generation_groups)  # every generation group gets the same count
    batch = DataProto(batch=padded.batch, non_tensor_batch=padded.non_tensor_batch,
                      meta_info={**padded.meta_info, **sampling_meta(sampling)})  # the caller's batch stays as it is
    out = actor.generate_sequences(batch)
    # The n responses of a prompt are consecutive, so the padding prompts' come last.
    out = out[: len(prompts) * sampling.n]
    out.meta_info.pop("metrics", None)
    scored = reward_manager.score(out)
    lengths = out.batch["response_mask"].sum(-1).double()
    return score_metrics(scored.scores.double(), lengths, out.non_tensor_batch["data_source"])


def score_metrics(scores: torch.Tensor, lengths: torch.Tensor, data_sources: np.ndarray) -> dict[str, float]:
    """val/accuracy, val/score, val/response_length, val/samples over all responses, and
    val/<data_source>/accuracy, /score, /samples for each data source."""
    metrics = _group_metrics("val", scores)
    metrics["val/response_length"] = float(lengths.mean())
    sources = np.asarray([str(s) for s in data_sources])
    for source in sorted(set(sources.tolist())):
        rows = torch.from_numpy(np.flatnonzero(sources == source))
        metrics.update(_group_metrics(f"val/{source}", scores[rows]))
    return metrics


def _group_metrics(prefix: str, scores: torch.Tensor) -> dict[str, float]:
    return {
        f"{prefix}/accuracy": float((scores >= 1.0).double().mean()),
        f"{prefix}/score": float(scores.mean()),
        f"{prefix}/samples": float(len(scores)),
    }
