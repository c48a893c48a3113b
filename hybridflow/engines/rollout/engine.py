"""hybridflow's own generation engine: `NativeRolloutEngine`, a `RolloutEngine`.

    engine = NativeRolloutEngine.from_pretrained(model_dir, RolloutConfig(dtype="auto"))
    out = engine.generate(batch, SamplingParams(temperature=1.0, max_new_tokens=256, n=4))

Input DataProto: `input_ids`, `attention_mask` (LEFT-padded prompts), optional
`position_ids`; non-tensor arrays are passed through (repeated for n > 1).
Output DataProto, one row per sample, samples of one prompt adjacent (like
`DataProto.repeat(n, interleave=True)`):
- `prompts` [N, P]: the input ids; `responses` [N, R]: right-padded with the pad id, R =
  the largest max_new_tokens of the call; `response_mask` [N, R];
- `input_ids`, `attention_mask`, `position_ids` [N, P+R]: prompt followed by response,
  response positions continuing from the prompt's last position;
- `rollout_log_probs` [N, R] fp32 (0 on padding): see sampling.py for which distribution;
- non-tensor `finish_reason`: "stop" (stop id, eos, or stop string) or "length".
The stop token / completing token is kept in the response.

Randomness: every sample owns a generator seeded from (seed, prompt row, sample index)
when SamplingParams.seed is set, else from (config.seed, call number, row, sample). Results
therefore do not depend on batch composition, slot count or tensor-parallel size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hybridflow.engines.models import load_hf_config
from hybridflow.engines.precision import resolve_dtype
from hybridflow.engines.rollout.gemm import resolve_matmul
from hybridflow.engines.rollout.interface import RolloutEngine
from hybridflow.engines.rollout.kv_cache import KVCache
from hybridflow.engines.rollout.model import DecoderModel
from hybridflow.engines.rollout.sampling import LOG_PROB_MODES, SamplingParams
from hybridflow.engines.rollout.scheduler import Request, RunStats, Scheduler
from hybridflow.engines.rollout.spec import DecoderSpec
from hybridflow.engines.rollout.weights import iter_safetensors
from hybridflow.protocol import DataProto


@dataclass(frozen=True)
class RolloutConfig:
    """Engine-wide settings (per-request settings live in SamplingParams)."""

    # torch dtype, or "auto" / "bf16" / "fp32" (engines/precision.py): "auto" is bf16 on GPUs
    # and CPUs with native bf16, fp32 elsewhere. Always a torch.dtype after construction.
    dtype: torch.dtype | str = "auto"
    device: str = "cpu"
    max_num_seqs: int = 256  # KV-cache slots: sequences decoded at once
    max_model_len: int | None = None  # prompt + response cap; None: config.max_position_embeddings
    keep_kv_cache: bool = False  # keep the cache between generate calls instead of freeing it
    log_prob_mode: str = "scaled"
    prefill_token_budget: int = 8192  # padded tokens per prefill forward (bounds activations)
    pad_token_id: int | None = None  # None: the model config's pad id
    seed: int = 0
    # "native": torch's GEMM in `dtype`; "fp32_panels": bf16 weights multiplied by fp32 sgemm
    # one converted panel at a time, for CPUs without native bf16; "auto": the latter exactly
    # there (see gemm.py). A concrete mode after construction.
    matmul: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", resolve_dtype(self.dtype, torch.device(self.device).type))
        if self.log_prob_mode not in LOG_PROB_MODES:
            raise ValueError(f"log_prob_mode must be one of {LOG_PROB_MODES}, got {self.log_prob_mode!r}")
        object.__setattr__(self, "matmul", resolve_matmul(self.matmul, self.dtype, torch.device(self.device).type))
        if self.max_num_seqs < 1 or self.prefill_token_budget < 1:
            raise ValueError("max_num_seqs and prefill_token_budget must be >= 1")


class NativeRolloutEngine(RolloutEngine):
    """Continuous-batching generation over HF weights, optionally tensor parallel."""

    def __init__(self, hf_config, config: RolloutConfig = RolloutConfig(), *, process_group=None, tokenizer=None):
        self.spec = DecoderSpec.from_hf_config(hf_config)
        self.config = config
        self.max_len = config.max_model_len or self.spec.max_position_embeddings
        self.model = DecoderModel(
            self.spec, dtype=config.dtype, device=config.device, max_positions=self.max_len,
            process_group=process_group, matmul=config.matmul,
        )
        self.tokenizer = tokenizer
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else self.spec.pad_token_id
        self.cache: KVCache | None = None
        self.last_stats: RunStats | None = None
        self._calls = 0

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, config: RolloutConfig = RolloutConfig(), *,
                        process_group=None, tokenizer=None) -> "NativeRolloutEngine":
        """Build from a local HF directory and load its safetensors (each rank keeps its shard)."""
        engine = cls(load_hf_config(model_dir), config, process_group=process_group, tokenizer=tokenizer)
        engine.load_weights(iter_safetensors(model_dir))
        return engine

    # ----------------------------------------------------------------- RolloutEngine
    @property
    def tp_size(self) -> int:
        return self.model.tp_size

    @property
    def tp_rank(self) -> int:
        return self.model.tp_rank

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, sharded: bool = False) -> None:
        self.model.weights.load(weights, sharded=sharded)

    def release_memory(self, *, keep_weights: bool = False) -> None:
        self.cache = None
        self.model.release_buffers()
        self.model.weights.release(keep_values=keep_weights)

    def resume_memory(self) -> None:
        self.model.weights.resume()

    def weight_storage_bytes(self) -> int:
        """Bytes of weight storage held right now (0 after release_memory(); tied weights once)."""
        return sum(t.untyped_storage().nbytes() for t in self.model.weights.base_tensors())

    def generate(self, prompts: DataProto,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> DataProto:
        params = self._params_per_row(prompts, sampling_params)
        self._check_ready(params)
        prompt_ids = _unpad_prompts(prompts)
        requests = self._make_requests(prompt_ids, params)
        need_len = max(len(r.prompt) + r.params.max_new_tokens for r in requests)
        if need_len > self.max_len:
            longest = max(len(p) for p in prompt_ids)
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens exceeds max_model_len={self.max_len}; "
                "shorten prompts, lower max_new_tokens, or raise RolloutConfig.max_model_len"
            )
        slots = min(self.config.max_num_seqs, len(requests))
        cache = self._acquire_cache(slots, need_len)
        scheduler = Scheduler(
            self.model, cache, slots=slots, max_len=self.max_len,
            log_prob_mode=self.config.log_prob_mode,
            prefill_token_budget=self.config.prefill_token_budget, tokenizer=self.tokenizer,
        )
        try:
            self.last_stats = scheduler.run(requests)
        finally:
            if not self.config.keep_kv_cache:
                self.cache = None
        self._calls += 1
        return _pack_output(prompts, requests, params, self.pad_id)

    # ----------------------------------------------------------------- helpers
    def _params_per_row(self, prompts: DataProto, sp) -> list[SamplingParams]:
        rows = len(prompts)
        if sp is None:
            sp = SamplingParams.from_meta_info(prompts.meta_info)
        if isinstance(sp, SamplingParams):
            return [sp] * rows
        sp = list(sp)
        if len(sp) != rows:
            raise ValueError(f"got {len(sp)} SamplingParams for {rows} prompts; give one or one per prompt")
        return sp

    def _check_ready(self, params: list[SamplingParams]) -> None:
        weights = self.model.weights
        if weights.released:
            raise RuntimeError("engine memory is released; call resume_memory() (and load_weights) first")
        missing = weights.missing_names()
        if missing:
            raise RuntimeError(f"{len(missing)} parameters were never loaded, e.g. {sorted(missing)[:3]}")
        if self.tokenizer is None and any(p.stop for p in params):
            raise ValueError("stop strings need a tokenizer: pass tokenizer= (anything with .decode(ids))")

    def _make_requests(self, prompt_ids: list[list[int]], params: list[SamplingParams]) -> list[Request]:
        eos = frozenset(self.spec.eos_token_ids)
        requests = []
        for row, (ids, p) in enumerate(zip(prompt_ids, params)):
            stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else eos)
            for k in range(p.n):
                gen = None if p.greedy else self._generator(p.seed, row, k)
                requests.append(Request(row, k, ids, p, stop_ids, gen))
        return requests

    def _generator(self, seed: int | None, row: int, sample: int) -> torch.Generator:
        entropy = [seed, row, sample] if seed is not None else [self.config.seed, 1 << 31, self._calls, row, sample]
        state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
        return torch.Generator().manual_seed((int(state[0]) & 0x7FFFFFFF) << 32 | int(state[1]))

    def _acquire_cache(self, slots: int, max_len: int) -> KVCache:
        s, dev = self.spec, self.model.weights.norm.device  # concrete device ("cuda:0", not "cuda")
        if self.cache is not None and self.cache.fits(slots, max_len, self.config.dtype, dev):
            return self.cache
        self.cache = None  # drop the old one before allocating its replacement
        self.cache = KVCache(s.num_layers, slots, self.model.n_kv, max_len, s.head_dim, self.config.dtype, dev)
        return self.cache


def _unpad_prompts(prompts: DataProto) -> list[list[int]]:
    """Token ids where attention_mask is 1, per row; rejects empty prompts."""
    for key in ("input_ids", "attention_mask"):
        if key not in prompts.batch:
            raise KeyError(f"generate() needs {key!r} in the DataProto batch (left-padded prompts)")
    ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].cpu().bool()
    out = [ids[i][mask[i]].tolist() for i in range(ids.shape[0])]
    if ids.shape[1] and not bool(mask[:, -1].all()):
        raise ValueError("prompts must be LEFT-padded: every row's last attention_mask entry must be 1")
    empty = [i for i, p in enumerate(out) if not p]
    if empty:
        raise ValueError(f"prompt rows {empty[:5]} have no tokens (attention_mask all zero)")
    return out


def _pack_output(prompts: DataProto, requests: list[Request], params: list[SamplingParams], pad_id: int) -> DataProto:
    rows = torch.tensor([r.prompt_row for r in requests], dtype=torch.long)
    width = max(p.max_new_tokens for p in params)
    n_out = len(requests)
    responses = torch.full((n_out, width), pad_id, dtype=torch.long)
    response_mask = torch.zeros(n_out, width, dtype=torch.long)
    log_probs = torch.zeros(n_out, width, dtype=torch.float32)
    for i, r in enumerate(requests):
        n = len(r.tokens)
        responses[i, :n] = torch.tensor(r.tokens, dtype=torch.long)
        response_mask[i, :n] = 1
        log_probs[i, :n] = torch.tensor(r.log_probs, dtype=torch.float32)
    prompt_ids = prompts.batch["input_ids"].cpu().index_select(0, rows)
    prompt_mask = prompts.batch["attention_mask"].cpu().index_select(0, rows).to(torch.long)
    if "position_ids" in prompts.batch:
        prompt_pos = prompts.batch["position_ids"].cpu().index_select(0, rows)
    else:
        prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    steps = torch.arange(1, width + 1, dtype=prompt_pos.dtype)
    response_pos = prompt_pos[:, -1:] + steps
    counts = np.bincount(rows.numpy(), minlength=len(prompts))
    non_tensors = {k: np.repeat(v, counts, axis=0) for k, v in prompts.non_tensor_batch.items()}
    finish = np.empty(n_out, dtype=object)
    finish[:] = [r.finish_reason for r in requests]
    non_tensors["finish_reason"] = finish
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
            "rollout_log_probs": log_probs,
        },
        non_tensors=non_tensors,
        meta_info=dict(prompts.meta_info),
    )
