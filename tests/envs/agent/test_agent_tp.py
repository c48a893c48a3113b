"""The agent loop at generation tensor-parallel size 2 (two gloo processes) equals t_g = 1.

Both ranks build the native engine on the world group (a tiny turn model with 2 kv heads,
one per rank) and run the same agent loop; environments exist on rank 0 only
(`LeaderOnlyEnv` refuses to be built anywhere else) and reach rank 1 through the lockstep
(envs/agent/lockstep.py). Every scenario's output on both ranks must equal the
single-process loop's: tokens, masks, turn rewards, stops, errors, turn counts exactly,
log-probs within 1e-5 (fp32; only the all-reduce's summation order differs). Scenarios:
greedy sync and async with a zero-latency deterministic env, greedy async and sync with
random step latency (answers arrive in a different order on every run), seeded sampling
(n=2), and an environment that raises on rank 0 (that trajectory ends with the recorded
error on both ranks; the others go on). A failure on rank 0 outside the environment guard
reaches rank 1 as a LockstepAbort instead of a hang (gloo's timeout would end a hang).
"""

from __future__ import annotations

import datetime
import math
import random
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from agent_helpers import CountEnv, prompt_batch, tokenizer_of

from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.envs.agent import AgentConfig
from hybridflow.envs.agent.demo import TINY_SIZES, make_turn_model_dir
from hybridflow.envs.agent.lockstep import Lockstep, LockstepAbort, Note, decode, encode
from hybridflow.envs.agent.loop import AgentLoop

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=48)
SAMPLED = SamplingParams(temperature=0.7, max_new_tokens=48, n=2, seed=11)


class LeaderOnlyEnv(CountEnv):
    """CountEnv that may only be built on rank 0 of a process group (or without one)."""

    def __init__(self, turns: int = 3, latency_s: float = 0.0, random_latency_s: float = 0.0) -> None:
        if dist.is_initialized() and dist.get_rank() != 0:
            raise AssertionError(f"an environment was built on rank {dist.get_rank()}")
        super().__init__(turns, latency_s)
        self.random_latency_s = random_latency_s

    def step(self, turn):
        if self.random_latency_s:  # unseeded on purpose: the order of answers differs run to run
            time.sleep(random.uniform(0.0, self.random_latency_s))
        return super().step(turn)


class RaisingOnLeaderEnv(LeaderOnlyEnv):
    def step(self, turn):
        raise RuntimeError("env bug on rank 0")


class BadCloseOnLeaderEnv(LeaderOnlyEnv):
    def close(self):
        raise OSError("cannot release on rank 0")


def _env(turns=3, **kw):
    return {"env": "test_agent_tp:LeaderOnlyEnv", "env_kwargs": {"turns": turns, **kw}}


SCENARIOS = {
    "sync": ("sync", GREEDY, [_env(), _env(turns=2), None, _env(turns=4)]),
    "async": ("async", GREEDY, [_env(), _env(turns=2), None, _env(turns=4)]),
    "async_random_latency": ("async", GREEDY, [_env(random_latency_s=0.03), _env(turns=2, random_latency_s=0.03),
                                               _env(turns=4, random_latency_s=0.03)]),
    "sync_random_latency": ("sync", GREEDY, [_env(random_latency_s=0.03), _env(turns=4, random_latency_s=0.03)]),
    "async_sampled": ("async", SAMPLED, [_env(), None, _env(turns=4)]),
    "raising": ("async", GREEDY, [_env(), {"env": "test_agent_tp:RaisingOnLeaderEnv", "env_kwargs": {}}, _env(2),
                                  {"env": "test_agent_tp:BadCloseOnLeaderEnv", "env_kwargs": {"turns": 2}}]),
}
TENSORS = ("responses", "response_mask", "prompts", "env_rewards", "attention_mask", "position_ids")
RECORDS = ("agent_stop", "agent_error", "num_turns", "num_tool_calls", "final_turn_start", "finish_reason")


