"""The multi-turn rollout loop (envs/agent/loop.py) on the native engine with a tiny model.

Contract: async and sync modes give the same trajectories for a deterministic env; the
response interleaves model turns (mask 1) and rendered observations (mask 0); every turn
equals regenerating from scratch on the whole prefix (greedy), so the KV-cache
continuation is exact; limits end trajectories with the recorded reason; a bad
environment (raises, hangs, wrong type, bad reset, bad constructor) ends only its own
trajectory with error_score; rows without an env are single-turn.
"""

from __future__ import annotations

import math

import pytest
import torch
from agent_helpers import prompt_batch, tokenizer_of

from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.envs.agent import AgentConfig
from hybridflow.envs.agent.loop import AgentLoop
from hybridflow.envs.agent.render import ChatRenderer
from hybridflow.protocol import DataProto

ENV = "agent_helpers:CountEnv"


@pytest.fixture(scope="module")
def setup(turn_model_dir):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only spin on this shared machine
    path = turn_model_dir
    tok = tokenizer_of(path)
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32), tokenizer=tok)
    yield engine, tok
    torch.set_num_threads(threads)


def _run(setup, extras, params, response_length=48, **cfg):
    engine, tok = setup
    batch = prompt_batch(tok, [f"{i}+{i}=" for i in range(len(extras))], extras)
    config = AgentConfig(enable=True, env_timeout_s=cfg.pop("env_timeout_s", 5.0), **cfg)
    return AgentLoop(engine, tok, config, response_length, tok.pad_token_id).run(batch, params)


def _count_env(turns=3, **kw):
    return {"env": ENV, "env_kwargs": {"turns": turns, **kw}}


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0, max_new_tokens=48),
                                    SamplingParams(temperature=0.3, max_new_tokens=48, n=2, seed=5)])
def test_async_and_sync_give_the_same_trajectories(setup, params):
    extras = [_count_env(), _count_env(turns=2), None, _count_env(turns=4)]
    a = _run(setup, extras, params, mode="async")
    s = _run(setup, extras, params, mode="sync")
    for key in ("responses", "response_mask", "prompts", "env_rewards"):
        assert torch.equal(a.batch[key], s.batch[key]), key
    assert torch.allclose(a.batch["rollout_log_probs"], s.batch["rollout_log_probs"])
    assert list(a.non_tensor_batch["agent_stop"]) == list(s.non_tensor_batch["agent_stop"])
    assert max(a.non_tensor_batch["num_turns"]) >= 2  # really multi-turn


def test_masks_observations_and_turn_rewards(setup):
    engine, tok = setup
    out = _run(setup, [_count_env(turns=3)], SamplingParams(temperature=0.0, max_new_tokens=48))
    resp, mask = out.batch["responses"][0], out.batch["response_mask"][0]
    attn = out.batch["attention_mask"][0, out.batch["prompts"].shape[1]:]
    n = int(attn.sum())
    text = tok.decode(resp[:n].tolist())
    # three model turns, each ended by eos, and two rendered observations "<|user|>n?<|assistant|>"
    assert out.non_tensor_batch["num_turns"][0] == 3 and out.non_tensor_batch["agent_stop"][0] == "done"
    assert text.count("</s>") == 3 and text.count("<|user|>n") == 2
    env_tokens = [tok.decode([t]) for t, m in zip(resp[:n].tolist(), mask[:n].tolist()) if m == 0]
    assert "".join(env_tokens).startswith("<|user|>n") and "</s>" not in "".join(env_tokens)
    assert int(mask[n:].sum()) == 0 and float(out.batch["rollout_log_probs"][0][mask == 0].abs().sum()) == 0.0
    # each turn's reward (0.5) sits on that turn's last token (its eos)
    ends = [i for i in range(n) if mask[i] == 1 and (i + 1 == n or mask[i + 1] == 0)]
    rewards = out.batch["env_rewards"][0]
    assert [float(rewards[i]) for i in ends] == [0.5, 0.5, 0.5] and float(rewards.sum()) == 1.5
    assert out.non_tensor_batch["final_turn_start"][0] == max(i for i in range(1, n) if mask[i - 1] == 0)


def test_every_turn_equals_regeneration_from_scratch(setup):
    engine, tok = setup
    out = _run(setup, [_count_env(turns=3), _count_env(turns=2)],
               SamplingParams(temperature=0.0, max_new_tokens=48))
    plen = out.batch["prompts"].shape[1]
    for row in range(len(out)):
        ids = out.batch["input_ids"][row][out.batch["attention_mask"][row].bool()].tolist()
        full_mask = [0] * int(out.batch["attention_mask"][row, :plen].sum()) + \
            out.batch["response_mask"][row][out.batch["attention_mask"][row, plen:].bool()].tolist()
        starts = [i for i in range(1, len(ids)) if full_mask[i] == 1 and full_mask[i - 1] == 0]
        for s in starts:
            end = s
            while end < len(ids) and full_mask[end] == 1:
                end += 1
            prefix = torch.tensor([ids[:s]])
            batch = DataProto.from_dict(tensors={"input_ids": prefix, "attention_mask": torch.ones_like(prefix)})
            ref = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=end - s))
            assert ref.batch["responses"][0, : end - s].tolist() == ids[s:end], f"row {row} turn at {s}"


def test_limits_are_recorded(setup):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48)
    assert _run(setup, [_count_env(turns=9)], greedy, max_turns=2).non_tensor_batch["agent_stop"][0] == "max_turns"
    assert _run(setup, [_count_env(turns=9)], greedy, max_obs_tokens=2).non_tensor_batch["agent_stop"][0] == \
        "max_obs_tokens"
    short = _run(setup, [_count_env(turns=9)], greedy, response_length=7)
    assert short.non_tensor_batch["agent_stop"][0] == "max_total_tokens"
    assert int(short.batch["attention_mask"][0, short.batch["prompts"].shape[1]:].sum()) <= 7


