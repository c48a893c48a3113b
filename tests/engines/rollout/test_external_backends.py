"""The vLLM / SGLang adapters, everything that runs without the engines: config errors, the
translation of sampling settings, the conversion of engine outputs, the weight checks,
TP gathers and buckets. (The adapters against the real engines: test_backend_contract.py,
on a machine with the package and a CUDA device.)

Engine objects are built only when the package is importable; otherwise the conversion
functions are fed the same plain data (token ids, per-token {id: Logprob} maps, SGLang's
result dicts) the engines return.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from external_reference import NAME, ReferenceExternalEngine, registered
from rollout_helpers import char_tokenizer, left_padded, load_hf, save_model

from hybridflow.config.schema import load_run_config
from hybridflow.engines.models import load_hf_config, make_tiny_config
from hybridflow.engines.rollout import RolloutConfig, SamplingParams, build_rollout_engine, registry
from hybridflow.engines.rollout.batch_io import pack_output, params_per_row, unpad_prompts
from hybridflow.engines.rollout.external import check_external_backend, log_prob_mismatch
from hybridflow.engines.rollout.external_io import (
    EngineRequest,
    check_weight,
    checkpoint_shapes,
    engine_weight_names,
    expand_requests,
    expected_weights,
    finish,
    gather_tp_piece,
    sglang_output_tokens,
    sglang_sampling_dict,
    to_checkpoint,
    vllm_completion_tokens,
    vllm_parallel_kwargs,
    vllm_sampling_kwargs,
    weight_buckets,
)
from hybridflow.engines.rollout.weights import iter_safetensors, shard_for_rank
from hybridflow.envs.agent.config import AgentConfig
from hybridflow.errors import ConfigError
from hybridflow.workers.config import RolloutWorkerConfig

ENGINES = ("vllm", "sglang")
HAS = {name: importlib.util.find_spec(name) is not None for name in ENGINES}


@pytest.fixture
def installed(monkeypatch):
    """Pretend both packages are installed, to reach the checks behind that one."""
    monkeypatch.setattr(registry, "is_installed", lambda package: True)


# ------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize("name", ENGINES)
def test_missing_package_is_a_config_error_with_the_fix(name):
    if HAS[name]:
        pytest.skip(f"{name} is installed here")
    with pytest.raises(ConfigError, match=rf"^name: rollout backend '{name}' needs the '{name}' package.*pip install"):
        RolloutWorkerConfig(name=name)
    with pytest.raises(ConfigError, match=rf"rollout.name: .*needs the '{name}' package"):
        load_run_config(None, [f"rollout.name={name}"])
    with pytest.raises(ValueError, match="not installed"):
        build_rollout_engine(name, make_tiny_config("llama"), RolloutConfig(), process_group=None, tokenizer=None,
                             model_path=None)


@pytest.mark.parametrize("name", ENGINES)
def test_adapter_built_without_package_or_gpu_says_what_is_missing(name, monkeypatch):
    cls = registry.rollout_backend(name)  # importing the adapter needs neither package
    if not HAS[name]:
        with pytest.raises(ImportError, match=f"needs the '{name}' package"):
            cls(make_tiny_config("llama"), RolloutConfig(), model_path="/nowhere")
    from hybridflow.engines.rollout import external_engine

    monkeypatch.setattr(external_engine, "is_installed", lambda package: True)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA devices only.*resources.use_gpu=true"):
            cls(make_tiny_config("llama"), RolloutConfig(), model_path="/nowhere")


def test_external_engines_need_gpus_in_the_run_config(installed):
    with pytest.raises(ConfigError, match=r"^resources.use_gpu: rollout.name=vllm generates .* CUDA"):
        load_run_config(None, ["rollout.name=vllm", "rollout.log_prob_mode=processed"])


def test_layouts_the_engines_cannot_form_are_config_errors(installed):
    with pytest.raises(ConfigError, match=r"^reshard_method: vLLM forms its tensor-parallel groups from consecutive"):
        RolloutWorkerConfig(name="vllm", tensor_model_parallel_size=2)
    RolloutWorkerConfig(name="vllm", tensor_model_parallel_size=2, reshard_method="plain")
    with pytest.raises(ConfigError, match=r"^name: rollout backend 'sglang' generates on one rank only"):
        RolloutWorkerConfig(name="sglang", tensor_model_parallel_size=2, reshard_method="plain")
    with pytest.raises(ConfigError, match="agent.enable"):
        RolloutWorkerConfig(name="vllm", agent=AgentConfig(enable=True))


def test_log_prob_semantics_the_engines_cannot_give_are_refused(installed):
    with pytest.raises(ConfigError, match=r"^log_prob_mode: vLLM returns log-probs of the top-k/top-p truncated"):
        RolloutWorkerConfig(name="vllm", top_p=0.9)
    RolloutWorkerConfig(name="vllm", top_p=0.9, log_prob_mode="processed")
    RolloutWorkerConfig(name="vllm", top_p=0.9, do_sample=False)  # greedy: log_softmax(logits) everywhere
    with pytest.raises(ConfigError, match=r"^log_prob_mode: SGLang returns log-probs of the full softmax"):
        RolloutWorkerConfig(name="sglang", top_p=0.9, log_prob_mode="processed")
    RolloutWorkerConfig(name="sglang", top_k=20, top_p=0.9)  # scaled: what SGLang 0.5.21 returns for any truncation


@pytest.mark.parametrize(("name", "mode", "top_k", "top_p", "exact"), [
    ("vllm", "processed", 20, 0.9, True),
    ("vllm", "scaled", -1, 1.0, True),
    ("vllm", "scaled", 20, 1.0, False),
    ("vllm", "scaled", -1, 0.9, False),
    ("sglang", "scaled", 20, 1.0, True),
    ("sglang", "scaled", 20, 0.9, True),
    ("sglang", "processed", -1, 1.0, True),
    ("sglang", "processed", -1, 0.9, False),
    ("sglang", "processed", 20, 1.0, False),
])
def test_log_prob_mismatch_table(name, mode, top_k, top_p, exact):
    assert (log_prob_mismatch(name, mode, greedy=False, top_k=top_k, top_p=top_p) is None) == exact
    assert log_prob_mismatch(name, mode, greedy=True, top_k=top_k, top_p=top_p) is None
    assert check_external_backend(name, tp_size=1, reshard_method="hybrid", log_prob_mode=mode, temperature=0.7,
                                  top_k=top_k, top_p=top_p) is None or not exact


# ------------------------------------------------------------------------------ sampling translation
def test_requests_are_seeded_per_row_and_sample_independently_of_the_batch():
    sampled = SamplingParams(temperature=0.8, n=3, seed=5, max_new_tokens=4)
    both = expand_requests([[1, 2], [3]], [sampled, sampled], base_seed=0, call=0)
    assert [(r.prompt_row, r.sample_index) for r in both] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert len({r.seed for r in both}) == 6 and both[3].prompt_ids == [3]
    alone = expand_requests([[1, 2]], [sampled], base_seed=0, call=7)
    assert [r.seed for r in alone] == [r.seed for r in both[:3]]  # row 0 draws the same with or without row 1
    unseeded = SamplingParams(temperature=0.8, max_new_tokens=4)
    first, second = (expand_requests([[1]], [unseeded], base_seed=0, call=c)[0].seed for c in (0, 1))
    assert first != second  # unseeded calls draw afresh
    assert expand_requests([[1]], [SamplingParams(temperature=0.0)], base_seed=0, call=0)[0].seed is None


def _request(**kw) -> EngineRequest:
    return expand_requests([[4, 5, 6]], [SamplingParams(**kw)], base_seed=3, call=0)[0]


def test_vllm_sampling_kwargs():
    req = _request(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=12, seed=1, stop_token_ids=(9,))
    kw = vllm_sampling_kwargs(req, frozenset({9, 2}))
    assert kw == {"n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 12, "stop_token_ids": [2, 9],
                  "ignore_eos": True, "seed": req.seed, "logprobs": 0, "detokenize": False,
                  "skip_special_tokens": False}
    assert vllm_sampling_kwargs(_request(temperature=0.0, top_k=20), frozenset())["top_k"] == 20
    if HAS["vllm"]:
        import vllm

        params = vllm.SamplingParams(**kw)
        assert params.max_tokens == 12 and params.logprobs == 0 and list(params.stop_token_ids) == [2, 9]


def test_sglang_sampling_dict():
    req = _request(temperature=0.7, top_k=20, max_new_tokens=8, seed=1)
    d = sglang_sampling_dict(req, frozenset({2}))
    assert d == {"n": 1, "temperature": 0.7, "top_p": 1.0, "top_k": 20, "max_new_tokens": 8, "ignore_eos": False,
                 "stop_token_ids": [2], "skip_special_tokens": False, "no_stop_trim": True,
                 "sampling_seed": req.seed}
    # ignoring eos in SGLang also ignores stop_token_ids: decode to the budget, cut afterwards
    ignoring = sglang_sampling_dict(_request(temperature=0.0, ignore_eos=True, stop_token_ids=(7,)), frozenset({7}))
    assert ignoring["ignore_eos"] and ignoring["stop_token_ids"] == [] and "sampling_seed" not in ignoring


# ------------------------------------------------------------------------------ output conversion
def _vllm_completion(tokens, log_probs, stop_reason=None):
    """What vLLM's CompletionOutput carries: token_ids and, per token, {token id: Logprob};
    stop_reason: the stop token id it ended on."""
    if HAS["vllm"]:
        from vllm.outputs import CompletionOutput

        try:
            from vllm.logprobs import Logprob
        except ImportError:  # before vLLM moved it
            from vllm.sequence import Logprob

        steps = [{t: Logprob(logprob=lp, rank=1)} for t, lp in zip(tokens, log_probs)]
        return CompletionOutput(index=0, text="", token_ids=tokens, cumulative_logprob=None, logprobs=steps,
                                finish_reason="stop" if stop_reason is not None else "length",
                                stop_reason=stop_reason)
    steps = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(tokens, log_probs)]
    return SimpleNamespace(token_ids=tokens, logprobs=steps, stop_reason=stop_reason)


def test_vllm_outputs_become_our_samples():
    assert vllm_completion_tokens(_vllm_completion([5, 7, 2], [-0.5, -1.0, -0.25])) == ([5, 7, 2], [-0.5, -1.0, -0.25])
    assert vllm_completion_tokens(_vllm_completion([5, 2], [-0.5, -0.1], stop_reason=2))[0] == [5, 2]
    with pytest.raises(RuntimeError, match="logprobs=0"):
        vllm_completion_tokens(SimpleNamespace(token_ids=[5, 7], logprobs=None, stop_reason=None))
    with pytest.raises(RuntimeError, match="stopped on token 2 but left it out"):
        vllm_completion_tokens(_vllm_completion([5, 7], [-0.5, -1.0], stop_reason=2))


def test_sglang_outputs_become_our_samples():
    out = {"output_ids": [5, 7], "meta_info": {"output_token_logprobs": [(-0.5, 5, None), (-1.5, 7, None)],
                                               "finish_reason": {"type": "stop", "matched": 7}}}
    assert sglang_output_tokens(out) == ([5, 7], [-0.5, -1.5])
    out["meta_info"]["finish_reason"] = {"type": "stop", "matched": 9}
    with pytest.raises(RuntimeError, match="stopped on token 9 but left it out"):
        sglang_output_tokens(out)
    out["meta_info"]["finish_reason"] = {"type": "length", "length": 2}
    out["meta_info"]["output_token_logprobs"][1] = (-1.5, 8, None)
    with pytest.raises(RuntimeError, match="do not match"):
        sglang_output_tokens(out)


def test_finished_samples_are_cut_at_stops_and_packed_like_every_backend():
    """Engine outputs -> finish -> pack_output: the DataProto the other backends produce."""
    tokenizer, chars = char_tokenizer(32)
    batch = left_padded([3, 2], vocab=32, seed=1)
    params = params_per_row(batch, SamplingParams(temperature=0.0, max_new_tokens=5, stop=(chars[9] + chars[10],)))
    requests = expand_requests(unpad_prompts(batch), params, base_seed=0, call=0)
    stop_ids = frozenset({3})
    engine_out = [([8, 9, 10, 11, 12], [-0.1, -0.2, -0.3, -0.4, -0.5]),  # stop string completed at token 3
                  ([4, 3, 6, 6, 6], [-1.0, -2.0, -3.0, -4.0, -5.0])]  # stop id at token 2 (kept)
    samples = [finish(r, t, lp, stop_ids, tokenizer) for r, (t, lp) in zip(requests, engine_out)]
    out = pack_output(batch, samples, params, pad_id=0)
    assert out.batch["responses"].tolist() == [[8, 9, 10, 0, 0], [4, 3, 0, 0, 0]]
    assert out.batch["response_mask"].sum(1).tolist() == [3, 2]
    assert torch.allclose(out.batch["rollout_log_probs"][1], torch.tensor([-1.0, -2.0, 0, 0, 0]))
    assert list(out.non_tensor_batch["finish_reason"]) == ["stop", "stop"]
    budget = finish(requests[0], [8, 8, 8, 8, 8, 8], [-0.1] * 6, frozenset(), tokenizer)
    assert budget.tokens == [8] * 5 and budget.finish_reason == "length"


# ------------------------------------------------------------------------------ weights
def test_expected_weights_and_what_the_engines_receive():
    untied = expected_weights(make_tiny_config("llama"))
    assert untied["model.embed_tokens.weight"] == untied["lm_head.weight"]
    names = engine_weight_names(untied, tied=False)
    assert "lm_head.weight" in names and names <= set(untied)
    tied_config = make_tiny_config("llama", tie_word_embeddings=True)
    tied = expected_weights(tied_config)
    assert "lm_head.weight" not in engine_weight_names(tied, tied=True)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_fused_experts_are_split_back_into_the_checkpoint_tensors(family, tmp_path):
    """transformers' module holds MoE experts fused; the engines read the per-expert tensors
    the checkpoint has: converting the module's state dict gives back the file exactly."""
    path = save_model(tmp_path / family, family, seed=2)
    on_disk = dict(iter_safetensors(path))
    module = load_hf(path).state_dict()
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in module)
    converted = dict(pair for name, tensor in module.items() for pair in to_checkpoint(name, tensor))
    assert set(converted) == set(on_disk)
    for name, tensor in on_disk.items():
        assert torch.equal(converted[name], tensor), name
    shapes = checkpoint_shapes(expected_weights(load_hf_config(path)))
    assert {n: shapes[n] for n in on_disk} == {n: tuple(t.shape) for n, t in on_disk.items()}
    assert engine_weight_names(expected_weights(load_hf_config(path)), tied=False) == set(on_disk)


