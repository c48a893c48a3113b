"""RewardManager: decode a batch of responses, score them, and place the scores on tokens.

    manager = RewardManager(tokenizer, RewardConfig(num_workers=2, timeout_s=5.0))
    out = manager(batch)                # batch: responses, response_mask, data_source, ground_truth
    batch.batch["token_level_scores"] = out.token_level_scores
    metrics.update(out.metrics)         # reward/mean, reward/errors, reward/timeouts, ...
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hybridflow.errors import UserInputError
from hybridflow.protocol import DataProto
from hybridflow.rewards._worker import call_with_timeout
from hybridflow.rewards.config import RewardConfig
from hybridflow.rewards.limits import worker_limits
from hybridflow.rewards.pool import NOT_SCORED, ScoringPool, first_samples_first
from hybridflow.rewards.registry import DispatchScore
from hybridflow.rewards.shapes import BatchCall, is_batched
from hybridflow.rewards.templates import TemplateSpec, score_turns

logger = logging.getLogger(__name__)


GIVE_UP_AFTER = 4  # failed samples (none succeeded) that end a call before the function ever succeeded


IMPORT_TIMEOUT_S = 120.0  # how long a reward worker may take to import the function (check_reward_function)


def check_reward_function(fn: Callable[..., Any], config: RewardConfig) -> str | None:
    """What is wrong with a file's reward function (FileRewardFn), found where it will run:
    imported in one worker confined like the samples (in this process with num_workers=0,
    the unconfined debugging mode); None when nothing is, or `fn` is no file's."""
    if not hasattr(fn, "resolve"):
        return None
    if config.num_workers == 0:
        try:
            fn.resolve()
        except (OSError, ImportError, AttributeError, TypeError) as err:
            return str(err)
        return None
    pool = ScoringPool(fn, 1, config.timeout_s, config.kill_grace_s, config.mp_context,
                       limits=worker_limits(config, fn))
    try:
        return pool.check_function(IMPORT_TIMEOUT_S)
    finally:
        pool.close()


class RewardFailureError(UserInputError):
    """The reward function failed on most samples for max_failed_steps scoring calls in a row."""


@dataclasses.dataclass
class RewardOutput:
    """Scores of one batch.

    token_level_scores: [B, T_resp] float32, the score at each sample's last valid
        response token, 0 elsewhere.
    scores: [B] float32 per-sample scores.
    extra_info: extra values returned in dicts by the reward function, key -> list of B
        (None where a sample did not return that key).
    errors: (sample index, message) of the samples that failed or timed out.
    metrics: reward/mean, reward/errors, reward/timeouts, reward/empty_responses,
        reward/worker_restarts.
    """

    token_level_scores: torch.Tensor
    scores: torch.Tensor
    extra_info: dict[str, list[Any]]
    errors: list[tuple[int, str]]
    metrics: dict[str, float]

    def to_dataproto(self) -> DataProto:
        """token_level_scores as a tensor, the extras as non-tensors, metrics in meta_info."""
        return DataProto.from_dict(
            tensors={"token_level_scores": self.token_level_scores},
            non_tensors=dict(self.extra_info),
            meta_info={"metrics": dict(self.metrics)},
        )


def normalize_result(value: Any) -> tuple[float, dict[str, Any]]:
    """A reward function's return value -> (score, extras); ValueError if unusable."""
    extras: dict[str, Any] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"reward function returned a dict without 'score' (keys: {sorted(value)})")
        extras = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    # bools, Python/numpy numbers and one-element tensors/arrays (via .item()) are accepted.
    if hasattr(value, "item") and not isinstance(value, numbers.Real):
        try:
            value = value.item()
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"reward function returned a {type(value).__name__} with more than one element") from err
    if not isinstance(value, (numbers.Real, np.bool_)):
        raise ValueError(
            f"reward function returned {type(value).__name__} {value!r}; return a float or a dict with 'score'"
        )
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"reward function returned a non-finite score {score}")
    return score, extras


# Extra values of a reward function's dict that are logged as metrics (their batch mean): each
# template's weighted part (templates.ComposedScore), each function's value (shapes.RewardFunctions).
PART_PREFIXES = ("template/", "reward_fn/")


