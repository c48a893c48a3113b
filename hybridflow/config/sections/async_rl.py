"""Settings of the asynchronous trainer modes (`trainer.mode` one_step_off / async, docs/async.md)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridflow.config.loader import at_least, positive
from hybridflow.errors import ConfigError

if TYPE_CHECKING:
    from hybridflow.config.schema import RunConfig


@dataclass
class AsyncSection:
    """See the module docstring."""

    rollout_ranks: int = 1
    max_staleness: int = 1
    buffer_size: int = 64
    chunk_prompts: int | None = None
    steps_per_call: int | None = 16
    bucket_mb: float = 64.0

    def __post_init__(self) -> None:
        at_least(self, 1, "rollout_ranks", "buffer_size")
        at_least(self, 0, "max_staleness", note="0: on-policy")
        at_least(self, 1, "chunk_prompts", "steps_per_call", null="")
        positive(self, "bucket_mb")

    def of_mode(self, mode: str) -> AsyncSection:
        """The settings trainer.mode `mode` runs with: one_step_off's own (module docstring) in place of these."""
        if mode != "one_step_off":
            return self
        return dataclasses.replace(self, max_staleness=1, chunk_prompts=None, steps_per_call=None)

    def chunk(self, train_batch_size: int) -> int:
        return train_batch_size if self.chunk_prompts is None else self.chunk_prompts

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * (1 << 20))


def check_async_settings(cfg: RunConfig) -> None:
    """Cross-section rules of the asynchronous modes (sync reads none of the section); a
    setting the run's mode would not read (`_check_unread`) is refused."""
    mode, a = cfg.trainer.mode, cfg.async_rl.of_mode(cfg.trainer.mode)
    if mode == "sync":
        return
    _check_unread(cfg)
    _check_capabilities(cfg)
    tp = cfg.rollout.tensor_model_parallel_size
    if a.rollout_ranks % tp:
        raise ConfigError(f"{a.rollout_ranks} is not a multiple of rollout.tensor_model_parallel_size={tp}",
                          "async_rl.rollout_ranks")
    groups, batch = a.rollout_ranks // tp, cfg.data.train_batch_size
    chunk = a.chunk(batch)
    if chunk % groups:
        raise ConfigError(f"{chunk} prompts per generation call cannot be shared by the {groups} generation groups "
                          "of the rollout pool; make it a multiple", "async_rl.chunk_prompts")
    if a.buffer_size < batch:
        raise ConfigError(f"{a.buffer_size} groups cannot hold one step's data.train_batch_size={batch} groups",
                          "async_rl.buffer_size")
    # Admission control (modes/async_trainer.py) sends a call only if it fits beside the groups not
    # trained yet, and up to a batch less gcd(chunk, batch) of them can wait for the rest of a batch.
    waiting, room = batch - math.gcd(chunk, batch), min((a.max_staleness + 1) * batch, a.buffer_size)
    if waiting + chunk > room:
        raise ConfigError(f"{chunk} prompts per generation call would stall the trainer: beside {waiting} groups "
                          f"waiting for a batch a call must fit in {room} groups (async_rl.buffer_size, and "
                          f"max_staleness + 1 batches of data.train_batch_size={batch}); use a divisor of {batch}, "
                          "or raise async_rl.max_staleness or async_rl.buffer_size", "async_rl.chunk_prompts")


def _check_unread(cfg: RunConfig) -> None:
    """A setting away from its default that an asynchronous run would ignore: those
    one_step_off fixes (module docstring), steps_per_call where generation calls are whole."""
    a, mode, default, r = cfg.async_rl, cfg.trainer.mode, AsyncSection(), cfg.rollout
    runs_with = a.of_mode(mode)  # what the mode reads of `a`
    for f in dataclasses.fields(AsyncSection) if mode == "one_step_off" else ():
        value = getattr(a, f.name)
        if value not in (getattr(default, f.name), getattr(runs_with, f.name)):
            raise ConfigError(f"{value} is read only by trainer.mode=async: one_step_off trains each batch one "
                              "version stale, generated whole; remove it or set trainer.mode=async",
                              f"async_rl.{f.name}")
    if mode == "async" and a.steps_per_call not in (None, default.steps_per_call) and (
            r.name != "native" or r.agent.enable):
        why = "rollout.agent.enable=true" if r.agent.enable else f"rollout.name={r.name}"
        raise ConfigError(f"{a.steps_per_call} pauses generation calls for partial rollouts, which need the native "
                          f"engine's scheduler; with {why} each call generates whole: remove it",
                          "async_rl.steps_per_call")


def _check_capabilities(cfg: RunConfig) -> None:
    """The asynchronous modes run every registered program (trainer/modes/stream_step.py); of the
    capabilities its row declares, two are served on the rollout pool with the rule-based
    scores there (greedy_baseline: the baseline's score; dynamic_sampling: the filter on
    the stream), so a reward model, which scores on the training pool later, cannot take part."""
    alg, mode = cfg.algorithm, cfg.trainer.mode
    if alg.exploration.enabled:
        raise ConfigError(f"samples prompts again within a step, which {mode} does not serve (its rollout pool "
                          "generates each group once): set it to 0 or use trainer.mode=sync",
                          "algorithm.exploration.max_extra_groups")
    if cfg.reward_model.path is None:
        return
    if alg.spec.greedy_baseline:
        raise ConfigError(f"{mode} serves the greedy_baseline capability (algorithm.name={alg.name}) on the rollout "
                          "pool with the rule-based reward, and reward_model.path scores on the training pool: drop "
                          "reward_model.path or use trainer.mode=sync", "trainer.mode")
    if alg.spec.dynamic_sampling and alg.settings.filter_groups.enable:
        raise ConfigError(f"{mode} serves the dynamic_sampling capability (algorithm.name={alg.name}) by filtering "
                          "groups on the rollout pool by their rule-based scores, and reward_model.path scores on "
                          "the training pool, after the filter: drop reward_model.path, set "
                          f"algorithm.{alg.spec.settings}.filter_groups.enable=false, or use trainer.mode=sync",
                          f"algorithm.{alg.spec.settings}.filter_groups.enable")
