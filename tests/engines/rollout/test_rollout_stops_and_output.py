"""Stop ids, eos, stop strings, finish reasons, and the layout of the returned DataProto."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rollout_helpers import char_tokenizer, left_padded

from hybridflow.engines.models import load_hf_config
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.engines.rollout.weights import iter_safetensors
from hybridflow.protocol import DataProto

FP32 = RolloutConfig(dtype=torch.float32)
LENGTHS = [4, 9, 2, 6]


@pytest.fixture(scope="module")
def free_run(tiny_llama_dir):
    """Greedy responses with no stopping at all: the reference the stop tests cut."""
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32)
    batch = left_padded(LENGTHS, vocab=256, seed=21)
    out = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True))
    return batch, out.batch["responses"].tolist()


def _expected_cut(free: list[int], stop_ids: set[int]) -> int:
    """Length of the response when it stops after the first token in stop_ids (inclusive)."""
    for i, tok in enumerate(free):
        if tok in stop_ids:
            return i + 1
    return len(free)


def test_stop_token_ids_end_each_row_at_first_hit(tiny_llama_dir, free_run):
    batch, free = free_run
    stop = {free[0][3], free[2][5]}
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32)
    out = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=tuple(stop),
                                                ignore_eos=True))
    cuts = [_expected_cut(f, stop) for f in free]
    assert cuts[0] <= 4 and cuts[2] <= 6
    for row, cut in enumerate(cuts):
        assert out.batch["responses"][row, :cut].tolist() == free[row][:cut]
        assert out.batch["response_mask"][row].sum().item() == cut
        assert (out.batch["responses"][row, cut:] == 0).all()
        hit = free[row][cut - 1] in stop
        assert out.non_tensor_batch["finish_reason"][row] == ("stop" if hit else "length")


def test_eos_from_config_stops_unless_ignored(tiny_llama_dir, free_run):
    batch, free = free_run
    config = load_hf_config(tiny_llama_dir)
    config.eos_token_id = [free[1][2]]
    engine = NativeRolloutEngine(config, FP32)
    engine.load_weights(iter_safetensors(tiny_llama_dir))
    out = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=24))
    assert out.batch["response_mask"][1].sum().item() == _expected_cut(free[1], {free[1][2]}) <= 3
    assert out.non_tensor_batch["finish_reason"][1] == "stop"
    ignored = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True))
    assert ignored.batch["responses"].tolist() == free


def test_stop_strings_end_at_the_completing_token(tiny_llama_dir, free_run):
    batch, free = free_run
    tokenizer, chars = char_tokenizer(256)
    text0 = "".join(chars[t] for t in free[0])
    stop = text0[5:7]  # spans two tokens
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32, tokenizer=tokenizer)
    out = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=24, stop=("never-there", stop),
                                                ignore_eos=True))
    for row, ref in enumerate(free):
        text = "".join(chars[t] for t in ref)
        where = text.find(stop)
        cut = where + len(stop) if where >= 0 else 24
        assert out.batch["responses"][row, :cut].tolist() == ref[:cut]
        assert out.batch["response_mask"][row].sum().item() == cut
        assert out.non_tensor_batch["finish_reason"][row] == ("stop" if where >= 0 else "length")
    assert out.batch["response_mask"][0].sum().item() <= 7


def test_stop_strings_without_tokenizer_is_an_error(tiny_llama_dir):
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.generate(left_padded([3], vocab=256), SamplingParams(stop=("x",)))


def test_output_layout_and_passthrough(tiny_llama_dir):
    batch = left_padded([3, 7], vocab=256, seed=22)
    batch.non_tensor_batch["uid"] = np.array(["a", "b"], dtype=object)
    batch.meta_info["step"] = 4
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32)
    out = engine.generate(batch, SamplingParams(temperature=1.0, max_new_tokens=6, n=3, seed=1, ignore_eos=True))
    b = out.batch
    assert len(out) == 6 and list(out.non_tensor_batch["uid"]) == ["a"] * 3 + ["b"] * 3
    assert out.meta_info["step"] == 4
    assert torch.equal(b["prompts"], batch.batch["input_ids"].repeat_interleave(3, dim=0))
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    prompt_mask = batch.batch["attention_mask"].repeat_interleave(3, dim=0)
    assert torch.equal(b["attention_mask"], torch.cat([prompt_mask, b["response_mask"]], dim=1))
    # positions count real tokens from 0 and continue through the response
    assert torch.equal(b["position_ids"][:, -6:], torch.tensor([[3, 4, 5, 6, 7, 8]] * 3 + [[7, 8, 9, 10, 11, 12]] * 3))
    assert b["rollout_log_probs"].dtype == torch.float32 and (b["rollout_log_probs"] < 0).all()
    assert out.non_tensor_batch["finish_reason"].dtype == object


def test_meta_info_selects_greedy_and_length(tiny_llama_dir):
    batch = left_padded([5, 2], vocab=256, seed=23)
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, FP32)
    explicit = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=5, ignore_eos=True))
    batch.meta_info.update({"do_sample": False, "response_length": 5, "ignore_eos": True, "temperature": 1.0})
    from_meta = engine.generate(batch)
    assert torch.equal(explicit.batch["responses"], from_meta.batch["responses"])


def test_bad_inputs_raise_clear_errors(tiny_llama_dir):
    engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, RolloutConfig(dtype=torch.float32, max_model_len=16))
    batch = left_padded([5, 2], vocab=256)
    right_padded = DataProto.from_dict(tensors={k: v.flip(1) for k, v in batch.batch.items()})
    with pytest.raises(ValueError, match="LEFT-padded"):
        engine.generate(right_padded, SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(batch, SamplingParams(max_new_tokens=12))
    with pytest.raises(ValueError, match="one per prompt"):
        engine.generate(batch, [SamplingParams()] * 3)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
