"""Multi-turn continuation on the native engine (engines/rollout/turns.py).

A sequence that pauses, gets observation tokens appended and continues from its KV cache
must produce the same tokens as generating from scratch on the whole prefix (greedy), for
plain causal attention and for Mistral's sliding window; sampled sequences do not depend
on which other sequences share the steps; paused sequences take no decode rows.
"""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import left_padded, save_model

from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.engines.rollout.turns import TurnEngine

CASES = {"llama": ("llama", {}), "mistral_window6": ("mistral", {"sliding_window": 6})}


def _engine(tmp_path, family="llama", overrides=None):
    path = save_model(tmp_path / family, family, seed=1, logit_scale=4.0, config_overrides=overrides or {})
    return NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32, max_num_seqs=8))


def _from_scratch(engine, prefix: list[int], budget: int) -> list[int]:
    batch = left_padded([len(prefix)], vocab=256)
    batch.batch["input_ids"][0] = torch.tensor(prefix)
    out = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=budget, ignore_eos=True))
    return out.batch["responses"][0, :budget].tolist()


def _run_turns(turns: TurnEngine, prompts: dict, observations: dict, budget: int, params) -> dict:
    """Two turns per sequence with the observation in between; returns key -> all tokens."""
    for key, prompt in prompts.items():
        turns.open(key, prompt, params, row=key)
    seen = {key: 0 for key in prompts}
    result = {}
    while turns.busy:
        for done in turns.step():
            seen[done.key] += 1
            if seen[done.key] == 1:
                turns.extend(done.key, observations[done.key], max_new_tokens=budget)
            else:
                result[done.key] = turns.close(done.key)
    return result


@pytest.mark.parametrize("case", list(CASES))
def test_continuation_equals_regeneration_from_scratch(case, tmp_path):
    family, overrides = CASES[case]
    engine = _engine(tmp_path, family, overrides)
    gen = torch.Generator().manual_seed(3)
    prompts = {k: torch.randint(3, 256, (n,), generator=gen).tolist() for k, n in enumerate([5, 11, 2, 8])}
    obs = {k: torch.randint(3, 256, (n,), generator=gen).tolist() for k, n in enumerate([3, 1, 7, 4])}
    budget = 6
    greedy = SamplingParams(temperature=0.0, max_new_tokens=budget, ignore_eos=True)
    tokens = _run_turns(TurnEngine(engine, slots=3), prompts, obs, budget, greedy)
    for key, prompt in prompts.items():
        first = _from_scratch(engine, prompt, budget)
        second = _from_scratch(engine, prompt + first + obs[key], budget)
        assert tokens[key] == prompt + first + obs[key] + second, f"sequence {key}"


def test_sampled_sequences_do_not_depend_on_batch_company(tmp_path):
    engine = _engine(tmp_path)
    gen = torch.Generator().manual_seed(4)
    prompts = {k: torch.randint(3, 256, (n,), generator=gen).tolist() for k, n in enumerate([4, 9, 6])}
    obs = {k: [7, 8, 9] for k in prompts}
    params = SamplingParams(temperature=1.0, max_new_tokens=5, ignore_eos=True, seed=11)
    together = _run_turns(TurnEngine(engine, slots=3), prompts, obs, 5, params)
    alone = {k: _run_turns(TurnEngine(engine, slots=1), {k: p}, obs, 5, params)[k] for k, p in prompts.items()}
    assert together == alone


def test_paused_sequences_take_no_decode_rows(tmp_path):
    engine = _engine(tmp_path)
    turns = TurnEngine(engine, slots=2)
    turns.open("short", [5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True))
    turns.open("long", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True))
    first = turns.step()  # the prefill samples one token each: "short" has finished its turn
    assert [t.key for t in first] == ["short"] and first[0].finish_reason == "length"
    while turns.busy:
        turns.step()
    # nine decode steps of "long" alone while "short" waited paused
    assert turns.stats["decode_steps"] == 9 and turns.stats["decode_rows"] == 9
    turns.extend("short", [9], max_new_tokens=3)
    out = []
    while turns.busy:
        out += turns.step()
    assert [t.key for t in out] == ["short"] and len(out[0].tokens) == 3