def _run_all(engine, tok) -> dict:
    out = {}
    for name, (mode, params, extras) in SCENARIOS.items():
        batch = prompt_batch(tok, [f"{i}+{i}=" for i in range(len(extras))], extras)
        config = AgentConfig(enable=True, mode=mode, env_timeout_s=5.0, error_score=-1.0)
        result = AgentLoop(engine, tok, config, 48, tok.pad_token_id).run(batch, params)
        out[name] = ({k: result.batch[k] for k in TENSORS + ("rollout_log_probs",)},
                     {k: list(result.non_tensor_batch[k]) for k in RECORDS + ("score_override",)},
                     result.meta_info["metrics"])
    return out


def _worker(rank: int, init_file: str, path: str, out_prefix: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))  # a lost lockstep fails, not hangs
    tok = tokenizer_of(path)
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32, max_num_seqs=3),
                                                 process_group=dist.group.WORLD, tokenizer=tok)
    results = _run_all(engine, tok)
    sync = Lockstep(dist.group.WORLD)
    try:
        sync.share(lambda: 1 // 0)  # rank 0's own code fails: rank 1 must hear of it
        aborted = None
    except (ZeroDivisionError, LockstepAbort) as err:
        aborted = f"{type(err).__name__}: {err}"
    torch.save({"results": results, "aborted": aborted}, f"{out_prefix}.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp_model_dir(tmp_path_factory):
    """The turn model with 2 kv heads, so that t_g = 2 gives each rank one."""
    return make_turn_model_dir(tmp_path_factory.mktemp("tp_turn_model") / "m", **{**TINY_SIZES,
                                                                                  "num_key_value_heads": 2})


def test_tp2_agent_loop_equals_single_process(tmp_path, tp_model_dir):
    mp.spawn(_worker, args=(str(tmp_path / "rdzv"), str(tp_model_dir), str(tmp_path / "out")), nprocs=2, join=True)
    per_rank = [torch.load(tmp_path / f"out.{r}", weights_only=False) for r in range(2)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = tokenizer_of(tp_model_dir)
        single = _run_all(NativeRolloutEngine.from_pretrained(
            tp_model_dir, RolloutConfig(dtype=torch.float32, max_num_seqs=3), tokenizer=tok), tok)
    finally:
        torch.set_num_threads(threads)
    for name, (tensors, records, _) in single.items():
        assert max(records["num_turns"]) >= 2, name  # really multi-turn
        for rank, got in enumerate(per_rank):
            got_tensors, got_records, metrics = got["results"][name]
            for key in TENSORS:
                assert torch.equal(got_tensors[key], tensors[key]), (name, rank, key)
            assert torch.allclose(got_tensors["rollout_log_probs"], tensors["rollout_log_probs"], atol=1e-5), name
            for key in RECORDS:
                assert got_records[key] == records[key], (name, rank, key)
            assert [math.isnan(x) for x in got_records["score_override"]] == \
                [math.isnan(x) for x in records["score_override"]]
            assert metrics["agent_loop/lockstep_exchanges"] >= 3  # start, at least one answer round, close
    raising = single["raising"][1]
    assert raising["agent_stop"][1] == "env_error" and "env bug on rank 0" in raising["agent_error"][1]
    assert raising["agent_stop"][0] == raising["agent_stop"][2] == raising["agent_stop"][3] == "done"
    assert raising["agent_error"][3] == "close: OSError: cannot release on rank 0"  # shared after the loop
    assert per_rank[0]["aborted"].startswith("ZeroDivisionError")
    assert per_rank[1]["aborted"].startswith("LockstepAbort") and "ZeroDivisionError" in per_rank[1]["aborted"]


def test_notes_round_trip_through_the_wire_format():
    notes = [Note(0, tokens=[5, 6, 7], reward=-0.25, tool_calls=2, malformed=1),
             Note(3, "env_error", "RuntimeError: bad \u00e9\u6f22 input", single_turn=True),
             Note(7, "done", "", reward=1e-300), Note(8)]
    assert decode(encode(notes), len(notes)) == notes
    assert decode(encode([]), 0) == []
    with pytest.raises(RuntimeError, match="disagree"):
        decode(encode(notes), 1)
