"""Greedy evaluation on held-out prompts: one response per prompt, scored by the reward
function. val/accuracy is the share of responses scoring >= 1 (exactly right for 0/1
rule-based tasks such as the built-in arithmetic); val/score is the mean score."""

from __future__ import annotations

from typing import Any

from hybridflow.controller import WorkerGroup
from hybridflow.protocol import DataProto


def evaluate(actor: WorkerGroup, prompts: DataProto, reward_manager: Any, generation_groups: int) -> dict[str, float]:
    """Greedy responses of the current policy to `prompts`, scored."""
    batch, pad = prompts.pad_to_divisor(generation_groups)  # every generation group gets the same count
    batch.meta_info.update({"do_sample": False, "n": 1})
    out = actor.generate_sequences(batch).unpad(pad)
    out.meta_info.pop("metrics", None)
    scored = reward_manager.score(out)
    lengths = out.batch["response_mask"].sum(-1).double()
    return {
        "val/accuracy": float((scored.scores >= 1.0).double().mean()),
        "val/score": float(scored.scores.double().mean()),
        "val/response_length": float(lengths.mean()),
        "val/samples": float(len(out)),
    }
