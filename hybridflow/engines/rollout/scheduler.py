"""Continuous batching: requests flow through a fixed set of KV-cache slots.

Live sequences always occupy slots 0..n-1. Each iteration either admits waiting requests
into free slots (one batched prefill, n samples of a prompt prefilled once) or runs one
decode step over the live slots. When sequences finish, survivors from the tail move into
the holes (one cache copy per move), so the next step decodes exactly the live rows: a
batch of mixed lengths never decodes padding, and a freed slot is refilled immediately.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hybridflow.engines.rollout.batch_io import hits_stop_string
from hybridflow.engines.rollout.kv_cache import KVCache
from hybridflow.engines.rollout.model import DecoderModel
from hybridflow.engines.rollout.sampling import RowSettings, SamplingParams, sample_tokens

_UNIFORM_BLOCK = 32


def agree_across_ranks(model: DecoderModel, tokens: torch.Tensor, log_probs: torch.Tensor):
    """Rank 0's sampled tokens and log-probs on every rank of the model's TP group (one broadcast)."""
    if model.tp_size == 1:
        return tokens, log_probs
    packed = torch.stack([tokens.to(torch.float64), log_probs.to(torch.float64)])
    dist.broadcast(packed, src=dist.get_global_rank(model.group, 0), group=model.group)
    return packed[0].to(torch.long), packed[1].to(torch.float32)


@dataclass
class Request:
    """One sequence to generate (one of the n samples of a prompt)."""

    prompt_row: int
    sample_index: int
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    _uniforms: list[float] = field(default_factory=list, repr=False)

    def next_uniform(self) -> float:
        """Next number of this request's own stream, drawn in blocks (one torch call per 32 steps)."""
        if not self._uniforms:
            block = torch.rand(_UNIFORM_BLOCK, generator=self.generator, dtype=torch.float64).tolist()
            self._uniforms = block[::-1]  # pop() from the end returns them in draw order
        return self._uniforms.pop()

    @property
    def written(self) -> int:
        """Positions already in the KV cache (the newest token is not yet fed back)."""
        return len(self.prompt) + len(self.tokens) - 1


@dataclass
class RunStats:
    """Counters of one generate call; `decode_row_steps` counts every row of every decode step."""

    requests: int = 0
    prompt_tokens: int = 0
    prefill_tokens_computed: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    decode_row_steps: int = 0
    prefill_calls: int = 0
    slot_moves: int = 0
    max_live: int = 0
    cache_bytes: int = 0
    readbacks: int = 0  # device loop: times the host read the sequences' state back


