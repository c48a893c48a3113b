"""The calls the vLLM and SGLang adapters make, in order, against stand-ins that answer as
vLLM 0.32.0 / SGLang 0.5.21 do.

Neither engine runs here (no GPU, no package), so the adapters' own `_start_engine` and
hooks are driven with fake `vllm` / `sglang` modules whose objects record every call. What
is checked is our side of the protocol only: the engine arguments we pass, the weight-update
session around the buckets (SGLang's begin/update/end with every (success, message) reply
read; vLLM's layer-wise reload start/load/finish), the cache reset after it, and that a
refusal raises. Nothing numerical comes from the fakes: the numbers are the contract
suite's (test_backend_contract.py), on a machine with the engines.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from rollout_helpers import left_padded, save_model

from hybridflow.engines.models import load_hf_config
from hybridflow.engines.rollout import RolloutConfig, SamplingParams
from hybridflow.engines.rollout.external_engine import ExternalRolloutEngine
from hybridflow.engines.rollout.external_io import check_reply
from hybridflow.engines.rollout.sglang_backend import SGLangRolloutEngine
from hybridflow.engines.rollout.vllm_backend import VLLMRolloutEngine
from hybridflow.engines.rollout.weights import iter_safetensors

SESSION_ERROR = "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"


class FakeSGLangEngine:
    """Answers like SGLang 0.5.21's `sglang.Engine` (scheduler_components/weight_updater.py)."""

    opens_session = True

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list = []
        self.session = False
        self.loaded: dict[str, torch.Tensor] = {}

    def begin_weight_update(self, selector: str = "all"):
        self.calls.append("begin_weight_update")
        if self.session:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session = self.opens_session
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(("update_weights_from_tensor", len(named_tensors), flush_cache))
        if not self.session:
            return False, SESSION_ERROR
        self.loaded.update((n, t.clone()) for n, t in named_tensors)
        return True, "Success"

    def end_weight_update(self):
        self.calls.append("end_weight_update")
        if not self.session:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session = False
        return True, "Success"

    def flush_cache(self):
        self.calls.append("flush_cache")

    def generate(self, input_ids, sampling_params, return_logprob):
        self.calls.append(("generate", len(input_ids)))
        return [{"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [(-1.0, 5, None), (-0.5, 6, None)],
                                                     "finish_reason": {"type": "length"}}} for _ in input_ids]

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release_memory_occupation", tags))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume_memory_occupation", tags))


