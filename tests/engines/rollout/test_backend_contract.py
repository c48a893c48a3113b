"""The RolloutEngine contract, run against every built-in backend (native, hf, vllm, sglang).

Whatever generates, workers and the HybridEngine rely on the same behaviour: output keys,
shapes and dtypes; response_mask, finish_reason and stop tokens that agree; log-probs
that a forward pass of the same model reproduces; n samples per prompt; weights that can
be released, resumed and reloaded (weight sync); storage accounting. Greedy decoding is
deterministic, so all backends must produce the same tokens from the same weights.

Engines are built through the registry's factory (`build_rollout_engine`); every built-in
backend is in BACKENDS (test_every_builtin_backend_is_tested). The external engines
(vllm, sglang) run where their package is importable and a CUDA device is present and are
skipped with the reason otherwise (`unavailable`); their shared code runs everywhere as
"external_reference" (external_reference.py: the native engine behind the same hooks).
Nothing here is specific to a backend
but its device (`config`) and, for the log-prob test, the truncation settings whose
log-probs the engine can return (external.log_prob_mismatch).
Precision and tolerances. native, hf and external_reference run in fp32: log-probs within
1e-4 of an HF fp32 forward and across backends (KV-cache decoding and a full forward sum
in different orders); tokens and masks exactly. vllm and sglang run in bf16, as they are
used: fp32 is not a configuration either supports faithfully on a GPU (vLLM's Triton
attention computes fp32 dots in TF32 unless TRITON_F32_DEFAULT=ieee; SGLang's default H100
attention, FA3, has no fp32 kernel). Their log-probs are held within BF16_ATOL = 0.1 of
the fp32 reference: a logit z carries bf16's relative rounding 2^-8, and |z / T| <= 4.1
here (|z| <= 2.9, T = 0.7), so one rounding moves a log-prob by up to ~0.016; the native
engine in bf16 on this CPU measured 0.017 max (0.004 mean) against the fp32 forward on
these models, and 0.1 leaves ~6x for the GPU kernels' other summation orders. Greedy
tokens are compared exactly up to each row's first step whose fp32 top-2 logit margin is
below BF16_MARGIN = 0.05 logits (~4x the 0.012 logit error measured likewise): a near-tie
a bf16 engine may break either way, after which the paths may part. These tiny random
models have such near-ties early in some rows (margins down to 0.001), so the bf16
comparison covers 0-20 steps per row, not all of them.

One engine per test process: a vllm or sglang case runs in a child pytest process of its
own (`isolated` marker, conftest.py), and builds one engine there (a garbage-collected
in-process vLLM engine tears down the process groups the next one shares), compared with
the native engine where a reference is needed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from external_reference import registered
from rollout_helpers import (
    build_engine,
    char_tokenizer,
    full_forward_log_probs,
    left_padded,
    load_hf,
    save_model,
    truncated_log_probs,
)

from hybridflow.engines.models import load_hf_config
from hybridflow.engines.rollout import RolloutConfig, SamplingParams, rollout_backend, rollout_backends
from hybridflow.engines.rollout.external import EXTERNAL_ENGINES, is_installed, log_prob_mismatch
from hybridflow.engines.rollout.weights import iter_safetensors
from hybridflow.protocol import DataProto

ALL_BACKENDS = ("native", "hf", "vllm", "sglang")
# + the shared code of the vllm/sglang adapters over the native engine (external_reference.py)
TESTED = (*ALL_BACKENDS, "external_reference")
OUTPUT_KEYS = {"prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids",
               "rollout_log_probs"}
LENGTHS = [4, 9, 2, 6]


def unavailable(backend: str) -> str | None:
    """Why `backend` cannot run here (None: it can)."""
    if backend not in EXTERNAL_ENGINES:
        return None
    if not is_installed(EXTERNAL_ENGINES[backend].package):
        return f"{backend} is not installed here"
    if not torch.cuda.is_available():
        return f"{backend} needs a CUDA device"
    return None


BACKENDS = tuple(pytest.param(b, marks=[pytest.mark.skipif(unavailable(b) is not None, reason=str(unavailable(b))),
                                         *([pytest.mark.isolated] if b in EXTERNAL_ENGINES else [])])
                 for b in TESTED)
BF16_ATOL = 0.1  # external engines' bf16 log-probs against the fp32 reference (module docstring)
BF16_MARGIN = 0.05  # fp32 top-2 logit margin below which a bf16 engine may pick the other token
RUNNABLE = tuple(b for b in TESTED if unavailable(b) is None)


@pytest.fixture(scope="module", autouse=True)
def _reference_backend():
    with registered():
        yield


def config(backend: str, **kw) -> RolloutConfig:
    """fp32 on CPU; the external engines in bf16 on CUDA (module docstring)."""
    external = backend in EXTERNAL_ENGINES
    return RolloutConfig(dtype=kw.pop("dtype", torch.bfloat16 if external else torch.float32),
                         device="cuda" if external else "cpu", **kw)


def atol(backend: str) -> float:
    return BF16_ATOL if backend in EXTERNAL_ENGINES else 1e-4


def robust_steps(path, out: DataProto, margin: float) -> list[int]:
    """Per row, the response steps before the first whose fp32 top-2 logit margin (HF
    forward of the model at `path` over `out`) is below `margin`."""
    with torch.no_grad():
        logits = load_hf(path)(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                               position_ids=out.batch["position_ids"]).logits.float()
    p = out.batch["prompts"].shape[1]
    top2 = logits[:, p - 1 : -1].topk(2, dim=-1).values
    near = (top2[..., 0] - top2[..., 1]) < margin
    return [int(row.nonzero()[0, 0]) if row.any() else len(row) for row in near]


def build(backend: str, path, rollout_config: RolloutConfig | None = None, **kw):
    return build_engine(backend, path, rollout_config or config(backend), **kw)


@pytest.fixture(autouse=True)
def _small_gpu_share(monkeypatch):
    """An external engine takes a small share of the GPU: other test processes may hold one too."""
    for name in RUNNABLE:
        if name in EXTERNAL_ENGINES:
            cls = rollout_backend(name)
            attr = "gpu_memory_utilization" if name == "vllm" else "mem_fraction_static"
            monkeypatch.setattr(cls, attr, 0.12)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """Perturbed tiny models with sharp logits (no greedy near-ties): llama, qwen2, another llama."""
    root = tmp_path_factory.mktemp("contract")
    return {
        "llama": save_model(root / "llama", "llama", seed=11, logit_scale=4.0),
        "qwen2": save_model(root / "qwen2", "qwen2", seed=12, logit_scale=4.0),
        "other": save_model(root / "other", "llama", seed=13, logit_scale=4.0),
    }


def _greedy(max_new_tokens: int = 16, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, **kw)


def test_every_builtin_backend_is_tested():
    builtin = {n for n in rollout_backends() if rollout_backend(n).__module__.startswith("hybridflow.")}
    assert builtin == set(ALL_BACKENDS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_keys_shapes_and_passthrough(backend, models):
    batch = left_padded([3, 7], vocab=256, seed=22)
    batch.non_tensor_batch["uid"] = np.array(["a", "b"], dtype=object)
    batch.meta_info["step"] = 4
    engine = build(backend, models["llama"])
    out = engine.generate(batch, SamplingParams(temperature=1.0, max_new_tokens=6, n=3, seed=1, ignore_eos=True))
    b = out.batch
    assert set(b.keys()) == OUTPUT_KEYS and set(out.non_tensor_batch) == {"uid", "finish_reason"}
    assert len(out) == 6 and list(out.non_tensor_batch["uid"]) == ["a"] * 3 + ["b"] * 3
    assert out.meta_info["step"] == 4
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert b[key].dtype == torch.long, key
    assert b["rollout_log_probs"].dtype == torch.float32
    assert b["responses"].shape == b["response_mask"].shape == b["rollout_log_probs"].shape == (6, 6)
    assert torch.equal(b["prompts"], batch.batch["input_ids"].repeat_interleave(3, dim=0))
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    prompt_mask = batch.batch["attention_mask"].repeat_interleave(3, dim=0)
    assert torch.equal(b["attention_mask"], torch.cat([prompt_mask, b["response_mask"]], dim=1))
    assert torch.equal(b["position_ids"][:, -6:], torch.tensor([[3, 4, 5, 6, 7, 8]] * 3 + [[7, 8, 9, 10, 11, 12]] * 3))
    assert (b["rollout_log_probs"] < 0).all() and list(out.non_tensor_batch["finish_reason"]) == ["length"] * 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_response_mask_agrees_with_finish_reason_and_eos(backend, models):
    """With two frequent tokens as eos: a "stop" row ends on an eos token and is masked
    after it, a "length" row contains no eos and fills its budget; greedy and sampled."""
    path = models["llama"]
    batch = left_padded(LENGTHS, vocab=256, seed=21)
    # eos: two tokens the model emits (read off the native engine, so one engine of `backend` is built)
    native = build("native", path).generate(batch, _greedy(24, ignore_eos=True)).batch["responses"].tolist()
    config = load_hf_config(path)
    eos = {native[1][2], native[3][4]}
    config.eos_token_id = sorted(eos)
    engine = build(backend, path, hf_config=config)
    free = engine.generate(batch, _greedy(24, ignore_eos=True)).batch["responses"].tolist()
    for params in (_greedy(24), SamplingParams(temperature=1.0, max_new_tokens=24, n=4, seed=3)):
        out = engine.generate(batch, params)
        reasons = out.non_tensor_batch["finish_reason"]
        for row in range(len(out)):
            mask, tokens = out.batch["response_mask"][row], out.batch["responses"][row]
            n = int(mask.sum())
            assert mask[:n].all() and not mask[n:].any(), row
            assert (tokens[n:] == 0).all() and (out.batch["rollout_log_probs"][row, n:] == 0).all()
            hits = [i for i, t in enumerate(tokens[:n].tolist()) if t in eos]
            if reasons[row] == "stop":
                assert hits == [n - 1], (row, hits, n)
            else:
                assert reasons[row] == "length" and not hits and n == 24, (row, hits, n)
        assert "stop" in set(reasons)
    assert engine.generate(batch, _greedy(24, ignore_eos=True)).batch["responses"].tolist() == free


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_identical_across_backends(family, backend, models):
    """Per-row budgets and eos on: the same tokens, masks and finish reasons as the native
    fp32 engine (bf16 engines: up to each row's first near-tie, module docstring)."""
    batch = left_padded([5, 12, 1, 9, 3], vocab=256, seed=2)
    params = [_greedy(b) for b in (20, 7, 14, 20, 3)]
    ref = build("native", models[family]).generate(batch, params)
    out = build(backend, models[family]).generate(batch, params)
    assert ref.batch["response_mask"].sum(1).tolist() == [20, 7, 14, 20, 3]  # the budgets bind
    if backend not in EXTERNAL_ENGINES:
        for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
            assert torch.equal(out.batch[key], ref.batch[key]), (backend, key)
        assert list(out.non_tensor_batch["finish_reason"]) == list(ref.non_tensor_batch["finish_reason"])
        steps = [out.batch["responses"].shape[1]] * len(out)
    else:
        steps = robust_steps(models[family], ref, BF16_MARGIN)
        assert sum(steps) > 0  # the models leave some robust steps to compare
        for row, n in enumerate(steps):
            assert torch.equal(out.batch["responses"][row, :n], ref.batch["responses"][row, :n]), (row, n)
    for row, n in enumerate(steps):
        diff = (out.batch["rollout_log_probs"][row, :n] - ref.batch["rollout_log_probs"][row, :n]).abs()
        assert n == 0 or diff.max() < atol(backend), (backend, row, diff.max())


@pytest.mark.parametrize("mode", ["scaled", "processed"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rollout_log_probs_equal_a_forward_pass(backend, mode, models):
    path = models["qwen2"]
    temp = 0.7
    # the sharpest truncation whose log-probs this backend returns in this mode
    top_k, top_p = next((k, p) for k, p in ((20, 0.9), (20, 1.0), (-1, 0.9), (-1, 1.0))
                        if backend not in EXTERNAL_ENGINES
                        or log_prob_mismatch(backend, mode, greedy=False, top_k=k, top_p=p) is None)
    engine = build(backend, path, config(backend, log_prob_mode=mode))
    out = engine.generate(left_padded([4, 11, 7], vocab=256, seed=4),
                          SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, max_new_tokens=12, n=2, seed=5,
                                         ignore_eos=True))
    hf = load_hf(path)
    if mode == "scaled":
        expected = full_forward_log_probs(hf, out, temperature=temp)
    else:
        expected = truncated_log_probs(hf, out, temp, top_k, top_p)
    mask = out.batch["response_mask"].bool()
    got = out.batch["rollout_log_probs"]
    assert torch.allclose(got[mask], expected[mask], atol=atol(backend)), (got[mask] - expected[mask]).abs().max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_token_ids_and_stop_strings(backend, models):
    path = models["llama"]
    batch = left_padded(LENGTHS, vocab=256, seed=21)
    tokenizer, chars = char_tokenizer(256)
    engine = build(backend, path, tokenizer=tokenizer)
    free = engine.generate(batch, _greedy(24, ignore_eos=True)).batch["responses"].tolist()
    stop_ids = {free[0][3], free[2][5]}
    stop_text = "".join(chars[t] for t in free[3][6:8])  # spans two tokens
    for params, hit_at in (
        (_greedy(24, stop_token_ids=tuple(stop_ids), ignore_eos=True),
         lambda ref: next((i + 1 for i, t in enumerate(ref) if t in stop_ids), None)),
        (_greedy(24, stop=("never-there", stop_text), ignore_eos=True),
         lambda ref: _string_end("".join(chars[t] for t in ref), stop_text)),
    ):
        out = engine.generate(batch, params)
        for row, ref in enumerate(free):
            cut = hit_at(ref)
            n = cut if cut is not None else 24
            assert out.batch["responses"][row, :n].tolist() == ref[:n], row
            assert int(out.batch["response_mask"][row].sum()) == n, row
            assert out.non_tensor_batch["finish_reason"][row] == ("stop" if cut is not None else "length")
        assert list(out.non_tensor_batch["finish_reason"]).count("stop") >= 1


def _string_end(text: str, stop: str) -> int | None:
    where = text.find(stop)
    return None if where < 0 else where + len(stop)


@pytest.mark.parametrize("backend", BACKENDS)
def test_n_samples_and_seeds(backend, models):
    batch = left_padded([5, 3], vocab=256, seed=9)
    engine = build(backend, models["llama"])
    params = SamplingParams(temperature=1.0, max_new_tokens=10, n=4, seed=7, ignore_eos=True)
    out = engine.generate(batch, params)
    responses = out.batch["responses"]
    assert len(out) == 8 and torch.equal(out.batch["prompts"], batch.batch["input_ids"].repeat_interleave(4, dim=0))
    assert len({tuple(r) for r in responses[:4].tolist()}) > 1  # samples of one prompt differ
    assert torch.equal(engine.generate(batch, params).batch["responses"], responses)  # a seed reproduces
    other_seed = SamplingParams(temperature=1.0, max_new_tokens=10, n=4, seed=8, ignore_eos=True)
    assert not torch.equal(engine.generate(batch, other_seed).batch["responses"], responses)
    # unseeded calls draw afresh every time
    unseeded = SamplingParams(temperature=1.0, max_new_tokens=10, n=4, ignore_eos=True)
    assert not torch.equal(engine.generate(batch, unseeded).batch["responses"],
                           engine.generate(batch, unseeded).batch["responses"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_release_resume_and_storage_accounting(backend, models):
    path = models["llama"]
    batch = left_padded([4, 6], vocab=256)
    engine = build(backend, path)
    ref = engine.generate(batch, _greedy()).batch["responses"]
    full = engine.weight_storage_bytes()
    itemsize = torch.empty((), dtype=config(backend).dtype).element_size()
    assert full == sum(t.numel() * itemsize for _, t in iter_safetensors(path))  # untied: every tensor once
    engine.release_memory(keep_weights=True)  # moved off the device (on CPU they simply stay)
    engine.resume_memory()
    assert torch.equal(engine.generate(batch, _greedy()).batch["responses"], ref)
    engine.release_memory()
    assert engine.weight_storage_bytes() == 0
    with pytest.raises(RuntimeError, match="resume_memory"):
        engine.generate(batch, _greedy())
    engine.resume_memory()
    assert engine.weight_storage_bytes() == full
    with pytest.raises(RuntimeError, match="never loaded"):
        engine.generate(batch, _greedy())
    engine.load_weights(iter_safetensors(path))
    assert torch.equal(engine.generate(batch, _greedy()).batch["responses"], ref)
    if backend not in EXTERNAL_ENGINES:  # (one engine per process for those: they run in bf16 already)
        bf16 = build(backend, path, config(backend, dtype=torch.bfloat16))
        assert bf16.weight_storage_bytes() == full // 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_weights_twice_follows_the_weights(backend, models):
    """Weight sync: after loading another model the engine generates like that model, and
    loading the first one again brings its outputs back."""
    batch = left_padded([5, 3, 8], vocab=256, seed=5)
    engine = build(backend, models["other"])  # one engine: its first weights are the reference
    fresh = engine.generate(batch, _greedy())
    engine.load_weights(iter_safetensors(models["llama"]))
    before = engine.generate(batch, _greedy())
    engine.load_weights(iter_safetensors(models["other"]))
    after = engine.generate(batch, _greedy())
    assert torch.equal(after.batch["responses"], fresh.batch["responses"])
    assert torch.equal(after.batch["rollout_log_probs"], fresh.batch["rollout_log_probs"])
    assert not torch.equal(after.batch["responses"], before.batch["responses"])
    engine.load_weights(iter_safetensors(models["llama"]))
    assert torch.equal(engine.generate(batch, _greedy()).batch["responses"], before.batch["responses"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_meta_info_selects_greedy_and_length(backend, models):
    batch = left_padded([5, 2], vocab=256, seed=23)
    engine = build(backend, models["llama"])
    explicit = engine.generate(batch, _greedy(5, ignore_eos=True))
    batch.meta_info.update({"do_sample": False, "response_length": 5, "ignore_eos": True, "temperature": 1.0})
    assert torch.equal(engine.generate(batch).batch["responses"], explicit.batch["responses"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_raises_clear_errors(backend, models):
    engine = build(backend, models["llama"], config(backend, max_model_len=16))
    batch = left_padded([5, 2], vocab=256)
    right_padded = DataProto.from_dict(tensors={k: v.flip(1) for k, v in batch.batch.items()})
    with pytest.raises(ValueError, match="LEFT-padded"):
        engine.generate(right_padded, SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(batch, SamplingParams(max_new_tokens=12))
    with pytest.raises(ValueError, match="one per prompt"):
        engine.generate(batch, [SamplingParams()] * 3)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.generate(batch, SamplingParams(max_new_tokens=2, stop=("x",)))
    with pytest.raises(KeyError, match="unknown parameter"):
        engine.load_weights([("model.layers.9.self_attn.q_proj.weight", torch.zeros(64, 64))])
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([("model.layers.0.self_attn.q_proj.weight", torch.zeros(3, 64))])


@pytest.mark.isolated
def test_isolated_cases_run_in_a_child_process():
    """The `isolated` marker (every vllm / sglang case) runs the test in a child pytest of its own."""
    assert os.environ.get("HYBRIDFLOW_ISOLATED_CHILD") == "1"