def test_bad_environments_end_only_their_trajectory(setup):
    extras = [{"env": f"agent_helpers:{name}", "env_kwargs": {}} for name in
              ("RaisingEnv", "HangingEnv", "WrongTypeEnv", "BadResetEnv", "BadInitEnv")] + [_count_env()]
    extras.append({"env": "no_such_module_xyz:Env"})
    extras.append({"env": "agent_helpers:BadCloseEnv", "env_kwargs": {"turns": 1}})
    out = _run(setup, extras, SamplingParams(temperature=0.0, max_new_tokens=48), env_timeout_s=0.5,
               error_score=-1.0)
    stops = list(out.non_tensor_batch["agent_stop"])
    assert stops[:7] == ["env_error", "env_timeout", "env_bad_result", "env_bad_result", "env_error", "done",
                         "env_error"]
    assert not stops[7].startswith("env_")  # a failed close does not change how the trajectory ended
    errors = list(out.non_tensor_batch["agent_error"])
    assert "env bug" in errors[0] and "StepResult" in errors[2] and "cannot construct" in errors[4]
    assert errors[7] == "close: OSError: cannot release"  # recorded; the trajectory keeps its result
    overrides = list(out.non_tensor_batch["score_override"])
    assert overrides[:5] == [-1.0] * 5 and math.isnan(overrides[5]) and overrides[6] == -1.0
    assert math.isnan(overrides[7])
    assert out.meta_info["metrics"]["agent/env_errors"] == 7.0


def test_rows_without_env_are_single_turn_like_the_engine(setup):
    engine, tok = setup
    params = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=3)
    out = _run(setup, [None, None], params, response_length=12)
    assert list(out.non_tensor_batch["num_turns"]) == [1, 1, 1, 1]
    assert int((out.batch["response_mask"] != out.batch["attention_mask"][:, -12:]).sum()) == 0


def test_renderer_observation_tokens_follow_the_template(setup):
    _, tok = setup
    r = ChatRenderer(tok)
    history = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "@calculator[1+1]"}]
    turn = tok("@calculator[1+1]</s>", add_special_tokens=False)["input_ids"]
    obs = r.observation(history, turn, [{"role": "user", "content": "2"}], None)
    assert tok.decode(obs) == "<|user|>2<|assistant|>"


def test_async_step_environment(setup):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48)
    coro = _run(setup, [{"env": "agent_helpers:AsyncCountEnv", "env_kwargs": {"turns": 3}}] * 2, greedy)
    plain = _run(setup, [_count_env(turns=3)] * 2, greedy)
    assert list(coro.non_tensor_batch["agent_stop"]) == ["done", "done"]
    assert torch.equal(coro.batch["responses"], plain.batch["responses"])


def test_prompts_left_padded_to_a_common_width(setup):
    """Ranks render prompts of different lengths; their outputs are padded to one width."""
    from hybridflow.engines.rollout.batch_io import left_pad_prompts

    engine, tok = setup
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    out = _run(setup, [_count_env(turns=2)], params, response_length=24)
    width = out.batch["prompts"].shape[1]
    padded = left_pad_prompts(out[0:1], width + 3)
    assert padded.batch["prompts"].shape[1] == width + 3
    assert torch.equal(padded.batch["prompts"][:, 3:], out.batch["prompts"])
    assert padded.batch["attention_mask"][:, :3].sum() == 0 and padded.batch["position_ids"][:, :3].sum() == 0
    assert torch.equal(padded.batch["input_ids"][:, 3:], out.batch["input_ids"])
    with pytest.raises(ValueError, match="cannot left-pad"):
        left_pad_prompts(padded, width)


def test_hf_backend_regenerates_the_same_trajectories(setup, turn_model_dir):
    """The hf backend keeps no KV cache: each turn is regenerated from the whole prefix
    (regen_turns.py). Greedy, with a deterministic env, its trajectories equal the native
    engine's KV-cache continuation, in both modes."""
    from hybridflow.engines.rollout.hf_backend import HFRolloutEngine
    from hybridflow.engines.rollout.regen_turns import RegenTurnEngine

    engine, tok = setup
    hf = HFRolloutEngine.from_pretrained(turn_model_dir, RolloutConfig(dtype=torch.float32), tokenizer=tok)
    extras = [_count_env(), _count_env(turns=2), None]
    params = SamplingParams(temperature=0.0, max_new_tokens=48)
    native = _run(setup, extras, params, mode="async")
    for mode in ("async", "sync"):
        out = _run((hf, tok), extras, params, mode=mode)
        for key in ("responses", "response_mask", "prompts", "env_rewards"):
            assert torch.equal(out.batch[key], native.batch[key]), (mode, key)
        assert torch.allclose(out.batch["rollout_log_probs"], native.batch["rollout_log_probs"], atol=1e-4)
        assert list(out.non_tensor_batch["agent_stop"]) == list(native.non_tensor_batch["agent_stop"])
    assert max(native.non_tensor_batch["num_turns"]) >= 2
    turns = hf.turn_engine(4)
    assert isinstance(turns, RegenTurnEngine)
    turns.open("a", [1, 5, 6], SamplingParams(temperature=0.0, max_new_tokens=4))
    (first,) = turns.step()
    turns.extend("a", [7, 8], max_new_tokens=3)
    assert turns.stats["prefill_tokens"] == 3 and not turns.paused
    turns.step()
    assert turns.stats["prefill_tokens"] == 3 + 3 + len(first.tokens) + 2  # the prefix, prefilled again