class FakeLLM:
    """Answers like vLLM 0.32.0's `vllm.LLM` (entrypoints/llm.py); collective_rpc records the
    worker function's name instead of running it (it needs vLLM's worker)."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list = []
        self.buckets: list[list[str]] = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(method.__name__)
        if method.__name__ == "_load_bucket":
            self.buckets.append([name for name, _ in args[0]])
        return [4096] if method.__name__ == "_weight_bytes" else [None]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", len(prompts)))
        step = {5: SimpleNamespace(logprob=-1.0)}, {6: SimpleNamespace(logprob=-0.5)}
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5, 6], logprobs=list(step), stop_reason=None)])
                for _ in prompts]

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("protocol") / "llama", "llama", seed=1)


def _adapter(cls: type[ExternalRolloutEngine], module: str, fake, model_dir, monkeypatch, bucket_bytes: int):
    monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setattr(cls, "_check_environment", lambda self, config: None)  # no GPU / package here
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "unset")  # the vLLM adapter sets it: restored after
    return cls(load_hf_config(model_dir), RolloutConfig(dtype=torch.bfloat16, device="cuda"),
               model_path=str(model_dir), bucket_bytes=bucket_bytes)


def _weights(model_dir, dtype=torch.bfloat16):
    return [(n, t.to(dtype)) for n, t in iter_safetensors(model_dir)]


def _sglang(model_dir, monkeypatch, engine_cls=FakeSGLangEngine, bucket_bytes=16 << 10) -> SGLangRolloutEngine:
    return _adapter(SGLangRolloutEngine, "sglang", SimpleNamespace(Engine=engine_cls), model_dir, monkeypatch,
                    bucket_bytes)


def test_sglang_engine_is_built_deterministic_with_dummy_weights(model_dir, monkeypatch):
    """SGLang reads per-request sampling_seed only with enable_deterministic_inference."""
    kwargs = _sglang(model_dir, monkeypatch).engine.kwargs
    assert kwargs["enable_deterministic_inference"] is True
    assert (kwargs["load_format"], kwargs["tp_size"], kwargs["dtype"]) == ("dummy", 1, "bfloat16")
    assert kwargs["skip_tokenizer_init"] is True and kwargs["enable_memory_saver"] is True


def test_sglang_weights_load_inside_one_session_per_sync(model_dir, monkeypatch):
    adapter = _sglang(model_dir, monkeypatch)
    fake = adapter.engine
    weights = _weights(model_dir)
    adapter.load_weights(weights)
    updates = [c for c in fake.calls if c[0] == "update_weights_from_tensor"]
    assert fake.calls[0] == "begin_weight_update" and fake.calls[1:] == updates and len(updates) > 1
    assert all(flush is False for _, _, flush in updates)  # the cache is flushed once, after the session
    assert set(fake.loaded) == {n for n, _ in weights} and all(torch.equal(fake.loaded[n], t) for n, t in weights)
    fake.calls.clear()
    adapter.generate(left_padded([3, 2], vocab=256), SamplingParams(temperature=0.0, max_new_tokens=2))
    assert fake.calls == ["end_weight_update", "flush_cache", ("generate", 2)]
    fake.calls.clear()
    adapter.generate(left_padded([3, 2], vocab=256), SamplingParams(temperature=0.0, max_new_tokens=2))
    assert fake.calls == [("generate", 2)]  # no new weights: no session, no flush
    # the next sync opens a new session; a release closes it before the engine sleeps
    adapter.load_weights(weights[:1])
    adapter.release_memory()
    assert fake.calls[-5:] == ["begin_weight_update", ("update_weights_from_tensor", 1, False), "end_weight_update",
                               "flush_cache", ("release_memory_occupation", None)]


def test_sglang_refused_update_raises_with_the_engines_message(model_dir, monkeypatch):
    """A reply of (False, ...) means SGLang loaded nothing: generating would use the old weights."""

    class NoSession(FakeSGLangEngine):
        opens_session = False  # as if begin_weight_update had never been called

    adapter = _sglang(model_dir, monkeypatch, engine_cls=NoSession)
    with pytest.raises(RuntimeError, match=r"SGLang update_weights_from_tensor failed: .*must run between"):
        adapter.load_weights(_weights(model_dir))


def test_check_reply_reads_the_success_flag():
    check_reply("SGLang", "x", (True, "Success"))
    check_reply("SGLang", "x", [True, "Success"])
    with pytest.raises(RuntimeError, match="SGLang x failed: nope"):
        check_reply("SGLang", "x", (False, "nope"))
    with pytest.raises(RuntimeError, match="expects \\(success, message\\)"):
        check_reply("SGLang", "x", None)


def test_vllm_weights_load_through_the_layerwise_reload(model_dir, monkeypatch):
    """start once, one load per bucket, finish (which runs process_weights_after_loading per
    layer), then the prefix cache reset, all before the next generate."""
    fake_vllm = SimpleNamespace(LLM=FakeLLM, SamplingParams=lambda **kw: kw)
    adapter = _adapter(VLLMRolloutEngine, "vllm", fake_vllm, model_dir, monkeypatch, bucket_bytes=16 << 10)
    fake = adapter.llm
    assert fake.kwargs["load_format"] == "dummy" and fake.kwargs["logprobs_mode"] == "processed_logprobs"
    assert fake.kwargs["tensor_parallel_size"] == 1 and "data_parallel_size" not in fake.kwargs
    assert fake.calls == ["_weight_bytes"]
    weights = _weights(model_dir)
    adapter.load_weights(weights)
    loads = fake.calls[2:]
    assert fake.calls[1] == "_begin_reload" and set(loads) == {"_load_bucket"} and len(loads) > 1
    assert sorted(n for b in fake.buckets for n in b) == sorted(n for n, _ in weights)
    fake.calls.clear()
    adapter.generate(left_padded([3, 2], vocab=256), SamplingParams(temperature=0.0, max_new_tokens=2))
    assert fake.calls == ["_finish_reload", "reset_prefix_cache", ("generate", 2)]
