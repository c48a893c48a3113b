"""Held-out evaluation: responses of the current policy to a prompt batch, scored by the
reward function, reported overall and per data source.

    metrics = evaluate(actor, prompts, reward_manager, generation_groups, cfg.trainer.validation)
    metrics["val/accuracy"], metrics["val/score"]                     # all prompts
    metrics["val/arithmetic/accuracy"], metrics["val/arithmetic/score"]   # per data_source
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from hybridflow.config.loader import to_plain
from hybridflow.config.sections.trainer import ValidationSection
from hybridflow.controller import WorkerGroup
from hybridflow.protocol import DataProto

GREEDY = ValidationSection()


def sampling_meta(sampling: ValidationSection) -> dict[str, Any]:
    """The generation call's meta_info for `sampling`: every one of its settings, so nothing
    falls back to the training rollout's sampling settings except the response length."""
    return dataclasses.asdict(sampling)


def evaluate(actor: WorkerGroup, prompts: DataProto, reward_manager: Any, generation_groups: int,
             sampling: ValidationSection = GREEDY) -> dict[str, float]:
    """Responses of the current policy to `prompts` (sampled per `sampling`), scored."""
    return evaluate_responses(actor, prompts, reward_manager, generation_groups, sampling, keep=False)[0]


def evaluate_responses(actor: WorkerGroup, prompts: DataProto, reward_manager: Any, generation_groups: int,
                       sampling: ValidationSection = GREEDY,
                       keep: bool = True) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """`evaluate`'s metrics and (with `keep`) one record per response: the prompt as given,
    the response decoded (special tokens kept, padding cut), ground truth, score, whether
    it counts as correct, its length in model tokens, why generation stopped and, for
    agent tasks, turns and tool calls."""
    padded, _ = prompts.pad_to_divisor(generation_groups)  # every generation group gets the same count
    batch = DataProto(batch=padded.batch, non_tensor_batch=padded.non_tensor_batch,
                      meta_info={**padded.meta_info, **sampling_meta(sampling)})  # the caller's batch stays as it is
    out = actor.generate_sequences(batch)
    # The n responses of a prompt are consecutive, so the padding prompts' come last.
    out = out[: len(prompts) * sampling.n]
    out.meta_info.pop("metrics", None)
    scored = reward_manager.score(out)
    lengths = out.batch["response_mask"].sum(-1).double()
    nt = out.non_tensor_batch
    metrics = score_metrics(scored.scores.double(), lengths, nt["data_source"])
    if "finish_reason" in nt:
        metrics["val/clip_ratio"] = float(np.mean(nt["finish_reason"] == "length"))
    metrics.update(agent_metrics(nt))
    records = response_records(out, scored.scores, reward_manager.tokenizer) if keep else []
    return metrics, records


def agent_metrics(non_tensors: dict[str, np.ndarray]) -> dict[str, float]:
    """val/tool_call_rate, val/num_tool_calls_mean, val/num_turns_mean of a multi-turn batch
    ({} for single-turn responses, which carry no turn counts)."""
    if "num_tool_calls" not in non_tensors:
        return {}
    calls = np.asarray([float(v) for v in non_tensors["num_tool_calls"]])
    return {"val/tool_call_rate": float(np.mean(calls > 0)), "val/num_tool_calls_mean": float(calls.mean()),
            "val/num_turns_mean": float(np.mean([float(v) for v in non_tensors["num_turns"]]))}


def response_records(out: DataProto, scores: torch.Tensor, tokenizer: Any) -> list[dict[str, Any]]:
    """One JSON-ready record per response of a generated, scored batch."""
    nt, b = out.non_tensor_batch, out.batch
    # The response's tokens up to its last non-padding one (model turns and, for agents, observations).
    prompt_len = b["prompts"].shape[-1]
    spans = b["attention_mask"][:, prompt_len:].sum(-1).tolist()
    texts = tokenizer.batch_decode([b["responses"][i, :n].tolist() for i, n in enumerate(spans)],
                                   skip_special_tokens=False)
    lengths = b["response_mask"].sum(-1).tolist()
    optional = [key for key in ("finish_reason", "num_turns", "num_tool_calls", "agent_stop") if key in nt]
    records = []
    for i, text in enumerate(texts):
        score = float(scores[i])
        record = {"index": to_plain(nt["index"][i]) if "index" in nt else i, "data_source": str(nt["data_source"][i]),
                  "prompt": to_plain(nt["raw_prompt"][i]) if "raw_prompt" in nt else None, "response": text,
                  "ground_truth": to_plain(nt["ground_truth"][i]), "score": score, "correct": score >= 1.0,
                  "length": int(lengths[i])}
        record.update({key: to_plain(nt[key][i]) for key in optional})
        records.append(record)
    return records


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