def _chunks(count: int, parts: int) -> list[list[int]]:
    """range(count) cut into at most `parts` contiguous chunks of near-equal size."""
    size = -(-count // max(1, parts)) or 1
    return [list(range(k, min(k + size, count))) for k in range(0, count, size)]


def batch_inputs(data: DataProto, texts: list[str], starts: Any, last: torch.Tensor) -> dict[str, list[Any]]:
    """What a batched (TRL-shaped) reward function is called with, one entry per sample: prompts
    as the data set gave them (text or chat messages), completions (text, or one assistant
    message for chat prompts), completion_ids, and every other column of the data set's rows."""
    nt, responses = data.non_tensor_batch, data.batch["responses"]
    n = len(texts)
    prompts = list(nt["raw_prompt"]) if "raw_prompt" in nt else [None] * n
    completions = [[{"role": "assistant", "content": t}] if isinstance(p, list) else t for p, t in zip(prompts, texts)]
    ids = [responses[i, int(starts[i]): int(last[i]) + 1].tolist() for i in range(n)]
    rows = [dict(r) for r in nt["columns"]] if "columns" in nt else [{} for _ in range(n)]
    columns = {key: [row.get(key) for row in rows] for key in dict.fromkeys(k for row in rows for k in row)}
    columns = {k: v for k, v in columns.items() if k not in ("prompts", "completions", "completion_ids")}
    return {"prompts": prompts, "completions": completions, "completion_ids": ids, **columns}


def last_valid_positions(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of response_mask; -1 for a row with none."""
    positions = torch.arange(response_mask.shape[1], device=response_mask.device).expand_as(response_mask)
    masked = torch.where(response_mask.bool(), positions, torch.full_like(positions, -1))
    return masked.max(dim=1).values


class RewardManager:
    """Scores DataProto batches with a reward function, in worker processes or in-process."""

    def __init__(
        self,
        tokenizer: Any,
        config: RewardConfig | None = None,
        compute_score: Callable[..., Any] | None = None,
        turn_templates: list[TemplateSpec] | None = None,
    ) -> None:
        """`compute_score` has verl's signature (see registry.py); default: the built-in scorers.
        `turn_templates`: turn-level reward templates (templates.py), scored on every model turn."""
        self.tokenizer = tokenizer
        self.turn_templates = [t for t in (turn_templates or []) if t.level == "turn"]
        self.config = config or RewardConfig()
        self.compute_score = compute_score if compute_score is not None else DispatchScore()
        self.batched = is_batched(self.compute_score)
        self._call = BatchCall(self.compute_score) if self.batched else self.compute_score
        self._pool: ScoringPool | None = None
        if self.config.num_workers > 0:
            self._pool = ScoringPool(
                self._call,
                self.config.num_workers,
                self.config.timeout_s,
                self.config.kill_grace_s,
                self.config.mp_context,
                limits=worker_limits(self.config, self._call),
            )
        self._failing_calls = 0  # scoring calls in a row with more than max_failed_share failures
        self._succeeded = False  # whether the function has scored any sample yet

    def close(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __call__(self, data: DataProto) -> RewardOutput:
        return self.score(data)

    def score(self, data: DataProto) -> RewardOutput:
        """Decode each response up to its last valid token, score it, and place the score there."""
        responses, response_mask = self._check_batch(data)
        last = last_valid_positions(response_mask)
        nt = data.non_tensor_batch
        # Multi-turn rollouts (envs/agent/loop.py): the scorer reads the final model turn.
        starts = nt["final_turn_start"] if "final_turn_start" in nt else [0] * len(responses)
        texts = self.tokenizer.batch_decode(
            [responses[i, int(starts[i]) : int(last[i]) + 1].tolist() for i in range(len(responses))],
            skip_special_tokens=True,
        )
        extra_infos = nt["extra_info"] if "extra_info" in nt else [None] * len(texts)
        if "num_turns" in nt:  # what turn / tool-use / length templates read
            extra_infos = [{**(extra_infos[i] or {}), "num_turns": int(nt["num_turns"][i]),
                            "num_tool_calls": int(nt["num_tool_calls"][i]),
                            "num_model_tokens": int(response_mask[i].sum())} for i in range(len(texts))]
        tasks = [
            {
                "data_source": nt["data_source"][i],
                "solution_str": texts[i],
                "ground_truth": nt["ground_truth"][i],
                "extra_info": extra_infos[i],
            }
            for i in range(len(texts))
        ]
        if self.batched:
            outcomes, restarts = self._run_batched(tasks, batch_inputs(data, texts, starts, last))
        else:
            outcomes, restarts = self._run(tasks)
        out = self._assemble(outcomes, last, responses.shape, restarts)
        for key, values in out.extra_info.items():  # each part (templates.ComposedScore, shapes.RewardFunctions)
            if key.startswith(PART_PREFIXES):
                out.metrics[key] = float(np.mean([float(v) for v in values if v is not None] or [0.0]))
        if self.turn_templates:
            add_turn_rewards(out, data, self.tokenizer, self.turn_templates)
        if "score_override" in nt or "env_rewards" in data.batch:
            add_environment_rewards(out, data, last)
        self._count_failures(out.errors, len(outcomes))
        return out

    def _count_failures(self, errors: list[tuple[int, str]], samples: int) -> None:
        """Raise RewardFailureError at once when every sample failed and the function has never
        succeeded in this run (it is broken, not flaky), or after max_failed_steps calls in a
        row with too many failures. (A function that worked before and fails on one call, e.g.
        one group of an asynchronous run, gets the in-a-row rule.)"""
        config = self.config
        failing = samples > 0 and len(errors) > config.max_failed_share * samples
        self._failing_calls = self._failing_calls + 1 if failing else 0
        if config.max_failed_steps and samples > 0 and len(errors) == samples and not self._succeeded:
            given_up = sum(NOT_SCORED in message for _, message in errors)
            first, message = next((e for e in errors if NOT_SCORED not in e[1]), errors[0])
            raise RewardFailureError(
                f"the reward function failed on every sample of this step ({samples - given_up} scored"
                f"{f', {given_up} given up after those' if given_up else ''}; first: sample {first}, {message}). "
                "Fix the reward function (reward.custom_fn_path); reward.manager.max_failed_steps=0 never stops")
        if config.max_failed_steps and self._failing_calls >= config.max_failed_steps:
            raise RewardFailureError(
                f"the reward function failed on {len(errors)} of {samples} samples, and on more than "
                f"{config.max_failed_share:.0%} in each of the last {self._failing_calls} steps (first: sample "
                f"{errors[0][0]}, {errors[0][1]}). Fix the reward function; the limit is "
                "reward.manager.max_failed_share / max_failed_steps")

    def _check_batch(self, data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [k for k in ("responses", "response_mask") if k not in data.batch]
        missing += [k for k in ("data_source", "ground_truth") if k not in data.non_tensor_batch]
        if missing:
            raise KeyError(
                f"RewardManager needs batch tensors responses, response_mask and non-tensors data_source, "
                f"ground_truth; missing {missing}"
            )
        responses, mask = data.batch["responses"], data.batch["response_mask"]
        if responses.shape != mask.shape:
            raise ValueError(f"responses {list(responses.shape)} and response_mask {list(mask.shape)} differ in shape")
        return responses, mask

    def _run(self, tasks: list[dict[str, Any]]) -> tuple[list[tuple[str, Any]], int]:
        # Until the function has succeeded once, the first GIVE_UP_AFTER samples (or a round
        # of all workers, if more) are scored first; when they all fail, no other sample is,
        # and the failure limit then stops the run: a broken function costs seconds, not a
        # batch of per-sample time limits.
        give_up = (max(self.config.num_workers, GIVE_UP_AFTER) if self.config.max_failed_steps and not self._succeeded
                   else None)
        if self._pool is not None:
            outcomes, restarts = self._pool.run(tasks, give_up_after=give_up)
        else:
            outcomes, restarts = first_samples_first(self._in_process, tasks, give_up)
        self._succeeded = self._succeeded or any(status == "ok" for status, _ in outcomes)
        return outcomes, restarts

    def _in_process(self, tasks: list[dict[str, Any]]) -> tuple[list[tuple[str, Any]], int]:
        return [call_with_timeout(self._call, task, self.config.timeout_s) for task in tasks], 0

    def _run_batched(self, tasks: list[dict[str, Any]],
                     inputs: dict[str, list[Any]]) -> tuple[list[tuple[str, Any]], int]:
        """Score in chunks with the batched function (one chunk per worker); each chunk's
        outcome becomes its samples' (None: "no reward for this completion", a failure)."""
        chunks = _chunks(len(tasks), max(1, self.config.num_workers))
        calls = [{"samples": [tasks[i] for i in idx], "batch": {k: [v[i] for i in idx] for k, v in inputs.items()}}
                 for idx in chunks]
        results, restarts = self._run(calls)
        outcomes: list[tuple[str, Any]] = []
        for idx, (status, value) in zip(chunks, results):
            if status != "ok":
                outcomes += [(status, value)] * len(idx)
                continue
            outcomes += [("ok", v) if v is not None else ("error", "the reward function returned None (no reward for "
                                                                    "this completion)") for v in value]
        return outcomes, restarts

    def _assemble(self, outcomes, last: torch.Tensor, shape: torch.Size, restarts: int) -> RewardOutput:
        scores = torch.full((shape[0],), float(self.config.error_score), dtype=torch.float32)
        extras_per_sample: list[dict[str, Any]] = [{} for _ in outcomes]
        errors: list[tuple[int, str]] = []
        timeouts = 0
        for i, (status, value) in enumerate(outcomes):
            if status == "ok":
                try:
                    scores[i], extras_per_sample[i] = normalize_result(value)
                    continue
                except ValueError as err:
                    status, value = "error", str(err)
            timeouts += status == "timeout"
            errors.append((i, f"{status}: {value}"))
        if errors:
            first, message = errors[0]
            logger.warning(
                "reward: %d of %d samples failed (first: sample %d, %s)", len(errors), len(outcomes), first, message
            )
        token_level_scores = torch.zeros(shape, dtype=torch.float32)
        rows = torch.nonzero(last >= 0).squeeze(-1)
        token_level_scores[rows, last[rows]] = scores[rows]
        keys = sorted({k for extras in extras_per_sample for k in extras})
        metrics = {
            "reward/mean": float(scores.mean()) if len(scores) else 0.0,
            "reward/errors": float(len(errors) - timeouts),
            "reward/timeouts": float(timeouts),
            "reward/empty_responses": float((last < 0).sum()),
            "reward/worker_restarts": float(restarts),
        }
        return RewardOutput(
            token_level_scores=token_level_scores,
            scores=scores,
            extra_info={k: [extras.get(k) for extras in extras_per_sample] for k in keys},
            errors=errors,
            metrics=metrics,
        )


# Per-sample columns a scored sample carries when it is scored away from the batch it is
# trained in (trainer.mode one_step_off / async: the rollout pool scores each finished
# group; the training side reports the trained batch's reward metrics from them).
OUTCOME_ERROR, OUTCOME_TIMEOUT = "reward_error", "reward_timeout"


def sample_outcomes(out: RewardOutput) -> dict[str, np.ndarray]:
    """`out`'s failures (1.0 where a sample errored / timed out) and each reward template's
    weighted part (NaN where a sample has none), one float64 array per column."""
    n = len(out.scores)
    columns = {OUTCOME_ERROR: np.zeros(n), OUTCOME_TIMEOUT: np.zeros(n)}
    for i, message in out.errors:
        columns[OUTCOME_TIMEOUT if message.startswith("timeout:") else OUTCOME_ERROR][i] = 1.0
    for key, values in out.extra_info.items():
        if key.startswith(PART_PREFIXES):
            columns[key] = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    return columns


def outcome_metrics(batch: DataProto, worker_restarts: float, prefix: str = "") -> dict[str, float]:
    """The metrics `RewardManager.score` reports (but reward/mean), from the `sample_outcomes`
    columns of the samples of `batch` (stored under `prefix` + their names) and its
    multi-turn fields: the same numbers as scoring that batch at once."""
    non_tensors, response_mask = batch.non_tensor_batch, batch.batch["response_mask"]
    metrics = {
        "reward/errors": float(non_tensors[prefix + OUTCOME_ERROR].sum()),
        "reward/timeouts": float(non_tensors[prefix + OUTCOME_TIMEOUT].sum()),
        "reward/empty_responses": float((response_mask.sum(-1) == 0).sum()),
        "reward/worker_restarts": float(worker_restarts),
    }
    for key, values in non_tensors.items():
        if key.removeprefix(prefix).startswith(PART_PREFIXES):
            present = values[~np.isnan(values.astype(np.float64))].astype(np.float64)
            metrics[key.removeprefix(prefix)] = float(np.mean(present.tolist() or [0.0]))
    return {**metrics, **environment_metrics(batch)}


def add_environment_rewards(out: RewardOutput, data: DataProto, last: torch.Tensor) -> None:
    """Fold a multi-turn rollout's environment outcome into `out` (envs/agent/loop.py):
    a failed environment's `score_override` replaces the scorer's score, and the turn
    rewards in `env_rewards` (on each turn's last token) are added to the token scores."""
    nt = data.non_tensor_batch
    if "score_override" in nt:
        override = torch.tensor([float(v) for v in nt["score_override"]], dtype=torch.float32)
        rows = torch.nonzero(~torch.isnan(override) & (last >= 0)).squeeze(-1)
        out.scores[rows] = override[rows]
        out.token_level_scores[rows, last[rows]] = override[rows]
        out.metrics["reward/mean"] = float(out.scores.mean()) if len(out.scores) else 0.0
    if "env_rewards" in data.batch:
        out.token_level_scores += data.batch["env_rewards"].to(torch.float32)
    out.metrics.update(environment_metrics(data))


def environment_metrics(data: DataProto) -> dict[str, float]:
    """A multi-turn batch's reward/env_mean (its turn rewards) and agent/* statistics
    (turns, tool calls, parse rate, stop reasons); {} for a single-turn batch."""
    nt, metrics = data.non_tensor_batch, {}
    if "env_rewards" in data.batch:
        metrics["reward/env_mean"] = float(data.batch["env_rewards"].to(torch.float32).sum(-1).mean())
    for key in ("num_turns", "num_tool_calls"):
        if key in nt:
            metrics[f"agent/{key}_mean"] = float(np.mean([float(v) for v in nt[key]]))
    if "num_tool_calls" in nt:
        metrics["agent/tool_call_rate"] = float(np.mean([float(v) > 0 for v in nt["num_tool_calls"]]))
    if "num_malformed_calls" in nt:  # share of tool calls the environment could parse (1 with none)
        calls = sum(float(v) for v in nt["num_tool_calls"])
        metrics["agent/tool_calls_total"] = calls
        metrics["agent/tool_parse_rate"] = 1.0 - sum(float(v) for v in nt["num_malformed_calls"]) / max(calls, 1.0)
    if "agent_stop" in nt:
        for reason in sorted({str(v) for v in nt["agent_stop"]}):
            metrics[f"agent/stop_{reason}"] = float(np.mean([str(v) == reason for v in nt["agent_stop"]]))
    return metrics


def turn_spans(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of model tokens (1s) in a response_mask row."""
    spans, start = [], None
    for i, m in enumerate(mask_row.tolist() + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def add_turn_rewards(out: RewardOutput, data: DataProto, tokenizer: Any, specs: list[TemplateSpec]) -> None:
    """Score every model turn with the turn-level templates; each on its turn's last token."""
    nt, responses = data.non_tensor_batch, data.batch["responses"]
    total = 0.0
    for i, mask_row in enumerate(data.batch["response_mask"]):
        spans = turn_spans(mask_row)
        texts = tokenizer.batch_decode([responses[i, a:b].tolist() for a, b in spans], skip_special_tokens=True)
        row = {k: nt[k][i] for k in ("ground_truth", "data_source", "extra_info") if k in nt}
        for (_, end), reward in zip(spans, score_turns(specs, texts, row)):
            out.token_level_scores[i, end - 1] += reward
            total += reward
    out.metrics["reward/turn_templates_mean"] = total / max(1, len(responses))
