"""The shapes a reward function may have, told apart by its parameters, and how each is called.

    per sample   compute_score(data_source, solution_str, ground_truth, extra_info=None)
                 compute_score(solution_str, ground_truth, ...)      (a scorer of one data set)
                 -> float | dict with "score"; called with the arguments it names
    batched      reward(completions, prompts=..., completion_ids=..., **columns) -> list
                 (TRL's reward functions: one value, or None, per completion)

`BatchCall` runs any of them over a chunk of samples (the reward manager's batched path);
`RewardFunctions` sums several with weights, TRL's way (None: that function has no reward
for the sample; all None: the sample fails).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

SAMPLE_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
BATCH_ARGS = ("prompts", "completions", "completion_ids")
SHAPES = (
    "compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict (verl's reward "
    "function, per sample)",
    "compute_score(solution_str, ground_truth, ...) -> float | dict (a scorer of one data set, e.g. verl's "
    "reward_score/gsm8k.py)",
    "reward(completions, **kwargs) -> list[float | None] (TRL's: batched; prompts, completion_ids and the data "
    "set's columns as keyword arguments)",
)


def _parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None  # builtins and some callables have no inspectable signature


def is_batched(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes a batch (TRL's shape: it names `completions`)."""
    declared = getattr(fn, "batched", None)
    if declared is not None:
        return bool(declared)
    params = _parameters(fn)
    return params is not None and "completions" in params


def check_shape(fn: Callable[..., Any], where: str) -> None:
    """A TypeError naming the accepted shapes when `fn` has none of them."""
    params = _parameters(fn)
    if params is None or is_batched(fn):
        return
    kinds = {p.kind for p in params.values()}
    if inspect.Parameter.VAR_KEYWORD in kinds or {"solution_str", "ground_truth"} <= set(params):
        return
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    raise TypeError(f"{where} has parameters {list(params)} (required: {required}), none of the shapes a reward "
                    "function may have: " + "; ".join(SHAPES))


def sample_arguments(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The per-sample arguments `fn` names (all of them when it takes **kwargs)."""
    params = _parameters(fn)
    if params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


class BatchCall:
    """A reward function called on a chunk: `call(samples=[per-sample kwargs], batch={prompts,
    completions, completion_ids, columns...})` -> one value per sample. Picklable when `fn` is."""

    batched = True

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, samples: list[dict[str, Any]], batch: dict[str, list[Any]]) -> list[Any]:
        if isinstance(self.fn, RewardFunctions):
            values = self.fn.score_batch(samples, batch)
        elif is_batched(self.fn):
            values = list(self.fn(**batch))
        else:
            values = [self.fn(**sample_arguments(self.fn, s)) for s in samples]
        if len(values) != len(samples):
            raise ValueError(f"the reward function returned {len(values)} values for {len(samples)} completions; "
                             "return one per completion (None where it has no reward)")
        return values

    def __repr__(self) -> str:
        return f"BatchCall({self.fn!r})"


class RewardFunctions:
    """Several reward functions, summed with weights (TRL's reward_funcs / reward_weights):
    each completion's score is sum(weight x value) over the functions that gave a value (not
    None); each function's value is logged as reward_fn/<name> (its batch mean)."""

    batched = True

    def __init__(self, fns: Sequence[Callable[..., Any]], names: Sequence[str],
                 weights: Sequence[float] | None) -> None:
        if weights is not None and len(weights) != len(fns):
            raise ValueError(f"{len(weights)} weights for {len(fns)} reward functions; give one per function")
        self.fns, self.names = list(fns), list(names)
        self.weights = [1.0] * len(fns) if weights is None else [float(w) for w in weights]

    def __call__(self, samples: list[dict[str, Any]], batch: dict[str, list[Any]]) -> list[Any]:
        return self.score_batch(samples, batch)

    def score_batch(self, samples: list[dict[str, Any]], batch: dict[str, list[Any]]) -> list[Any]:
        columns = [BatchCall(fn)(samples, batch) for fn in self.fns]
        out: list[Any] = []
        for i in range(len(samples)):
            parts = {name: _number(values[i]) for name, values in zip(self.names, columns)}
            given = [(w, v) for w, v in zip(self.weights, parts.values()) if v is not None]
            if not given:
                out.append(None)
                continue
            out.append({"score": sum(w * v for w, v in given),
                        **{f"reward_fn/{n}": v for n, v in parts.items() if v is not None}})
        return out

    def __repr__(self) -> str:
        return f"RewardFunctions({self.names}, weights={self.weights})"


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value["score"] if isinstance(value, dict) else value)
    return None if math.isnan(value) else value
