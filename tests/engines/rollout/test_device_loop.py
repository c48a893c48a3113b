"""The device decode loop (device_loop.py) against the per-token host loop, on CPU, fp32.

Same tokens (greedy and seeded sampling with temperature, top-k, top-p, stop ids and stop
strings), whatever the slot count, the readback interval, the bucket padding or the KV
length a step reads; log-probs equal to an HF forward; prompts longer than the prefill
budget prefilled in pieces. Log-probs of the two loops agree within 1e-5 (fp32 GEMMs over
a different number of rows sum in different orders).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from rollout_helpers import (char_tokenizer, full_forward_log_probs, left_padded, load_hf, save_model,
                             truncated_log_probs)

from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.engines.rollout.device_loop import bucket_of
from hybridflow.errors import ConfigError

LENGTHS = [5, 12, 1, 9, 3]
BUDGETS = [20, 7, 14, 20, 3]
PARAMS = {
    "greedy": [SamplingParams(temperature=0.0, max_new_tokens=b, ignore_eos=True) for b in BUDGETS],
    "truncated_with_stops": [SamplingParams(temperature=0.8, top_k=30, top_p=0.9, max_new_tokens=b, n=2, seed=3,
                                            stop_token_ids=(5, 9)) for b in BUDGETS],
    "mixed_rows": [SamplingParams(temperature=0.0, max_new_tokens=9), SamplingParams(temperature=1.3, max_new_tokens=16,
                                                                                       seed=1),
                   SamplingParams(top_p=0.5, max_new_tokens=4, seed=2), SamplingParams(top_k=3, max_new_tokens=11,
                                                                                       seed=3),
                   SamplingParams(max_new_tokens=1, seed=4)],
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("device_loop") / "m", "llama", seed=1, logit_scale=4.0)


def engine(path, **kw) -> NativeRolloutEngine:
    return NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32, **kw))


def assert_same(out, ref) -> None:
    assert torch.equal(out.batch["responses"], ref.batch["responses"])
    assert torch.equal(out.batch["response_mask"], ref.batch["response_mask"])
    assert torch.allclose(out.batch["rollout_log_probs"], ref.batch["rollout_log_probs"], atol=1e-5)
    assert list(out.non_tensor_batch["finish_reason"]) == list(ref.non_tensor_batch["finish_reason"])


def test_device_loop_generates_the_host_loops_tokens(model_dir):
    """Every parameter set through one engine per (slots, readback) pair: state reused and grown."""
    batch = left_padded(LENGTHS, vocab=256, seed=2)
    refs = {kind: engine(model_dir, max_num_seqs=3, decode_loop="host").generate(batch, params)
            for kind, params in PARAMS.items()}
    assert "stop" in refs["truncated_with_stops"].non_tensor_batch["finish_reason"]
    for slots, readback in ((1, 1), (3, 4)):
        device = engine(model_dir, max_num_seqs=slots, decode_loop="device", readback_every=readback)
        for kind, params in PARAMS.items():
            assert_same(device.generate(batch, params), refs[kind])
            stats = device.last_stats
            assert stats.generated_tokens == int(refs[kind].batch["response_mask"].sum())
            if slots == 3:
                assert stats.slot_moves > 0  # compaction moved survivors into freed slots
            # read back every `readback` steps at most, not every token
            assert stats.readbacks >= stats.decode_steps / readback


def test_bucket_padding_and_kv_length_do_not_change_rows(model_dir):
    assert [bucket_of(n, 256) for n in (1, 3, 5, 17, 33, 65, 250)] == [1, 4, 8, 32, 64, 96, 256]
    assert bucket_of(5, 6) == 6
    batch = left_padded(LENGTHS, vocab=256, seed=5)
    params = [dataclasses.replace(p, seed=11) for p in PARAMS["truncated_with_stops"]]
    together = engine(model_dir, decode_loop="device")
    out = together.generate(batch, params)
    rows_per_step = together.last_stats.decode_row_steps / together.last_stats.decode_steps
    assert rows_per_step > together.last_stats.max_live / 2 and together.last_stats.decode_row_steps > (
        together.last_stats.generated_tokens - together.last_stats.requests)  # padding rows were computed
    # the fixed shapes of captured steps: KV read up to a multiple of KV_BLOCK, not max position + 1
    rounded = engine(model_dir, decode_loop="device")
    rounded._steps.static_shapes = True
    assert_same(rounded.generate(batch, params), out)
    # two slots: the two samples of one prompt at a time, a bucket of 2, never a padding row
    exact = engine(model_dir, decode_loop="device", max_num_seqs=2)
    assert_same(exact.generate(batch, params), out)
    assert exact.last_stats.decode_row_steps < together.last_stats.decode_row_steps


@pytest.mark.parametrize("mode", ["scaled", "processed"])
def test_device_loop_log_probs_equal_an_hf_forward(mode, tmp_path):
    path = save_model(tmp_path / "q", "qwen2", seed=3, logit_scale=4.0)
    temp, top_k, top_p = 0.7, 20, 0.9
    out = engine(path, decode_loop="device", log_prob_mode=mode).generate(
        left_padded([4, 11, 7], vocab=256, seed=4),
        SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, max_new_tokens=12, n=2, seed=5, ignore_eos=True))
    hf = load_hf(path)
    expected = (full_forward_log_probs(hf, out, temperature=temp) if mode == "scaled"
                else truncated_log_probs(hf, out, temp, top_k, top_p))
    mask = out.batch["response_mask"].bool()
    got = out.batch["rollout_log_probs"]
    assert torch.allclose(got[mask], expected[mask], atol=1e-4), (got[mask] - expected[mask]).abs().max()


def test_stop_strings_found_between_readbacks(model_dir):
    tokenizer, chars = char_tokenizer(256)
    batch = left_padded(LENGTHS, vocab=256, seed=21)
    host = NativeRolloutEngine.from_pretrained(model_dir, RolloutConfig(dtype=torch.float32, decode_loop="host"),
                                               tokenizer=tokenizer)
    free = host.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True))
    text = free.batch["responses"][3].tolist()
    stop = "".join(chars[t] for t in text[6:8])  # spans two tokens, found mid-way through a readback window
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop=("never-there", stop), ignore_eos=True)
    ref = host.generate(batch, params)
    assert "stop" in ref.non_tensor_batch["finish_reason"]
    device = NativeRolloutEngine.from_pretrained(
        model_dir, RolloutConfig(dtype=torch.float32, decode_loop="device", readback_every=5), tokenizer=tokenizer)
    assert_same(device.generate(batch, params), ref)


@pytest.mark.parametrize("loop", ["host", "device"])
def test_prompts_longer_than_the_budget_are_prefilled_in_pieces(loop, model_dir):
    batch = left_padded([13, 3, 9], vocab=256, seed=8)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, n=2, seed=2, ignore_eos=True)
    whole = engine(model_dir, decode_loop=loop).generate(batch, params)
    pieces = engine(model_dir, decode_loop=loop, prefill_token_budget=4)
    assert_same(pieces.generate(batch, params), whole)
    # 13 -> 4 pieces, 9 -> 3, and 3 alone: every prompt token computed once
    assert pieces.last_stats.prefill_calls == 8 and pieces.last_stats.prefill_tokens_computed == 25


def test_decode_loop_settings_resolve_and_refuse_clearly():
    assert RolloutConfig().decode_loop == "host"  # CPU: the per-token loop measured faster
    assert RolloutConfig(device="cuda", dtype="bf16").decode_loop == "device"
    with pytest.raises(ConfigError, match="decode_loop") as err:
        RolloutConfig(decode_loop="gpu")
    assert err.value.key == "decode_loop"
    for kw, key in ((dict(cuda_graphs=True, decode_loop="device"), "cuda_graphs"),
                    (dict(compile_decode=True), "compile_decode"), (dict(readback_every=0), "readback_every")):
        with pytest.raises(ConfigError) as err:
            RolloutConfig(**kw)
        assert err.value.key == key
