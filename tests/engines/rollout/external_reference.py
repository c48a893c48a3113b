"""A reference engine behind `ExternalRolloutEngine`'s hooks, so its shared code runs on a CPU.

The vLLM and SGLang adapters are thin: the engine calls are their hooks, everything else
(prompts, per-sample requests and seeds, stops, output layout, weight checks, TP gathers,
which weights are loaded, release state) is `ExternalRolloutEngine`. Neither engine runs
here, so this class plugs hybridflow's own engine into the same hooks, one request per
row, and the backend contract suite runs it as "external_reference": the shared code is
then held to the contract on every machine, and only the engine calls themselves wait for
a GPU session. It is registered only while a test uses it (`registered`).

It accepts tensor-parallel process groups (the pieces are all-gathered by the shared code)
while its native engine runs unsharded on each rank, like vLLM's loader that takes whole
tensors.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

from hybridflow.engines.rollout import NativeRolloutEngine, registry
from hybridflow.engines.rollout.batch_io import left_pad_ids
from hybridflow.engines.rollout.external_engine import ExternalRolloutEngine
from hybridflow.engines.rollout.external_io import EngineRequest
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.protocol import DataProto

NAME = "external_reference"


class ReferenceExternalEngine(ExternalRolloutEngine):
    """The native engine as the "external" engine (module docstring)."""

    engine_name = NAME
    supports_tensor_parallel = True

    def _check_environment(self, config) -> None:
        """Runs wherever the native engine runs (CPU included)."""

    def _log_prob_problem(self, p: SamplingParams) -> str | None:
        return None  # the native engine returns both log-prob meanings

    def _start_engine(self, hf_config) -> None:
        self.inner = NativeRolloutEngine(hf_config, self.config)
        self.sessions = 0  # weight-update sessions opened
        self.cache_drops = 0  # ... and closed (the engine's post-processing and cache reset)

    def _engine_generate(self, requests: list[EngineRequest], stop_ids) -> list[tuple[list[int], list[float]]]:
        # What the adapters send: one sequence per request, its own seed and stop ids, eos
        # only through them, no stop strings (the shared code cuts those).
        ids, mask = left_pad_ids([r.prompt_ids for r in requests], self.pad_id)
        params = [dataclasses.replace(r.params, n=1, seed=r.seed, stop=(), stop_token_ids=tuple(sorted(s)),
                                      ignore_eos=True) for r, s in zip(requests, stop_ids)]
        out = self.inner.generate(DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask}), params)
        lengths = out.batch["response_mask"].sum(1).tolist()
        return [(out.batch["responses"][i, :n].tolist(), out.batch["rollout_log_probs"][i, :n].tolist())
                for i, n in enumerate(lengths)]

    def _engine_begin_load(self) -> None:
        self.sessions += 1

    def _engine_load(self, bucket) -> None:
        self.inner.load_weights(bucket)

    def _engine_end_load(self) -> None:
        self.cache_drops += 1

    def _engine_release(self, keep_weights: bool) -> None:
        self.inner.release_memory(keep_weights=keep_weights)

    def _engine_resume(self) -> None:
        self.inner.resume_memory()

    def _engine_weight_bytes(self) -> int:
        return self.inner.weight_storage_bytes()


@contextmanager
def registered():
    """`rollout.name=external_reference` while inside (the registry is left as it was)."""
    registry.register_rollout_backend(NAME)(ReferenceExternalEngine)
    try:
        yield ReferenceExternalEngine
    finally:
        registry._BACKENDS._items.pop(NAME, None)
