"""`ExternalRolloutEngine`: what the vLLM and SGLang adapters share behind `RolloutEngine`."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from typing import ClassVar

import torch
import torch.distributed as dist

from hybridflow.engines.rollout.batch_io import (
    check_model_len,
    check_ready,
    id_tuple,
    pack_output,
    params_per_row,
    stop_ids_for,
    unpad_prompts,
)
from hybridflow.engines.rollout.config import RolloutConfig
from hybridflow.engines.rollout.external import (
    EXTERNAL_ENGINES,
    is_installed,
    log_prob_mismatch,
    missing_package_message,
)
from hybridflow.engines.rollout.external_io import (
    EngineRequest,
    check_weight,
    checkpoint_shapes,
    engine_weight_names,
    expand_requests,
    expected_weights,
    finish,
    gather_tp_piece,
    to_checkpoint,
    weight_buckets,
)
from hybridflow.engines.rollout.interface import RolloutEngine
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.weights import ignored_weight
from hybridflow.protocol import DataProto

DEFAULT_BUCKET_BYTES = 512 << 20  # per engine call: large enough to amortise it, small next to a GPU


class ExternalRolloutEngine(RolloutEngine):
    """A `RolloutEngine` over an external engine (module docstring); subclasses name it."""

    engine_name: ClassVar[str]
    # Each engine call is a round trip (an RPC, a CUDA IPC hand-over): the HybridEngine
    # stages parameters into buckets of this size before calling load_weights.
    sync_bucket_bytes: ClassVar[int | None] = DEFAULT_BUCKET_BYTES

    def __init__(self, hf_config, config: RolloutConfig = RolloutConfig(), *, process_group=None, tokenizer=None,
                 model_path: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        name = self.engine_name
        self._check_environment(config)
        if model_path is None:
            raise ValueError(f"rollout backend {name!r} builds its engine from the model directory; pass model_path")
        if config.keep_kv_cache:
            raise ValueError(f"rollout backend {name!r} manages its own KV cache; set keep_kv_cache=False")
        self.config = config
        self.group = process_group
        self._tp_size = 1 if process_group is None else dist.get_world_size(process_group)
        self._tp_rank = 0 if process_group is None else dist.get_rank(process_group)
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.bucket_bytes = bucket_bytes
        self.max_len = config.max_model_len or int(hf_config.max_position_embeddings)
        self.eos_ids = id_tuple(getattr(hf_config, "eos_token_id", None))
        pad = config.pad_token_id if config.pad_token_id is not None else getattr(hf_config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        module = expected_weights(hf_config, config.trust_remote_code)
        # weights are accepted under the module's names (the training engine's) and the
        # checkpoint's (a model directory), which differ for fused MoE experts
        self.expected = {**module, **checkpoint_shapes(module)}
        self.tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.required = engine_weight_names(module, self.tied)  # checkpoint names
        self._loaded: set[str] = set()
        self._released = False
        self._loading = False  # a weight-update session is open in the engine
        self._calls = 0
        self._start_engine(hf_config)
        self._full_bytes = self._engine_weight_bytes()

    # ------------------------------------------------------------------ engine hooks
    def _check_environment(self, config: RolloutConfig) -> None:
        """Raise unless the engine's package is installed and `config.device` is a CUDA device."""
        name = self.engine_name
        if not is_installed(EXTERNAL_ENGINES[name].package):
            raise ImportError(missing_package_message(name))
        if torch.device(config.device).type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"rollout backend {name!r} generates on CUDA devices only (got device "
                               f"{config.device!r}, CUDA available: {torch.cuda.is_available()}); run with "
                               "resources.use_gpu=true on a machine with NVIDIA GPUs, or use rollout.name=native or hf")

    def _log_prob_problem(self, p: SamplingParams) -> str | None:
        """Why the engine cannot return `config.log_prob_mode` log-probs for `p` (None: it can)."""
        return log_prob_mismatch(self.engine_name, self.config.log_prob_mode, greedy=p.greedy, top_k=p.top_k,
                                 top_p=p.top_p)

    @abstractmethod
    def _start_engine(self, hf_config) -> None:
        """Build the engine from self.model_path with placeholder weights."""

    @abstractmethod
    def _engine_generate(self, requests: list[EngineRequest], stop_ids: list[frozenset[int]]
                         ) -> list[tuple[list[int], list[float]]]:
        """(token ids, log-probs) per request, in order."""

    @abstractmethod
    def _engine_begin_load(self) -> None:
        """Open the engine's weight-update session (before the first bucket of a sync)."""

    @abstractmethod
    def _engine_load(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Load full HF tensors into the engine (inside a session); raise if it refuses."""

    @abstractmethod
    def _engine_end_load(self) -> None:
        """Close the session: the engine post-processes the new weights into its kernels'
        layout and forgets cached prefixes (their KV was computed with the old weights)."""

    @abstractmethod
    def _engine_release(self, keep_weights: bool) -> None: ...

    @abstractmethod
    def _engine_resume(self) -> None: ...

    @abstractmethod
    def _engine_weight_bytes(self) -> int:
        """Bytes of the engine's weight tensors on this rank (while they are allocated)."""

    # ------------------------------------------------------------------ RolloutEngine
    @property
    def tp_size(self) -> int:
        return self._tp_size

    @property
    def tp_rank(self) -> int:
        return self._tp_rank

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, sharded: bool = False) -> None:
        if self._released:
            raise RuntimeError("weights are released; call resume_memory() before load_weights()")

        def full_tensors():
            for name, tensor in weights:
                if ignored_weight(name):
                    continue
                check_weight(self.expected, name, tensor, dim=self.shard_dim(name), rank=self._tp_rank,
                             world=self._tp_size, sharded=sharded)
                whole = self._full_tensor(name, tensor) if sharded else tensor
                for checkpoint_name, part in to_checkpoint(name, whole):
                    if checkpoint_name in self.required:  # not a tied lm_head: the engine reads the embedding
                        self._loaded.add(checkpoint_name)
                        yield checkpoint_name, part

        for bucket in weight_buckets(full_tensors(), self.bucket_bytes):
            if not self._loading:
                # One session for every bucket until the next generate: the engine's
                # post-processing and prefix-cache reset run once per sync, not per call.
                self._engine_begin_load()
                self._loading = True
            self._engine_load(bucket)

    def _end_load(self) -> None:
        if self._loading:
            self._loading = False
            self._engine_end_load()

    def _full_tensor(self, name: str, piece: torch.Tensor) -> torch.Tensor:
        """The whole parameter from every TP rank's piece (a replicated one is whole already)."""
        dim = self.shard_dim(name)
        if dim is None or self._tp_size == 1:
            return piece
        return gather_tp_piece(piece, dim, self.expected[name][dim], self.group)

    def generate(self, prompts: DataProto,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> DataProto:
        params = params_per_row(prompts, sampling_params)
        check_ready(released=self._released, missing=self.required - self._loaded, params=params,
                    tokenizer=self.tokenizer)
        for p in set(params):
            why = self._log_prob_problem(p)
            if why is not None:  # a call's meta_info asked for what the config check could not see
                raise ValueError(why)
        prompt_ids = unpad_prompts(prompts)
        check_model_len(prompt_ids, params, self.max_len)
        requests = expand_requests(prompt_ids, params, base_seed=self.config.seed, call=self._calls)
        self._calls += 1
        stops = [stop_ids_for(r.params, self.eos_ids) for r in requests]
        self._end_load()
        outputs = self._engine_generate(requests, stops)
        samples = [finish(r, tokens, lps, s, self.tokenizer) for r, (tokens, lps), s in zip(requests, outputs, stops)]
        return pack_output(prompts, samples, params, self.pad_id)

    def release_memory(self, *, keep_weights: bool = False) -> None:
        if self._released:
            return
        self._end_load()  # never sleep with a weight-update session open
        self._engine_release(keep_weights)
        self._released = True
        if not keep_weights:
            self._loaded.clear()

    def resume_memory(self) -> None:
        if not self._released:
            return
        self._engine_resume()
        self._released = False

    def weight_storage_bytes(self) -> int:
        return 0 if self._released else self._full_bytes
