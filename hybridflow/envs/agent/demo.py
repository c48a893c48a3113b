"""Pieces of the agent demos, benchmarks and tests that are not specific to one of them.

- `make_turn_model_dir`: the built-in character model with its eos logit raised, so a
  randomly initialised model ends its turns after a few tokens (a random model almost
  never samples eos, and multi-turn rollouts need turns that end);
- `LatencyEnv`: a deterministic multi-turn environment whose step sleeps a latency drawn
  from a seeded log-normal distribution (a long-tailed tool / API), for async vs sync runs.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from hybridflow.envs.agent.base import AgentEnv, StepResult, register_agent_env

TINY_SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1)


def make_turn_model_dir(path: str | Path, eos_boost: float = 5.0, **sizes) -> Path:
    """Write the built-in tokenizer + a random model (`sizes`, default TINY_SIZES) into `path`
    with lm_head's eos row set to `eos_boost` x a scaled mean of 30 other rows."""
    import torch
    import transformers

    from hybridflow.data.tokenizer import make_builtin_model_dir

    path = make_builtin_model_dir(path, **(sizes or TINY_SIZES))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False)
    with torch.no_grad():
        w = model.lm_head.weight
        w[2] = eos_boost * w[10:40].mean(0) * 30 ** 0.5
    model.save_pretrained(path)
    return path


@register_agent_env("latency")
class LatencyEnv(AgentEnv):
    """Answers every turn with "ok", done after `turns` turns; each step sleeps
    exp(N(log(median_s), sigma)) seconds, seeded by (seed, row index, turn)."""

    def __init__(self, turns: int = 4, median_s: float = 0.05, sigma: float = 1.0, seed: int = 0) -> None:
        self.turns, self.median_s, self.sigma, self.seed = turns, median_s, sigma, seed
        self.seen, self.index = 0, 0

    def reset(self, row):
        self.index = int(row.get("index", 0))
        prompt = row["raw_prompt"]
        return [{"role": "user", "content": prompt if isinstance(prompt, str) else str(prompt)}]

    def latency(self, turn: int) -> float:
        rng = random.Random(f"{self.seed}-{self.index}-{turn}")
        return rng.lognormvariate(0.0, self.sigma) * self.median_s

    def step(self, turn: str) -> StepResult:
        self.seen += 1
        time.sleep(self.latency(self.seen))
        return StepResult([{"role": "user", "content": "ok"}], done=self.seen >= self.turns)
