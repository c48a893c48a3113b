"""vLLM as a rollout backend ("vllm"): an adapter written against vLLM 0.32.0 (V1 engine).

    rollout:
      name: vllm                       # resources.use_gpu: true; `pip install 'hybridflow[vllm]'`
      tensor_model_parallel_size: 2    # t_g: vLLM's tensor_parallel_size
      reshard_method: plain            # consecutive TP groups, as vLLM forms them
      log_prob_mode: processed         # what vLLM returns (external.py)
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from hybridflow.engines.rollout.external_engine import ExternalRolloutEngine
from hybridflow.engines.rollout.external_io import (
    EngineRequest,
    vllm_completion_tokens,
    vllm_parallel_kwargs,
    vllm_sampling_kwargs,
)
from hybridflow.engines.rollout.registry import register_rollout_backend


def _begin_reload(worker) -> None:
    """Runs on vLLM's worker (collective_rpc): layer-wise reload, processing deferred per layer."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(worker.model_runner.get_model())


def _load_bucket(worker, bucket) -> None:
    """Runs on vLLM's worker: its model's own HF-name loader."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        worker.model_runner.get_model().load_weights(weights=bucket)


def _finish_reload(worker) -> None:
    """Runs on vLLM's worker: process what is left (attention layers last) and restore the
    kernel tensors in place (so captured CUDA graphs stay valid)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(worker.model_runner.get_model(), worker.model_runner.model_config)


def _weight_bytes(worker) -> int:
    return sum(p.numel() * p.element_size() for p in worker.model_runner.get_model().parameters())


@register_rollout_backend("vllm")
class VLLMRolloutEngine(ExternalRolloutEngine):
    """vLLM behind the RolloutEngine contract (see module docstring)."""

    engine_name = "vllm"
    supports_tensor_parallel = True
    # Share of the GPU vLLM may take for weights + KV cache while it is awake; the rest is
    # left to the colocated training state (offloaded or not) and activations.
    gpu_memory_utilization = 0.5

    def _start_engine(self, hf_config) -> None:
        distributed = dist.is_initialized()
        parallel, env = vllm_parallel_kwargs(self.tp_size, rank=dist.get_rank() if distributed else None,
                                             world_size=dist.get_world_size() if distributed else None,
                                             visible_gpus=torch.cuda.device_count())
        os.environ.update(env)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process (see above)
        import vllm

        self.llm = vllm.LLM(
            model=self.model_path, skip_tokenizer_init=True, dtype=str(self.config.dtype).removeprefix("torch."),
            seed=self.config.seed, max_model_len=self.max_len, max_num_seqs=self.config.max_num_seqs,
            gpu_memory_utilization=self.gpu_memory_utilization, enable_sleep_mode=True, load_format="dummy",
            logprobs_mode="processed_logprobs", enable_prefix_caching=True,
            trust_remote_code=self.config.trust_remote_code, **parallel,
        )
        self._sampling_params = vllm.SamplingParams
        self._kv_asleep = False

    def _engine_generate(self, requests: list[EngineRequest], stop_ids) -> list[tuple[list[int], list[float]]]:
        if self._kv_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._kv_asleep = False
        prompts = [{"prompt_token_ids": r.prompt_ids} for r in requests]
        params = [self._sampling_params(**vllm_sampling_kwargs(r, s)) for r, s in zip(requests, stop_ids)]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [vllm_completion_tokens(o.outputs[0]) for o in outputs]

    def _engine_begin_load(self) -> None:
        self.llm.collective_rpc(_begin_reload)

    def _engine_load(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        self.llm.collective_rpc(_load_bucket, args=(bucket,))

    def _engine_end_load(self) -> None:
        self.llm.collective_rpc(_finish_reload)
        self.llm.reset_prefix_cache()

    def _engine_release(self, keep_weights: bool) -> None:
        self.llm.sleep(level=1 if keep_weights else 2)
        self._kv_asleep = True

    def _engine_resume(self) -> None:
        self.llm.wake_up(tags=["weights"])

    def _engine_weight_bytes(self) -> int:
        return int(self.llm.collective_rpc(_weight_bytes)[0])
