"""Multi-turn generation on the native engine: sequences that pause and continue from their KV cache.

    turns = TurnEngine(engine, slots=64)
    turns.open("a", prompt_ids, SamplingParams(max_new_tokens=32, seed=0))
    while turns.busy:
        for done in turns.step():        # TurnOutput: a sequence whose turn ended
            turns.extend(done.key, observation_ids, max_new_tokens=32)   # or turns.close(key)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from hybridflow.engines.rollout.batch_io import hits_stop_string, sample_seed, stop_ids_for
from hybridflow.engines.rollout.kv_cache import KVCache
from hybridflow.engines.rollout.sampling import RowSettings, SamplingParams, sample_tokens
from hybridflow.engines.rollout.scheduler import Request, agree_across_ranks


@dataclass
class TurnOutput:
    """One finished turn: its tokens (the stop token included), their log-probs, why it ended."""

    key: Hashable
    tokens: list[int]
    log_probs: list[float]
    finish_reason: str  # "stop" or "length"


@dataclass
class _Sequence:
    key: Hashable
    request: Request  # its generator and uniform stream; request.tokens holds the current turn
    context: list[int]  # every token of the sequence so far (prompt, turns, observations)
    written: int = 0  # positions already in the KV cache
    slot: int = -1
    pending: list[int] = field(default_factory=list)  # tokens to prefill before the next sample
    turn_budget: int = 0


class TurnEngine:
    """Slot-stable continuous batching with pause / extend on a `NativeRolloutEngine`."""

    def __init__(self, engine, slots: int, max_len: int | None = None) -> None:
        self.engine, self.model = engine, engine.model
        self.eos_token_ids = tuple(self.model.spec.eos_token_ids)
        self.max_len = min(max_len or engine.max_len, engine.max_len)
        self.cache = KVCache(self.model.spec.num_layers, slots, self.model.n_kv, self.max_len,
                             self.model.spec.head_dim, engine.config.dtype, self.model.weights.norm.device)
        self.free = list(range(slots))[::-1]
        self.waiting: deque[_Sequence] = deque()  # opened, no slot yet
        self.prefill: list[_Sequence] = []  # in a slot, with pending tokens
        self.generating: list[_Sequence] = []
        self.paused: dict[Hashable, _Sequence] = {}
        self.stats = {"prefill_calls": 0, "prefill_tokens": 0, "decode_steps": 0, "decode_rows": 0,
                      "generated_tokens": 0}

    # ----------------------------------------------------------------- public
    @property
    def busy(self) -> bool:
        """Whether a `step` would do work (something waits for a slot, a prefill or a decode)."""
        return bool(self.prefill or self.generating or (self.waiting and self.free))

    def open(self, key: Hashable, prompt: list[int], params: SamplingParams, row: int = 0, sample: int = 0) -> None:
        """Start a sequence; its first turn may use up to params.max_new_tokens tokens."""
        if not prompt:
            raise ValueError(f"sequence {key!r}: empty prompt")
        stop_ids = stop_ids_for(params, self.model.spec.eos_token_ids)
        gen = None if params.greedy else torch.Generator().manual_seed(
            sample_seed([params.seed if params.seed is not None else 0, row, sample]))
        seq = _Sequence(key, Request(row, sample, [], params, stop_ids, gen), [], pending=list(prompt))
        seq.turn_budget = params.max_new_tokens
        self.waiting.append(seq)

    def extend(self, key: Hashable, tokens: list[int], max_new_tokens: int) -> None:
        """Append `tokens` to the paused sequence `key` and let it generate a new turn."""
        seq = self.paused.pop(key)
        if max_new_tokens < 1:
            raise ValueError(f"sequence {key!r}: max_new_tokens must be >= 1, got {max_new_tokens}")
        # The turn's last sampled token was never fed back: it goes first.
        seq.pending = seq.context[seq.written:] + list(tokens)
        seq.context = seq.context[: seq.written]
        seq.turn_budget = max_new_tokens
        if seq.written + len(seq.pending) + 1 > self.max_len:
            self.paused[key] = seq
            raise ValueError(f"sequence {key!r} would exceed max_len={self.max_len}")
        self.prefill.append(seq)

    def close(self, key: Hashable) -> list[int]:
        """Release a paused sequence's slot; returns all its tokens."""
        seq = self.paused.pop(key)
        self.free.append(seq.slot)
        return seq.context

    def room(self, key: Hashable) -> int:
        """Positions left for the paused sequence `key` (observation plus next turn)."""
        return self.max_len - len(self.paused[key].context)

    def step(self) -> list[TurnOutput]:
        """Prefill pending chunks if any, else one decode step; returns the turns that ended."""
        while self.waiting and self.free:
            seq = self.waiting.popleft()
            seq.slot = self.free.pop()
            self.prefill.append(seq)
        was_prefill = bool(self.prefill)
        if was_prefill:
            rows, self.prefill = self.prefill, []
            chunks = [s.pending for s in rows]
            logits = self.model.extend(chunks, [s.written for s in rows], [s.slot for s in rows], self.cache)
            for s in rows:
                s.context.extend(s.pending)
                s.written += len(s.pending)
                s.pending = []
                s.request.tokens, s.request.log_probs = [], []
            self.stats["prefill_calls"] += 1
            self.stats["prefill_tokens"] += sum(len(c) for c in chunks)
        elif self.generating:
            rows = self.generating
            tokens = [[s.context[-1]] for s in rows]
            logits = self.model.extend(tokens, [s.written for s in rows], [s.slot for s in rows], self.cache)
            for s in rows:
                s.written += 1
            self.stats["decode_steps"] += 1
            self.stats["decode_rows"] += len(rows)
        else:
            return []
        finished = self._sample(rows, logits)
        ended = {id(s) for s in finished}
        going = [s for s in rows if id(s) not in ended]
        # after a prefill the new rows join the decoding ones; after a decode they are all of them
        self.generating = self.generating + going if was_prefill else going
        out = []
        for s in finished:
            self.paused[s.key] = s
            r = s.request
            out.append(TurnOutput(s.key, list(r.tokens), list(r.log_probs), r.finish_reason))
        return out

    # ----------------------------------------------------------------- helpers
    def _sample(self, rows: list[_Sequence], logits: torch.Tensor) -> list[_Sequence]:
        params = [s.request.params for s in rows]
        settings = RowSettings.build(params, self.model.spec.vocab_size, self.model.device)
        uniforms = None
        if not settings.all_greedy:
            draws = [0.0 if s.request.generator is None else s.request.next_uniform() for s in rows]
            uniforms = torch.tensor(draws, dtype=torch.float64, device=self.model.device)
        tokens, log_probs = sample_tokens(logits, settings, uniforms, self.engine.config.log_prob_mode)
        tokens, log_probs = agree_across_ranks(self.model, tokens, log_probs)
        finished = []
        for s, tok, lp in zip(rows, tokens.tolist(), log_probs.tolist()):
            r = s.request
            r.tokens.append(int(tok))
            r.log_probs.append(lp)
            s.context.append(int(tok))
            self.stats["generated_tokens"] += 1
            r.finish_reason = self._finish_reason(s)
            if r.finish_reason is not None:
                finished.append(s)
        return finished

    def _finish_reason(self, s: _Sequence) -> str | None:
        r = s.request
        if r.tokens[-1] in r.stop_ids:
            return "stop"
        if r.params.stop and hits_stop_string(self.engine.tokenizer, r.tokens, r.params.stop):
            return "stop"
        if len(r.tokens) >= s.turn_budget or len(s.context) >= self.max_len:
            return "length"
        return None
