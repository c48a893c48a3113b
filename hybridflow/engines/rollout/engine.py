"""hybridflow's own generation engine: `NativeRolloutEngine`, a `RolloutEngine`.

    engine = NativeRolloutEngine.from_pretrained(model_dir, RolloutConfig(dtype="auto"))
    out = engine.generate(batch, SamplingParams(temperature=1.0, max_new_tokens=256, n=4))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from hybridflow.engines.rollout.batch_io import (
    check_model_len,
    check_ready,
    pack_output,
    params_per_row,
    sample_seed,
    stop_ids_for,
    unpad_prompts,
)
from hybridflow.engines.rollout.config import RolloutConfig
from hybridflow.engines.rollout.device_loop import DeviceLoopScheduler, DeviceSteps, SlotState
from hybridflow.engines.rollout.interface import RolloutEngine
from hybridflow.engines.rollout.kv_cache import KVCache
from hybridflow.engines.rollout.model import DecoderModel
from hybridflow.engines.rollout.registry import register_rollout_backend
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.scheduler import Request, RunStats, Scheduler
from hybridflow.engines.rollout.spec import DecoderSpec
from hybridflow.protocol import DataProto

__all__ = ["NativeRolloutEngine", "RolloutConfig"]


@register_rollout_backend("native")
class NativeRolloutEngine(RolloutEngine):
    """Continuous-batching generation over HF weights, optionally tensor parallel."""

    supports_tensor_parallel = True

    def __init__(self, hf_config, config: RolloutConfig = RolloutConfig(), *, process_group=None, tokenizer=None,
                 model_path: str | None = None):
        # model_path is part of the backend signature (registry.py); weights come by load_weights.
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
        self._state: SlotState | None = None  # device loop: per-slot sequence state
        self._steps = DeviceSteps(self.model, config.log_prob_mode, cuda_graphs=config.cuda_graphs,
                                  compile_step=config.compile_decode)

    # ----------------------------------------------------------------- RolloutEngine
    @property
    def tp_size(self) -> int:
        return self.model.tp_size

    @property
    def tp_rank(self) -> int:
        return self.model.tp_rank

    @property
    def tp_group(self):
        return self.model.group

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, sharded: bool = False) -> None:
        self.model.weights.load(weights, sharded=sharded)

    def turn_engine(self, slots: int):
        """Multi-turn generation continuing from the KV cache (turns.py)."""
        from hybridflow.engines.rollout.turns import TurnEngine

        return TurnEngine(self, slots=slots)

    def release_memory(self, *, keep_weights: bool = False) -> None:
        self._steps.reset()  # captured graphs read the cache and weights being freed
        self.cache, self._state = None, None
        self.model.release_buffers()
        self.model.weights.release(keep_values=keep_weights)

    def resume_memory(self) -> None:
        self.model.weights.resume()

    def weight_storage_bytes(self) -> int:
        return self.model.weights.storage.nbytes()

    def generate(self, prompts: DataProto,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> DataProto:
        params = params_per_row(prompts, sampling_params)
        self._check_ready(params)
        prompt_ids = unpad_prompts(prompts)
        check_model_len(prompt_ids, params, self.max_len)
        requests = self._make_requests(prompt_ids, params)
        need_len = max(len(r.prompt) + r.params.max_new_tokens for r in requests)
        slots = min(self.config.max_num_seqs, len(requests))
        cache = self._acquire_cache(slots, need_len)
        common = dict(slots=slots, max_len=self.max_len, log_prob_mode=self.config.log_prob_mode,
                      prefill_token_budget=self.config.prefill_token_budget, tokenizer=self.tokenizer)
        if self.config.decode_loop == "device":
            state = self._acquire_state(slots, max(p.max_new_tokens for p in params),
                                        max(1, max(len(r.stop_ids) for r in requests)))
            scheduler = DeviceLoopScheduler(self.model, cache, state, self._steps,
                                            readback_every=self.config.readback_every, **common)
        else:
            scheduler = Scheduler(self.model, cache, **common)
        try:
            self.last_stats = scheduler.run(requests)
        finally:
            # captured graphs read the cache's addresses: it stays while they do
            if not (self.config.keep_kv_cache or self.config.cuda_graphs):
                self.cache, self._state = None, None
        self._calls += 1
        return pack_output(prompts, requests, params, self.pad_id)

    # ----------------------------------------------------------------- helpers
    def _check_ready(self, params: list[SamplingParams]) -> None:
        weights = self.model.weights
        check_ready(released=weights.released, missing=weights.missing_names(), params=params, tokenizer=self.tokenizer)

    def _make_requests(self, prompt_ids: list[list[int]], params: list[SamplingParams]) -> list[Request]:
        requests = []
        for row, (ids, p) in enumerate(zip(prompt_ids, params)):
            stop_ids = stop_ids_for(p, self.spec.eos_token_ids)
            for k in range(p.n):
                gen = None if p.greedy else self._generator(p.seed, row, k)
                requests.append(Request(row, k, ids, p, stop_ids, gen))
        return requests

    def _generator(self, seed: int | None, row: int, sample: int) -> torch.Generator:
        entropy = [seed, row, sample] if seed is not None else [self.config.seed, 1 << 31, self._calls, row, sample]
        return torch.Generator().manual_seed(sample_seed(entropy))

    def _acquire_cache(self, slots: int, max_len: int) -> KVCache:
        s, dev = self.spec, self.model.weights.norm.device  # concrete device ("cuda:0", not "cuda")
        if self.cache is not None and self.cache.fits(slots, max_len, self.config.dtype, dev):
            return self.cache
        self.cache = None  # drop the old one before allocating its replacement
        self._steps.reset()
        self.cache = KVCache(s.num_layers, slots, self.model.n_kv, max_len, s.head_dim, self.config.dtype, dev)
        return self.cache

    def _acquire_state(self, slots: int, width: int, stops: int) -> SlotState:
        dev = self.model.weights.norm.device
        if self._state is None or not self._state.fits(slots, width, stops, dev):
            self._steps.reset()
            self._state = None
            self._state = SlotState.allocate(slots, width, stops, dev)
        return self._state

