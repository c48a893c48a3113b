"""Shared pieces of the agent tests: a tiny character model that ends turns, scripted environments."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from hybridflow.data.rl_dataset import collate_prompts
from hybridflow.data.tokenizer import load_tokenizer
from hybridflow.envs.agent import AgentEnv, StepResult

def prompt_batch(tokenizer, prompts: list[str], extra_infos: list[dict | None], ground_truths=None):
    """A collated batch of user prompts rendered with the chat template."""
    samples = []
    for i, (prompt, extra) in enumerate(zip(prompts, extra_infos)):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        samples.append({"input_ids": tokenizer(text, add_special_tokens=False)["input_ids"], "raw_prompt": prompt,
                        "data_source": "arithmetic", "ground_truth": (ground_truths or ["0"] * len(prompts))[i],
                        "extra_info": extra, "index": i})
    return collate_prompts(samples, tokenizer.pad_token_id)


class CountEnv(AgentEnv):
    """Deterministic: answers every turn with its length, reward 0.5 a turn, done after `turns` turns."""

    def __init__(self, turns: int = 3, latency_s: float = 0.0) -> None:
        self.turns, self.latency_s, self.seen = turns, latency_s, 0

    def reset(self, row):
        return [{"role": "user", "content": str(row["raw_prompt"])}]

    def step(self, turn):
        if self.latency_s:
            time.sleep(self.latency_s)
        self.seen += 1
        return StepResult([{"role": "user", "content": f"n{len(turn)}"}], reward=0.5, done=self.seen >= self.turns)


class RaisingEnv(CountEnv):
    def step(self, turn):
        raise RuntimeError("env bug")


class HangingEnv(CountEnv):
    def step(self, turn):
        time.sleep(30)


class WrongTypeEnv(CountEnv):
    def step(self, turn):
        return {"observation": "not a StepResult"}


class BadResetEnv(CountEnv):
    def reset(self, row):
        return "a string, not messages"


class BadInitEnv(CountEnv):
    def __init__(self, **kwargs):
        raise ValueError("cannot construct")


class BadCloseEnv(CountEnv):
    def close(self):
        raise OSError("cannot release")


def tokenizer_of(path: Path):
    return load_tokenizer(path)


def as_list(x) -> list:
    return list(np.asarray(x).tolist())


class AsyncCountEnv(CountEnv):
    """CountEnv whose answers come from a coroutine (an I/O-bound environment)."""

    async def astep(self, turn):
        import asyncio

        await asyncio.sleep(0.01)
        return CountEnv.step(self, turn)

    def step(self, turn):
        raise AssertionError("the loop must call astep")
