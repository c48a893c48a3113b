"""SGLang as a rollout backend ("sglang"): an adapter written against the SGLang 0.5.21 `Engine` API.

    rollout:
      name: sglang                     # resources.use_gpu: true; `pip install 'hybridflow[sglang]'`
      tensor_model_parallel_size: 1    # one engine per rank
      log_prob_mode: scaled            # what SGLang returns, for every top_k / top_p (external.py)
"""

from __future__ import annotations

import math

import torch

from hybridflow.engines.rollout.external_engine import ExternalRolloutEngine
from hybridflow.engines.rollout.external_io import (
    EngineRequest,
    check_reply,
    sglang_output_tokens,
    sglang_sampling_dict,
)
from hybridflow.engines.rollout.registry import register_rollout_backend


@register_rollout_backend("sglang")
class SGLangRolloutEngine(ExternalRolloutEngine):
    """SGLang behind the RolloutEngine contract (see module docstring)."""

    engine_name = "sglang"
    supports_tensor_parallel = False
    mem_fraction_static = 0.5  # share of the GPU for weights + KV cache; the rest is training's

    def _start_engine(self, hf_config) -> None:
        import sglang

        self.engine = sglang.Engine(
            model_path=self.model_path, skip_tokenizer_init=True, dtype=str(self.config.dtype).removeprefix("torch."),
            tp_size=1, base_gpu_id=torch.device(self.config.device).index or 0, random_seed=self.config.seed,
            context_length=self.max_len, max_running_requests=self.config.max_num_seqs,
            mem_fraction_static=self.mem_fraction_static, enable_memory_saver=True, load_format="dummy",
            enable_deterministic_inference=True, log_level="error", trust_remote_code=self.config.trust_remote_code,
        )
        self._kept_weights = False

    def _engine_generate(self, requests: list[EngineRequest], stop_ids) -> list[tuple[list[int], list[float]]]:
        outputs = self.engine.generate(input_ids=[r.prompt_ids for r in requests],
                                       sampling_params=[sglang_sampling_dict(r, s) for r, s in zip(requests, stop_ids)],
                                       return_logprob=True)
        return [sglang_output_tokens(o) for o in outputs]

    def _engine_begin_load(self) -> None:
        check_reply("SGLang", "begin_weight_update", self.engine.begin_weight_update())

    def _engine_load(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        check_reply("SGLang", "update_weights_from_tensor",
                    self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False))

    def _engine_end_load(self) -> None:
        check_reply("SGLang", "end_weight_update", self.engine.end_weight_update())
        self.engine.flush_cache()

    def _engine_release(self, keep_weights: bool) -> None:
        self.engine.release_memory_occupation(tags=["kv_cache"] if keep_weights else None)
        self._kept_weights = keep_weights

    def _engine_resume(self) -> None:
        self.engine.resume_memory_occupation(tags=["kv_cache"] if self._kept_weights else None)

    def _engine_weight_bytes(self) -> int:
        # The model lives in SGLang's scheduler process: count what it must hold.
        itemsize = torch.empty((), dtype=self.config.dtype).element_size()
        return sum(math.prod(self.expected[n]) for n in self.required) * itemsize

    def weight_storage_bytes(self) -> int:
        # keep_weights=True leaves the weights on the device (module docstring).
        return self._full_bytes if self._released and self._kept_weights else super().weight_storage_bytes()
