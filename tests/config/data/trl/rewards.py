"""Reward functions as a TRL GRPO script defines them: batched, the completions (chat
messages here) and the data set's columns as keyword arguments, one value per completion."""

import re


def accuracy_reward(completions, solution, **kwargs):
    """1 when the completion's last number is the solution."""
    found = [re.findall(r"-?\d+", c[0]["content"]) for c in completions]
    return [float(bool(f) and f[-1] == s) for f, s in zip(found, solution)]


def format_reward(completions, completion_ids, **kwargs):
    """Partial credit for short answers: 1 at one token, falling to 0 at 32."""
    return [max(0.0, 1.0 - len(ids) / 32) for ids in completion_ids]
