"""Partial rollouts: generation that stops between steps, takes new weights, and continues.

    stream = StreamingRollout(NativeRolloutEngine(...), slots=64, max_len=512)
    stream.add(prompts, SamplingParams(n=4, max_new_tokens=256, seed=7))
    stream.run(max_steps=32)                  # some prefill / decode iterations
    stream.load_weights(new_weights, version=1)   # in-flight sequences keep their tokens
    stream.run()                              # ...and continue under the new weights
    groups = stream.pop_finished()            # DataProtos of whole prompt groups
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from hybridflow.engines.rollout.batch_io import check_model_len, pack_output, sample_seed, stop_ids_for, unpad_prompts
from hybridflow.engines.rollout.engine import NativeRolloutEngine
from hybridflow.engines.rollout.kv_cache import KVCache
from hybridflow.engines.rollout.sampling import RowSettings, SamplingParams
from hybridflow.engines.rollout.scheduler import Request, Scheduler
from hybridflow.protocol import DataProto

POLICY_VERSION = "policy_version"


@dataclass
class _Call:
    """The prompts of one `add` and their requests (for packing finished groups)."""

    prompts: DataProto
    params: SamplingParams
    requests: list[list[Request]]  # per prompt row, its n samples
    popped: set[int] = field(default_factory=set)


@dataclass(eq=False)
class _Tracked(Request):
    """A request that also records the weight version of each of its tokens."""

    versions: list[int] = field(default_factory=list)


class StreamingRollout:
    """A native engine's scheduler kept alive across calls (see module docstring)."""

    def __init__(self, engine: NativeRolloutEngine, *, slots: int, max_len: int, version: int = 0) -> None:
        if not isinstance(engine, NativeRolloutEngine):
            raise TypeError(f"partial rollouts need the native engine (rollout.name=native), got {type(engine).__name__}")
        self.engine = engine
        self.version = version
        self.max_len = min(max_len, engine.max_len)
        s = engine.spec
        cache = KVCache(s.num_layers, slots, engine.model.n_kv, self.max_len, s.head_dim, engine.config.dtype,
                        engine.model.weights.norm.device)
        self.scheduler = Scheduler(engine.model, cache, slots=slots, max_len=self.max_len,
                                   log_prob_mode=engine.config.log_prob_mode,
                                   prefill_token_budget=engine.config.prefill_token_budget, tokenizer=engine.tokenizer)
        self.waiting: deque[_Tracked] = deque()
        self.live: list[_Tracked] = []
        self.calls: list[_Call] = []
        self._settings: RowSettings | None = None
        self._stale_cache = False
        self.recomputed_tokens = 0

    # ------------------------------------------------------------------ input
    def add(self, prompts: DataProto, params: SamplingParams) -> None:
        """Queue every prompt row for `params.n` samples (params.seed must be set: it makes
        each sample's random stream independent of when it is scheduled)."""
        if params.seed is None and not params.greedy:
            raise ValueError("StreamingRollout.add needs SamplingParams.seed (per-sample streams derive from it)")
        ids = unpad_prompts(prompts)
        check_model_len(ids, [params] * len(ids), self.max_len)
        stop = stop_ids_for(params, self.engine.spec.eos_token_ids)
        rows = []
        for row, prompt in enumerate(ids):
            samples = []
            for k in range(params.n):
                gen = None if params.greedy else torch.Generator().manual_seed(sample_seed([params.seed, row, k]))
                samples.append(_Tracked(row, k, prompt, params, stop, gen))
            rows.append(samples)
            self.waiting.extend(samples)
        self.calls.append(_Call(prompts, params, rows))

    @property
    def in_flight(self) -> int:
        """Requests not finished yet (waiting or live)."""
        return len(self.waiting) + len(self.live)

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        """New weights (full tensors, HF names) for every token sampled from now on; the live
        sequences' KV cache is recomputed before their next decode step."""
        self.engine.load_weights(weights)
        self.version = version
        self._stale_cache = bool(self.live)

    def _recompute_cache(self) -> None:
        seqs = [r.prompt + r.tokens[:-1] for r in self.live]
        src = torch.arange(len(seqs), device=self.engine.model.device)
        self.engine.model.prefill(seqs, self.scheduler.cache, 0, src)  # logits unused: the next token is known
        self.recomputed_tokens += sum(len(s) for s in seqs)
        self._stale_cache = False

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def run(self, max_steps: int | None = None) -> int:
        """Run scheduler iterations (one batched prefill or one decode step each) until every
        queued request finished or `max_steps` iterations ran; returns the iterations run."""
        sched, steps = self.scheduler, 0
        if self._stale_cache and self.live:
            self._recompute_cache()
        while (self.waiting or self.live) and (max_steps is None or steps < max_steps):
            if self.waiting and len(self.live) < sched.slots:
                take = min(sched.slots - len(self.live), len(self.waiting))
                admitted = [self.waiting.popleft() for _ in range(take)]
                self.live.extend(sched._prefill(admitted, first_slot=len(self.live)))
                self._settings = None
            else:
                if self._settings is None:
                    self._settings = RowSettings.build([r.params for r in self.live], sched.vocab, sched.device)
                sched._decode_step(self.live, self._settings)
            for r in self.live:
                r.versions.extend([self.version] * (len(r.tokens) - len(r.versions)))
            survivors = sched._compact(self.live)
            if len(survivors) != len(self.live):
                self._settings = None
            self.live = survivors
            steps += 1
        return steps

    # ------------------------------------------------------------------ output
    def pop_finished(self) -> list[DataProto]:
        """One DataProto per call with the prompt groups whose n samples all finished since
        the last pop (rows in prompt order, samples adjacent), with `policy_version`."""
        out = []
        for call in self.calls:
            rows = [row for row, samples in enumerate(call.requests)
                    if row not in call.popped and all(r.finish_reason is not None for r in samples)]
            if rows:
                out.append(self._pack(call, rows))
                call.popped.update(rows)
        self.calls = [c for c in self.calls if len(c.popped) < len(c.requests)]
        return out

    def _pack(self, call: _Call, rows: list[int]) -> DataProto:
        prompts = call.prompts[np.asarray(rows)] if len(rows) != len(call.requests) else call.prompts
        samples = [_Local(i, r) for i, row in enumerate(rows) for r in call.requests[row]]
        out = pack_output(prompts, samples, [call.params] * len(rows), self.engine.pad_id)
        versions = torch.full_like(out.batch["responses"], -1)
        for i, s in enumerate(samples):
            versions[i, : len(s.versions)] = torch.tensor(s.versions, dtype=versions.dtype)
        out.batch[POLICY_VERSION] = versions
        return out


class _Local:
    """A finished request seen with its row index inside the packed subset."""

    def __init__(self, row: int, request: _Tracked) -> None:
        self.prompt_row, self.tokens, self.log_probs = row, request.tokens, request.log_probs
        self.finish_reason, self.versions = request.finish_reason, request.versions


def split_groups(batch: DataProto) -> list[DataProto]:
    """The prompt groups of a generated batch (the samples of one `uid` are adjacent), in order."""
    uids = batch.non_tensor_batch["uid"]
    starts = [0] + [i for i in range(1, len(uids)) if uids[i] != uids[i - 1]] + [len(uids)]
    return [batch[a:b] for a, b in zip(starts[:-1], starts[1:])]


def oldest_version(group: DataProto) -> int:
    """The policy version of the oldest response token of `group` (padding, -1, is no token)."""
    return int(group.batch[POLICY_VERSION][group.batch["response_mask"].bool()].min())