def test_weight_names_and_shapes_are_checked_before_sending():
    expected = {"model.embed_tokens.weight": (7, 4), "model.norm.weight": (4,)}
    check_weight(expected, "model.norm.weight", torch.zeros(4), dim=None, rank=1, world=2, sharded=True)
    check_weight(expected, "model.embed_tokens.weight", torch.zeros(3, 4), dim=0, rank=1, world=2, sharded=True)
    with pytest.raises(ValueError, match=r"expected \(4, 4\) \(tensor-parallel piece 0 of 2\)"):
        check_weight(expected, "model.embed_tokens.weight", torch.zeros(3, 4), dim=0, rank=0, world=2, sharded=True)
    with pytest.raises(ValueError, match=r"expected \(7, 4\)"):
        check_weight(expected, "model.embed_tokens.weight", torch.zeros(4, 4), dim=0, rank=0, world=2, sharded=False)
    with pytest.raises(KeyError, match="unknown parameter 'lm_head.weight'"):
        check_weight(expected, "lm_head.weight", torch.zeros(7, 4), dim=0, rank=0, world=1, sharded=False)


def test_weight_buckets_are_bounded_and_keep_order():
    weights = [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 100, 1])]
    buckets = list(weight_buckets(weights, bucket_bytes=100))
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1"], ["w2"], ["w3"], ["w4"], ["w5"]]
    assert all(sum(t.numel() * 4 for _, t in b) <= 100 or len(b) == 1 for b in buckets)
    assert [n for b in buckets for n, _ in b] == [n for n, _ in weights]
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(weight_buckets(weights, 0))