class Scheduler:
    """Runs a list of requests to completion on one model and cache."""

    def __init__(
        self,
        model: DecoderModel,
        cache: KVCache,
        *,
        slots: int,
        max_len: int,
        log_prob_mode: str,
        prefill_token_budget: int,
        tokenizer=None,
    ) -> None:
        self.model, self.cache, self.slots, self.max_len = model, cache, slots, max_len
        self.log_prob_mode = log_prob_mode
        self.prefill_token_budget = prefill_token_budget
        self.tokenizer = tokenizer
        self.stats = RunStats(cache_bytes=cache.nbytes())
        self.vocab = model.spec.vocab_size
        self.device = model.device

    # ----------------------------------------------------------------- main loop
    def run(self, requests: list[Request]) -> RunStats:
        self.stats.requests = len(requests)
        self.stats.prompt_tokens = sum(len(r.prompt) for r in requests)
        waiting = deque(requests)
        live: list[Request] = []
        settings: RowSettings | None = None
        while waiting or live:
            if waiting and len(live) < self.slots:
                admitted = [waiting.popleft() for _ in range(min(self.slots - len(live), len(waiting)))]
                live.extend(self._prefill(admitted, first_slot=len(live)))
                settings = None
            else:
                if settings is None:
                    settings = RowSettings.build([r.params for r in live], self.vocab, self.device)
                self._decode_step(live, settings)
            survivors = self._compact(live)
            if len(survivors) != len(live):
                settings = None
            live = survivors
        return self.stats

    # ----------------------------------------------------------------- prefill
    def _prefill(self, admitted: list[Request], first_slot: int) -> list[Request]:
        """Prefill admitted requests in length-sorted chunks; returns them in slot order.

        A chunk holds at most `prefill_token_budget` padded tokens; a prompt longer than
        that is prefilled alone, in pieces of that many tokens (`_prefill_long`).
        """
        groups: dict[int, list[Request]] = {}
        for r in admitted:
            groups.setdefault(r.prompt_row, []).append(r)
        order = sorted(groups, key=lambda row: len(groups[row][0].prompt))
        placed: list[Request] = []
        chunk: list[int] = []
        for row in order:
            longest = len(groups[row][0].prompt)  # sorted ascending: this one is the chunk's longest
            if chunk and (len(chunk) + 1) * longest > self.prefill_token_budget:
                placed += self._prefill_chunk([groups[g] for g in chunk], first_slot + len(placed))
                chunk = []
            if longest > self.prefill_token_budget:
                placed += self._prefill_long(groups[row], first_slot + len(placed))
                continue
            chunk.append(row)
        if chunk:
            placed += self._prefill_chunk([groups[g] for g in chunk], first_slot + len(placed))
        return placed

    def _prefill_chunk(self, groups: list[list[Request]], first_slot: int) -> list[Request]:
        prompts = [g[0].prompt for g in groups]
        src = torch.tensor([i for i, g in enumerate(groups) for _ in g], dtype=torch.long, device=self.device)
        logits = self.model.prefill(prompts, self.cache, first_slot, src)
        placed = [r for g in groups for r in g]
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens_computed += sum(len(p) for p in prompts)
        self._first_tokens(placed, logits.index_select(0, src), first_slot)
        return placed

    def _prefill_long(self, group: list[Request], slot: int) -> list[Request]:
        """One prompt longer than the budget: pieces of `prefill_token_budget` tokens, each
        attending to the cached ones before it; the n samples then copy the first slot."""
        prompt, piece = group[0].prompt, self.prefill_token_budget
        for start in range(0, len(prompt), piece):
            logits = self.model.extend([prompt[start : start + piece]], [start], [slot], self.cache)
            self.stats.prefill_calls += 1
        self.stats.prefill_tokens_computed += len(prompt)
        for k in range(1, len(group)):
            self.cache.move_slot(slot, slot + k, len(prompt))
        self._first_tokens(group, logits.expand(len(group), -1), slot)
        return group

    def _first_tokens(self, placed: list[Request], logits: torch.Tensor, first_slot: int) -> None:
        """Sample each placed request's first token from its prompt's last logits."""
        settings = RowSettings.build([r.params for r in placed], self.vocab, self.device)
        self._sample_and_append(placed, logits, settings)

    # ----------------------------------------------------------------- decode
    def _decode_step(self, live: list[Request], settings: RowSettings) -> None:
        tokens = torch.tensor([r.tokens[-1] for r in live], dtype=torch.long, device=self.device)
        pos_list = [r.written for r in live]
        positions = torch.tensor(pos_list, dtype=torch.long, device=self.device)
        logits = self.model.decode(tokens, positions, self.cache, kv_len=max(pos_list) + 1)
        self.stats.decode_steps += 1
        self.stats.decode_row_steps += len(live)
        self.stats.max_live = max(self.stats.max_live, len(live))
        self._sample_and_append(live, logits, settings)

    def _sample_and_append(self, rows: list[Request], logits: torch.Tensor, settings: RowSettings) -> None:
        uniforms = None
        if not settings.all_greedy:
            # One draw per sampling row from its own generator: a request's randomness does
            # not depend on which other requests share the batch or which slot it sits in.
            draws = [0.0 if r.generator is None else r.next_uniform() for r in rows]
            uniforms = torch.tensor(draws, dtype=torch.float64, device=self.device)
        tokens, log_probs = sample_tokens(logits, settings, uniforms, self.log_prob_mode)
        tokens, log_probs = agree_across_ranks(self.model, tokens, log_probs)
        for r, tok, lp in zip(rows, tokens.tolist(), log_probs.tolist()):
            r.tokens.append(int(tok))
            r.log_probs.append(lp)
            r.finish_reason = self._finish_reason(r)
        self.stats.generated_tokens += len(rows)

    def _finish_reason(self, r: Request) -> str | None:
        if r.tokens[-1] in r.stop_ids:
            return "stop"
        if r.params.stop and hits_stop_string(self.tokenizer, r.tokens, r.params.stop):
            return "stop"
        if len(r.tokens) >= r.params.max_new_tokens or len(r.prompt) + len(r.tokens) >= self.max_len:
            return "length"
        return None

    # ----------------------------------------------------------------- slots
    def _compact(self, live: list[Request]) -> list[Request]:
        """Drop finished rows; move tail survivors into holes so live slots stay 0..n-1."""
        survivors, moves = compaction(live)
        for src, hole in moves:
            self.cache.move_slot(src, hole, live[src].written)
        self.stats.slot_moves += len(moves)
        return survivors


def compaction(live: list[Request]) -> tuple[list[Request], list[tuple[int, int]]]:
    """The live rows once finished ones leave, and the (source slot, hole) moves that keep
    them in slots 0..n-1: survivors from the tail fill the holes in front."""
    n = sum(r.finish_reason is None for r in live)
    if n == len(live):
        return live, []
    holes = [i for i in range(n) if live[i].finish_reason is not None]
    movers = [i for i in range(n, len(live)) if live[i].finish_reason is None]
    compacted = list(live[:n])
    for hole, src in zip(holes, movers):
        compacted[hole] = live[src]
    return compacted, list(zip(movers, holes))
