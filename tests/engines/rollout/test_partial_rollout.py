"""Partial rollouts (engines/rollout/partial.py): pause, new weights, continue."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engines.rollout import RolloutConfig, SamplingParams
from hybridflow.engines.rollout.engine import NativeRolloutEngine
from hybridflow.engines.rollout.partial import POLICY_VERSION, StreamingRollout
from hybridflow.engines.rollout.weights import iter_safetensors
from tests.engines.rollout.rollout_helpers import full_forward_log_probs, left_padded, load_hf, save_model

VOCAB = 128


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("partial")
    return save_model(root / "a", seed=0), save_model(root / "b", seed=1)


def _engine(path):
    return NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32, max_num_seqs=8))


PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=5, ignore_eos=True)


def test_unpaused_stream_equals_one_generate_call(models):
    engine = _engine(models[0])
    prompts = left_padded([5, 3, 7], VOCAB, seed=1)
    ref = engine.generate(prompts, PARAMS)
    stream = StreamingRollout(engine, slots=8, max_len=64)
    stream.add(prompts, PARAMS)
    stream.run()
    (out,) = stream.pop_finished()
    assert torch.equal(out.batch["responses"], ref.batch["responses"])
    assert torch.equal(out.batch["rollout_log_probs"], ref.batch["rollout_log_probs"])
    mask = out.batch["response_mask"].bool()
    assert bool((out.batch[POLICY_VERSION][mask] == 0).all()) and bool((out.batch[POLICY_VERSION][~mask] == -1).all())
    assert stream.in_flight == 0 and stream.pop_finished() == []


def test_sequence_continues_after_a_weight_change(models):
    a, b = models
    engine = _engine(a)
    prompts = left_padded([5, 3, 7], VOCAB, seed=2)
    before = engine.generate(prompts, PARAMS)  # what the old weights would have sampled throughout
    stream = StreamingRollout(engine, slots=8, max_len=64)
    stream.add(prompts, PARAMS)
    stream.run(max_steps=5)  # prefill + 4 decode steps: 5 tokens per sequence under version 0
    assert stream.in_flight == 6 and stream.pop_finished() == []
    kept = {(r.prompt_row, r.sample_index): list(r.tokens) for r in stream.live}
    stream.load_weights(iter_safetensors(b), version=1)
    stream.run()
    (out,) = stream.pop_finished()
    assert stream.recomputed_tokens > 0  # the live sequences were re-prefilled under the new weights
    versions = out.batch[POLICY_VERSION]
    for i, (row, k) in enumerate(sorted(kept)):
        n_old = len(kept[(row, k)])
        # the same sequence continues: its first tokens are the ones sampled before the pause
        assert out.batch["responses"][i, :n_old].tolist() == kept[(row, k)]
        assert versions[i, :n_old].tolist() == [0] * n_old and versions[i, n_old:12].tolist() == [1] * (12 - n_old)
        assert out.batch["responses"][i, :n_old].tolist() == before.batch["responses"][i, :n_old].tolist()
    # behaviour log-probs: tokens of version 0 under model a, tokens of version 1 under model b,
    # each given the whole prefix (KV recomputed, not reused from the old weights)
    lp_a, lp_b = full_forward_log_probs(load_hf(a), out), full_forward_log_probs(load_hf(b), out)
    expected = torch.where(versions == 0, lp_a, lp_b)
    mask = out.batch["response_mask"].bool()
    assert torch.allclose(out.batch["rollout_log_probs"][mask], expected[mask], atol=2e-4)
    assert not torch.equal(out.batch["responses"], before.batch["responses"])  # the new weights did matter


def test_groups_are_popped_as_they_finish(models):
    engine = _engine(models[0])
    prompts = left_padded([4, 4], VOCAB, seed=3)
    stream = StreamingRollout(engine, slots=8, max_len=64)
    stream.add(prompts[[0]], SamplingParams(max_new_tokens=3, n=2, seed=1, ignore_eos=True))
    stream.add(prompts[[1]], SamplingParams(max_new_tokens=10, n=2, seed=2, ignore_eos=True))
    stream.run(max_steps=4)
    first = stream.pop_finished()
    assert len(first) == 1 and len(first[0]) == 2 and first[0].batch["responses"].shape[1] == 3
    stream.run()
    second = stream.pop_finished()
    assert len(second) == 1 and second[0].batch["response_mask"].sum().item() == 20
    with pytest.raises(ValueError, match="seed"):
        stream.add(prompts, SamplingParams(max_new_tokens=3))