# ------------------------------------------------------------------------------ the shared adapter code, TP
def _uneven_gather(rank: int, world: int) -> dict:
    """Pieces of unequal length (7 rows over 2 ranks: 4 and 3) and a row-parallel split."""
    full = {"model.embed_tokens.weight": torch.arange(7 * 3.0).view(7, 3),
            "model.layers.0.self_attn.o_proj.weight": torch.arange(4 * 6.0).view(4, 6)}
    dims = {"model.embed_tokens.weight": 0, "model.layers.0.self_attn.o_proj.weight": 1}
    return {name: (t, gather_tp_piece(shard_for_rank(t, name, rank, world), dims[name], t.shape[dims[name]],
                                      dist.group.WORLD)) for name, t in full.items()}


def _sharded_load_worker(rank: int, world: int, init_file: str, path: str, out_prefix: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.save(_uneven_gather(rank, world), f"{out_prefix}.gather.{rank}")
    with registered():
        engine = build_rollout_engine(NAME, load_hf_config(path), RolloutConfig(dtype=torch.float32),
                                      process_group=dist.group.WORLD, tokenizer=None, model_path=path)
        assert (engine.tp_size, engine.tp_rank) == (world, rank)
        # what the HybridEngine hands each rank: its generation TP piece, one parameter per call
        for name, tensor in iter_safetensors(path):
            engine.load_weights([(name, shard_for_rank(tensor, name, rank, world))], sharded=True)
        out = engine.generate(left_padded([5, 3], vocab=256, seed=4), SAMPLED)
        torch.save((out.batch["responses"], out.batch["rollout_log_probs"], engine.cache_drops), f"{out_prefix}.{rank}")
    dist.destroy_process_group()


SAMPLED = SamplingParams(temperature=0.9, top_k=30, max_new_tokens=8, n=2, seed=6, ignore_eos=True)


def test_sharded_weights_are_gathered_and_generate_like_one_process(tmp_path):
    """The adapters' load path with t_g = 2: each rank's pieces, gathered per parameter over
    gloo (`gather_tp_piece`, also on uneven pieces), give the engine the whole model; the
    output equals the single-process engine's."""
    path = str(save_model(tmp_path / "m", "qwen2", seed=3, logit_scale=4.0))
    mp.spawn(_sharded_load_worker, args=(2, str(tmp_path / "rdzv"), path, str(tmp_path / "out")), nprocs=2,
             join=True)
    with registered():
        single = build_rollout_engine(NAME, load_hf_config(path), RolloutConfig(dtype=torch.float32),
                                      process_group=None, tokenizer=None, model_path=path)
        single.load_weights(iter_safetensors(path))
        ref = single.generate(left_padded([5, 3], vocab=256, seed=4), SAMPLED)
    for rank in range(2):
        for name, (full, rebuilt) in torch.load(tmp_path / f"out.gather.{rank}").items():
            assert torch.equal(rebuilt, full), (rank, name)
        responses, log_probs, drops = torch.load(tmp_path / f"out.{rank}")
        assert torch.equal(responses, ref.batch["responses"])
        # fp32; one thread per process here, several in this one: summation orders differ
        assert torch.allclose(log_probs, ref.batch["rollout_log_probs"], atol=1e-5)
        assert drops == 1  # the engine's prefix cache is dropped once for many loads


def test_vllm_joins_the_workers_world_as_independent_t_g_engines():
    """data_parallel_size 1: the world / t_g engines are vLLM's independent "external DP"
    replicas, never one DP engine whose ranks wait on each other's dummy batches."""
    assert vllm_parallel_kwargs(1, rank=None, world_size=None, visible_gpus=2) == ({"tensor_parallel_size": 1}, {})
    kwargs, env = vllm_parallel_kwargs(2, rank=5, world_size=8, visible_gpus=1)
    assert kwargs == {"tensor_parallel_size": 2, "data_parallel_size": 1,
                      "distributed_executor_backend": "external_launcher"}
    assert env == {"RANK": "5", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}
    assert vllm_parallel_kwargs(1, rank=0, world_size=4, visible_gpus=1)[0]["data_parallel_size"] == 1
    with pytest.raises(ValueError, match="does not divide"):
        vllm_parallel_kwargs(3, rank=0, world_size=4, visible_gpus=1)
    with pytest.raises(ValueError, match="inside a torch.distributed world"):
        vllm_parallel_kwargs(2, rank=None, world_size=None, visible_gpus=1)
    with pytest.raises(ValueError, match="sees 2 GPUs; a vLLM rollout worker must see exactly one"):
        vllm_parallel_kwargs(2, rank=1, world_size=4, visible_gpus=2)


def test_a_call_asking_for_log_probs_the_engine_cannot_give_is_refused(tmp_path):
    """The config check sees the sampling defaults; a call's meta_info may ask for more."""

    class VLLMLogProbs(ReferenceExternalEngine):  # the shared code, with vLLM's log-prob rule
        def _log_prob_problem(self, p):
            return log_prob_mismatch("vllm", self.config.log_prob_mode, greedy=p.greedy, top_k=p.top_k, top_p=p.top_p)

    path = save_model(tmp_path / "m", "llama", seed=1)
    engine = VLLMLogProbs(load_hf_config(path), RolloutConfig(dtype=torch.float32), model_path=str(path))
    engine.load_weights(iter_safetensors(path))
    batch = left_padded([3, 2], vocab=256)
    engine.generate(batch, SamplingParams(temperature=0.7, max_new_tokens=2))
    batch.meta_info.update({"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 2})
    with pytest.raises(ValueError, match="rollout.log_prob_mode=processed"):
        engine.generate(batch)
