"""Decode without the host: fixed-shape decode steps, sampling and stops on the device.

`DeviceLoopScheduler` runs the requests of `Scheduler` (continuous batching, n samples
sharing one prefill, compaction) but keeps each live sequence's state in device tensors
indexed by slot (`SlotState`): the token to feed and its position, the tokens and log-probs
so far, a finished flag, the row's sampling settings and its uniforms, drawn up front from
the request's own generator (so a row samples what the per-token loop samples, whatever
shares its batch). A step decodes slots 0..B-1, B the live count rounded up to a bucket
(`bucket_of`; the padding rows are marked finished and ignored), and detects stop ids and
budgets on the device; `DeviceSteps` runs it eagerly, compiled, or as a replayed CUDA graph
per (bucket, KV length, sampling paths). The host reads the state back every
`readback_every` steps (sooner when a budget ends and requests wait) to finish rows, check
stop strings, compact and admit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from hybridflow.engines.rollout.batch_io import hits_stop_string
from hybridflow.engines.rollout.kv_cache import KVCache
from hybridflow.engines.rollout.model import DecoderModel
from hybridflow.engines.rollout.sampling import RowSettings, row_columns, row_flags, sample_tokens
from hybridflow.engines.rollout.scheduler import Request, RunStats, Scheduler, agree_across_ranks, compaction

# Live counts are padded up to these buckets: powers of two to 32, then multiples of 32
# (at most 31 padding rows once 32 are live, and few distinct shapes to capture).
_SMALL_BUCKETS = (1, 2, 4, 8, 16, 32)
_BUCKET_STEP = 32
# Fixed-shape steps read the KV cache up to a multiple of this many positions.
KV_BLOCK = 256


def bucket_of(live: int, slots: int) -> int:
    """The padded batch size of a step over `live` rows (never more than `slots`)."""
    bucket = next((b for b in _SMALL_BUCKETS if b >= live), -(-live // _BUCKET_STEP) * _BUCKET_STEP)
    return min(bucket, slots)


@dataclass
class SlotState:
    """Per-slot device state of the live sequences (row i = cache slot i)."""

    last: torch.Tensor  # [S] int64: the token the next step feeds
    pos: torch.Tensor  # [S] int64: the position it is written at
    n_gen: torch.Tensor  # [S] int64: tokens generated so far
    done: torch.Tensor  # [S] bool: finished (stop id or budget), or a padding row
    budget: torch.Tensor  # [S] int64: max_new_tokens, capped by the model length
    stop: torch.Tensor  # [S, K] int64: stop ids, -1 padded
    uniforms: torch.Tensor  # [S, W] float64: the row's uniform for its j-th token
    tokens: torch.Tensor  # [S, W+1] int64: generated tokens; column W takes finished rows' writes
    log_probs: torch.Tensor  # [S, W+1] float32
    temperature: torch.Tensor  # [S, 1] float32 (RowSettings' columns)
    top_k: torch.Tensor  # [S, 1] int64
    top_p: torch.Tensor  # [S, 1] float32
    greedy: torch.Tensor  # [S] bool
    truncating: torch.Tensor  # [S] bool

    @classmethod
    def allocate(cls, slots: int, width: int, stops: int, device: torch.device) -> "SlotState":
        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            last=zeros(slots), pos=zeros(slots), n_gen=zeros(slots), done=torch.ones(slots, dtype=torch.bool,
                                                                                       device=device),
            budget=zeros(slots), stop=torch.full((slots, stops), -1, dtype=torch.int64, device=device),
            uniforms=zeros(slots, width, dtype=torch.float64), tokens=zeros(slots, width + 1),
            log_probs=zeros(slots, width + 1, dtype=torch.float32),
            temperature=torch.ones(slots, 1, device=device), top_k=zeros(slots, 1), top_p=torch.ones(slots, 1,
                                                                                                      device=device),
            greedy=torch.zeros(slots, dtype=torch.bool, device=device),
            truncating=torch.zeros(slots, dtype=torch.bool, device=device),
        )

    @property
    def width(self) -> int:
        return self.uniforms.shape[1]

    def fits(self, slots: int, width: int, stops: int, device: torch.device) -> bool:
        return (self.last.shape[0] >= slots and self.width >= width and self.stop.shape[1] >= stops
                and self.last.device == device)

    def move(self, src: list[int], dst: list[int]) -> None:
        """Copy the rows `src` onto the rows `dst` (compaction), one indexed copy per field."""
        device = self.last.device
        src_t, dst_t = (torch.tensor(x, dtype=torch.long, device=device) for x in (src, dst))
        for f in fields(self):
            t = getattr(self, f.name)
            t.index_copy_(0, dst_t, t.index_select(0, src_t))

    def admit(self, first: int, requests: list[Request], vocab: int, max_len: int) -> None:
        """Write freshly admitted requests into rows first.. (one host-to-device copy per field).

        `pos` is the last prompt position: recording the first token advances it to the
        position that token is fed at.
        """
        rows = slice(first, first + len(requests))
        temps, ks, ps, greedy, truncating = row_columns([r.params for r in requests], vocab)
        stops = [sorted(r.stop_ids) for r in requests]
        stop = torch.full((len(requests), self.stop.shape[1]), -1, dtype=torch.int64)
        for i, ids in enumerate(stops):
            stop[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        uniforms = torch.zeros(len(requests), self.width, dtype=torch.float64)
        for i, r in enumerate(requests):
            if r.generator is not None:  # the per-token loop draws one per token, in this order
                uniforms[i, : r.params.max_new_tokens] = torch.tensor(
                    [r.next_uniform() for _ in range(r.params.max_new_tokens)], dtype=torch.float64)
        values = {
            "pos": [len(r.prompt) - 1 for r in requests], "n_gen": [0] * len(requests),
            "done": [False] * len(requests),
            "budget": [min(r.params.max_new_tokens, max_len - len(r.prompt)) for r in requests],
            "temperature": [[t] for t in temps], "top_k": [[k] for k in ks], "top_p": [[p] for p in ps],
            "greedy": greedy, "truncating": truncating,
        }
        for name, value in values.items():
            target = getattr(self, name)
            target[rows].copy_(torch.tensor(value, dtype=target.dtype), non_blocking=True)
        self.stop[rows].copy_(stop, non_blocking=True)
        self.uniforms[rows].copy_(uniforms, non_blocking=True)

    def record(self, rows: int, tokens: torch.Tensor, log_probs: torch.Tensor) -> None:
        """Append sampled tokens to rows 0..rows-1 that are not finished; finish rows on a stop
        id or at their budget. Only device ops: no value comes back to the host."""
        live = ~self.done[:rows]
        col = torch.where(live, self.n_gen[:rows], self.width).unsqueeze(1)
        self.tokens[:rows].scatter_(1, col, tokens.unsqueeze(1))
        self.log_probs[:rows].scatter_(1, col, log_probs.unsqueeze(1))
        step = live.long()
        n_gen = self.n_gen[:rows].add_(step)
        stopped = (tokens.unsqueeze(1) == self.stop[:rows]).any(1)
        self.done[:rows].logical_or_(live & (stopped | (n_gen >= self.budget[:rows])))
        self.pos[:rows].add_(step)
        self.last[:rows].copy_(torch.where(live, tokens, self.last[:rows]))

    def settings(self, rows: int, flags: dict) -> RowSettings:
        return RowSettings(temperature=self.temperature[:rows], top_k=self.top_k[:rows], top_p=self.top_p[:rows],
                           greedy=self.greedy[:rows], truncating=self.truncating[:rows], **flags)

    def current_uniforms(self, rows: int) -> torch.Tensor:
        col = self.n_gen[:rows].clamp(max=self.width - 1).unsqueeze(1)
        return self.uniforms[:rows].gather(1, col).squeeze(1)


def sample_into(model: DecoderModel, state: SlotState, rows: int, logits: torch.Tensor, flags: dict,
                log_prob_mode: str) -> None:
    """Sample rows 0..rows-1 from `logits` on the device and record them in `state`."""
    settings = state.settings(rows, flags)
    uniforms = None if settings.all_greedy else state.current_uniforms(rows)
    tokens, log_probs = sample_tokens(logits, settings, uniforms, log_prob_mode, host_sync=False)
    tokens, log_probs = agree_across_ranks(model, tokens, log_probs)
    state.record(rows, tokens, log_probs)


class DeviceSteps:
    """Runs fixed-shape decode steps over a `SlotState`: eagerly, under torch.compile, or
    (CUDA only) as CUDA graphs captured once per (bucket, KV length, sampling flags).

    A graph records the step's kernels on the state's, the cache's and the weights'
    addresses: it stays valid while those tensors live (`reset` drops the graphs).
    """

    def __init__(self, model: DecoderModel, log_prob_mode: str, *, cuda_graphs: bool, compile_step: bool) -> None:
        self.model, self.log_prob_mode = model, log_prob_mode
        self.cuda_graphs = cuda_graphs
        self.static_shapes = cuda_graphs or compile_step
        self.compiled = compile_step
        self._step: Callable = torch.compile(self._eager_step, dynamic=False) if compile_step else self._eager_step
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._bound: tuple[SlotState, KVCache] | None = None
        self.captures = 0

    def reset(self) -> None:
        """Drop the captured graphs (before the tensors they read are freed or replaced)."""
        self._graphs.clear()
        self._pool = None
        self._bound = None

    def kv_len(self, needed: int, cache_len: int) -> int:
        """KV positions a step reads: exactly `needed` eagerly, a multiple of KV_BLOCK when
        shapes must repeat (graphs, compile)."""
        if not self.static_shapes:
            return needed
        return min(cache_len, -(-needed // KV_BLOCK) * KV_BLOCK)

    def _eager_step(self, state: SlotState, cache: KVCache, rows: int, kv_len: int, flags: dict) -> None:
        logits = self.model.decode_step(state.last[:rows], state.pos[:rows], cache, kv_len)
        sample_into(self.model, state, rows, logits, flags, self.log_prob_mode)

    def run(self, state: SlotState, cache: KVCache, rows: int, kv_len: int, flags: dict) -> None:
        """One decode step over rows 0..rows-1 reading `kv_len` cache positions."""
        # torch.compile cannot trace code that enters inference mode: no_grad there
        with torch.no_grad() if self.compiled else torch.inference_mode():
            if self.cuda_graphs:
                self._graph_step(state, cache, rows, kv_len, flags)
            else:
                self._step(state, cache, rows, kv_len, flags)

    def _graph_step(self, state: SlotState, cache: KVCache, rows: int, kv_len: int, flags: dict) -> None:
        if self._bound is None or self._bound[0] is not state or self._bound[1] is not cache:
            self.reset()  # graphs read the addresses of the tensors they were captured on
            self._bound = (state, cache)
        key = (rows, kv_len, tuple(sorted(flags.items())))
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        # First use of this shape: run the step for real on a side stream (the warm-up a
        # capture needs: library handles, kernel choice), then record it without running it.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(state, cache, rows, kv_len, flags)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._step(state, cache, rows, kv_len, flags)
        self._pool = graph.pool()
        self._graphs[key] = graph
        self.captures += 1


class DeviceLoopScheduler(Scheduler):
    """`Scheduler` with the decode loop on the device (module docstring)."""

    def __init__(self, model: DecoderModel, cache: KVCache, state: SlotState, steps: DeviceSteps, *, slots: int,
                 max_len: int, log_prob_mode: str, prefill_token_budget: int, readback_every: int,
                 tokenizer=None) -> None:
        super().__init__(model, cache, slots=slots, max_len=max_len, log_prob_mode=log_prob_mode,
                         prefill_token_budget=prefill_token_budget, tokenizer=tokenizer)
        self.state, self.steps, self.readback_every = state, steps, readback_every
        self._seen: dict[int, int] = {}  # id(request) -> tokens it had at the last readback (0: none yet)

    # ----------------------------------------------------------------- main loop
    def run(self, requests: list[Request]) -> RunStats:
        self.stats.requests = len(requests)
        self.stats.prompt_tokens = sum(len(r.prompt) for r in requests)
        waiting = deque(requests)
        live: list[Request] = []
        while waiting or live:
            if waiting and len(live) < self.slots:
                admitted = [waiting.popleft() for _ in range(min(self.slots - len(live), len(waiting)))]
                live.extend(self._prefill(admitted, first_slot=len(live)))
            self._decode_steps(live, self._steps_before_readback(live, bool(waiting)))
            live = self._readback(live)
        return self.stats

    def _steps_before_readback(self, live: list[Request], waiting: bool) -> int:
        """Steps until the next readback: `readback_every`, fewer when every row (or, with
        requests waiting for a slot, the first row) reaches its budget sooner."""
        left = [self._budget(r) - self._progress(r) for r in live]
        return max(0, min(self.readback_every, min(left) if waiting else max(left)))

    def _budget(self, r: Request) -> int:
        return min(r.params.max_new_tokens, self.max_len - len(r.prompt))

    def _progress(self, r: Request) -> int:
        """Tokens `r` had at the last readback (at least the one its prefill sampled)."""
        return max(self._seen[id(r)], 1)

    def _decode_steps(self, live: list[Request], count: int) -> None:
        n = len(live)
        rows = bucket_of(n, self.slots)
        self.state.done[n:rows].fill_(True)  # padding rows: computed, never recorded
        flags = row_flags([r.params for r in live], self.vocab)
        longest = max(len(r.prompt) + self._progress(r) for r in live)  # cache positions after one step
        for i in range(count):
            kv_len = self.steps.kv_len(min(longest + i, self.cache.max_len), self.cache.max_len)
            self.steps.run(self.state, self.cache, rows, kv_len, flags)
        self.stats.decode_steps += count
        self.stats.decode_row_steps += count * rows
        self.stats.max_live = max(self.stats.max_live, n)

    # ----------------------------------------------------------------- prefill
    def _first_tokens(self, placed: list[Request], logits: torch.Tensor, first_slot: int) -> None:
        """Admit the placed rows into the state and sample their first token on the device."""
        self.state.admit(first_slot, placed, self.vocab, self.max_len)
        if first_slot:  # sample_into works on rows 0..m-1: view the state from first_slot on
            state = SlotState(**{f.name: getattr(self.state, f.name)[first_slot:] for f in fields(self.state)})
        else:
            state = self.state
        sample_into(self.model, state, len(placed), logits, row_flags([r.params for r in placed], self.vocab),
                    self.log_prob_mode)
        for r in placed:
            self._seen[id(r)] = 0

    # ----------------------------------------------------------------- readback
    def _readback(self, live: list[Request]) -> list[Request]:
        """Read the live rows' state in one transfer; finish rows, compact, return survivors."""
        n = len(live)
        st = self.state
        packed = torch.cat([st.n_gen[:n, None].double(), st.done[:n, None].double(), st.tokens[:n].double(),
                            st.log_probs[:n].double()], dim=1).cpu()
        self.stats.readbacks += 1
        width = st.width + 1
        n_gen, done = packed[:, 0].long().tolist(), packed[:, 1].bool().tolist()
        tokens, log_probs = packed[:, 2 : 2 + width].long(), packed[:, 2 + width :].float()
        for i, r in enumerate(live):
            before, now = self._seen[id(r)], n_gen[i]
            self._seen[id(r)] = now
            end = self._stop_string_end(r, tokens[i], before, now)
            if end is None and not done[i]:
                continue
            end = now if end is None else end
            r.tokens, r.log_probs = tokens[i, :end].tolist(), log_probs[i, :end].tolist()
            r.finish_reason = self._finish_reason(r)
            self.stats.generated_tokens += end
        survivors, moves = compaction(live)
        if moves:
            src, dst = [m[0] for m in moves], [m[1] for m in moves]
            written = max(len(live[i].prompt) + self._seen[id(live[i])] - 1 for i in src)
            self.cache.move_slots(src, dst, written)
            self.state.move(src, dst)
            self.stats.slot_moves += len(moves)
        for r in live:
            if r.finish_reason is not None:
                del self._seen[id(r)]
        return survivors

    def _stop_string_end(self, r: Request, tokens: torch.Tensor, before: int, now: int) -> int | None:
        """Length of `r`'s response if a stop string ends it among tokens before..now-1."""
        if not r.params.stop:
            return None
        ids = tokens[:now].tolist()
        for j in range(before, now):
            if ids[j] not in r.stop_ids and hits_stop_string(self.tokenizer, ids[: j + 1], r.params.stop):
                return j + 1
        return None
