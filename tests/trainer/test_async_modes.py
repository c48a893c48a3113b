"""trainer.mode one_step_off / async end to end (trainer/modes/async_trainer.py, docs/async.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hybridflow import RLTrainer
from test_algorithms_e2e import reward_model_dir  # noqa: F401 - a fixture (a random reward model)
from trainer_helpers import assert_finite, rl_records

pytestmark = pytest.mark.slow  # each run starts two pools of tiny-model processes

# One training rank and one rollout rank; sync mode's single actor rank generates in one
# micro-DP group too, so both draw the same seeds for the same prompts.
ONE_EACH = ("resources.world_size=1", "async_rl.rollout_ranks=1", "trainer.val_before_train=false")


def _run(config, steps=2):
    with RLTrainer(config) as trainer:
        result = trainer.train(steps=steps)
    return rl_records(result.run_dir)


def _comparable(record: dict) -> dict:
    # timings and throughput differ from run to run; the async bookkeeping has no sync twin
    skip = ("timing_s/", "perf/", "reshard/", "async/", "weight_sync/", "staleness/", "controller/",
            "agent_loop/")  # the generation worker's own loop costs (sync: one call per step)
    return {k: v for k, v in record.items() if not k.startswith(skip) and k != "time"}


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_algorithm" / "grpo_brevity.py"
# Every built-in algorithm and the user example (examples/custom_algorithm); the special
# cases below give their own phases work.
ALGORITHMS = ("grpo", "dapo", "safe_rlhf", "ppo", "remax", "rloo", "reinforce_plus_plus",
              "reinforce_plus_plus_baseline", "drgrpo", "grpo_brevity", "agent", "remax_agent", "hf")


def _algorithm(name: str, tmp_path, score_model, turn_model) -> tuple[str, ...]:
    """Overrides of a run of `name` that gives its special phases work: grpo with an adaptive
    KL penalty in the reward, DAPO with half its groups uniform, Safe-RLHF with a cost
    function plus a cost model, PPO with a reward model added to the rule-based reward, ReMax
    with a reward that varies by response (its greedy baseline is not 0), the user example
    from its file, grpo on multi-turn agent rollouts (guess_number, the turn model)."""
    from test_algorithms_e2e import HALF_UNIFORM_REWARD, STEPPED_COST, VARIED_REWARD

    files = {"dapo": {"reward": HALF_UNIFORM_REWARD}, "safe_rlhf": {"reward": VARIED_REWARD, "cost": STEPPED_COST},
             "remax": {"reward": VARIED_REWARD}}
    overrides = [f"algorithm.name={ {'agent': 'grpo', 'hf': 'grpo', 'remax_agent': 'remax'}.get(name, name)}"]
    for kind, code in files.get(name, {}).items():
        (tmp_path / f"{kind}.py").write_text(code, encoding="utf-8")
        overrides.append(f"{'reward' if kind == 'reward' else 'cost_model'}.custom_fn_path={tmp_path / f'{kind}.py'}")
    agent = [f"model.path={turn_model}", "rollout.response_length=40", "rollout.agent.enable=true",
             "rollout.agent.default_env=guess_number", "rollout.agent.env_kwargs={low: 0, high: 200}",
             "rollout.agent.max_turns=4", "rollout.temperature=0.5"]
    overrides += {
        "grpo": ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive"],
        "dapo": ["rollout.n=4"],
        "safe_rlhf": [f"cost_model.path={score_model}"],
        "ppo": [f"reward_model.path={score_model}", "reward_model.add_rule_reward=true"],
        "grpo_brevity": [f"algorithm.module={EXAMPLE}"],
        "hf": ["rollout.name=hf"],
        "agent": agent,
        "remax_agent": agent,
    }.get(name, [])
    return tuple(overrides)


# The keys of one mode only: DAPO's rounds (sync) and the groups discarded over the run (async).
ONE_MODE_ONLY = ("dapo/rounds", "dapo/filtered_groups_total")


# make test runs a critic-free and a critic-and-reward-model case (multi-turn on the stream:
# test_async_dataflow.py); the rest: make test-extended
REPRESENTATIVE = ("grpo", "ppo")


@pytest.mark.parametrize("algorithm", [a if a in REPRESENTATIVE else pytest.param(a, marks=pytest.mark.extended)
                                       for a in ALGORITHMS])
def test_max_staleness_0_reproduces_sync_metrics(tiny_config, ray_local, tmp_path, reward_model_dir, turn_model_dir,
                                                 algorithm):
    """The controller-free data path computes what the synchronous program computes, and the
    async controller fetches no tensor of the batch (the sync one fetches it): the KL
    controller follows the workers' KL, DAPO's discarded groups' places go to the next
    prompts as sync's next round does, Safe-RLHF's costs (function + model), cost critic and
    multiplier follow the same batches, a reward model's scores add to the rule's, ReMax's
    greedy baselines (generated beside the groups on the rollout pool) equal sync's, the
    agent loop on the rollout pool plays the same episodes as the hybrid actor's, and a
    non-native backend generating whole calls samples what the hybrid actor's samples. Every
    algorithm runs its own registered program in both modes (trainer/modes/stream_step.py)."""
    chosen = _algorithm(algorithm, tmp_path, reward_model_dir, turn_model_dir)
    sync = _run(tiny_config(*ONE_EACH, *chosen))
    asyn = _run(tiny_config(*ONE_EACH, *chosen, "trainer.mode=async", "async_rl.max_staleness=0"))
    for s, a in zip(sync, asyn, strict=True):
        assert {k: v for k, v in _comparable(a).items() if k not in ONE_MODE_ONLY} == \
            {k: v for k, v in _comparable(s).items() if k not in ONE_MODE_ONLY}
        assert {"actor/pg_loss", "actor/grad_norm", "score/mean", "response_length/mean"} <= set(_comparable(s))
        special = {"grpo": "kl/coef", "dapo": "dapo/kept_groups", "safe_rlhf": "cost_critic/vf_loss",
                   "ppo": "reward/model_score_mean", "remax": "remax/baseline_mean", "agent": "agent/num_turns_mean",
                   "remax_agent": "remax/baseline_mean", "hf": "actor/entropy",
                   "grpo_brevity": "brevity/penalty_mean"}.get(algorithm, "adv/mean")
        assert special in s, special
        assert a["staleness/max"] == 0
        # DAPO: informative groups beyond the batch (the last round's surplus, which sync's step
        # leaves out too) are stale at the next version and dropped; nothing else is
        assert a["async/dropped_groups"] == 0 or algorithm == "dapo"
        # the same numbers, computed next to the data: the async controller fetched no batch tensor
        assert a["controller/fetched_tensor_bytes"] == 0 and s["controller/fetched_tensor_bytes"] > 0
    assert asyn[-1]["weight_sync/bytes"] > 0


# one_step_off: tests/trainer/test_async_dataflow.py; async: the staleness tests
@pytest.mark.extended
@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_two_steps_of_each_mode(tiny_config, ray_local, mode):
    extra = ("async_rl.chunk_prompts=2", "async_rl.steps_per_call=3", "async_rl.max_staleness=1") if mode == "async" else ()
    records = _run(tiny_config("async_rl.rollout_ranks=1", "trainer.val_before_train=false", f"trainer.mode={mode}",
                               "actor.loss.off_policy.is_level=token", *extra), steps=3)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert_finite(r)
        assert r["staleness/max"] <= 1
        assert "actor/is_weight_mean" in r and r["weight_sync/bytes"] > 0
    if mode == "one_step_off":  # batch 2 and 3 were generated while the previous batch trained
        assert [r["staleness/max"] for r in records] == [0.0, 1.0, 1.0]


def test_max_staleness_4_runs_ahead_and_keeps_the_bound(tiny_config, ray_local):
    """The rollout pool runs several batches ahead (its weights arrive in the background,
    admission control lets 5 batches be in flight), so trained tokens lag more than one
    version, and never more than max_staleness. The schedule does not depend on timing
    (each generation call names its version), so the observed staleness is exact."""
    records = _run(tiny_config("resources.world_size=1", "async_rl.rollout_ranks=1", "trainer.val_before_train=false",
                               "trainer.mode=async", "async_rl.max_staleness=4", "async_rl.chunk_prompts=2",
                               "async_rl.steps_per_call=2", "actor.loss.off_policy.is_level=token"), steps=5)
    worst = [r["staleness/max"] for r in records]
    assert max(worst) > 1, worst
    assert all(w <= 4 for w in worst), worst
    assert max(r["async/queued_calls"] for r in records) > 2  # more than the two calls the first design queued


def test_async_checkpoint_resumes_version_seeds_and_prompts(tiny_config, ray_local):
    """A checkpoint of an async run holds the policy version, the generation-call count
    (sampling seeds) and the prompts sent but not trained; the resumed run sends those
    again first and trains on with the right version. Its buffer is regenerated, so its
    later steps need not equal the uninterrupted run's."""
    from hybridflow.trainer.modes.async_trainer import PROMPTS_FILE
    from hybridflow.trainer.run.checkpointing import read_trainer_state

    cfg = tiny_config("resources.world_size=1", "async_rl.rollout_ranks=1", "trainer.val_before_train=false",
                      "trainer.mode=async", "async_rl.max_staleness=2", "async_rl.chunk_prompts=2",
                      "async_rl.steps_per_call=2", "trainer.save_freq=2", "trainer.total_steps=3")
    with RLTrainer(cfg) as trainer:
        trainer.train(steps=2)
        runner = trainer.async_runner
        rows = [*runner.untrained.values(), *([runner.leftover] if runner.leftover is not None else [])]
        untrained = torch.cat([r.batch["input_ids"] for r in rows])
        calls, loader = runner.calls, trainer.loader.state_dict()
        run_dir = trainer.run_dir
    checkpoint = run_dir / "checkpoints" / "global_step_2"
    state = read_trainer_state(checkpoint)["async"]
    assert state == {"version": 2, "calls": calls, "dropped_total": state["dropped_total"], "filtered_total": 0,
                     "requeued_prompts": len(untrained)}
    assert len(untrained) > 0 and (checkpoint / PROMPTS_FILE).is_file()  # the pool was ahead of training
    with RLTrainer(resume=run_dir) as resumed:
        resumed._start()  # what train() does first: workers, loader, then the checkpoint
        r = resumed.async_runner
        assert r.version == 2 and r.calls == calls and resumed.loader.state_dict() == loader
        assert torch.equal(r.leftover.batch["input_ids"], untrained)  # sent again first, in send order
        resumed.train()
        assert r.version == 3 and r.calls > calls
    records = rl_records(run_dir)
    assert [x["step"] for x in records] == [1, 2, 3]
    assert records[-1]["async/policy_version"] == 3 and records[-1]["staleness/max"] <= 2


@pytest.mark.extended  # a critic in the asynchronous data path: test_max_staleness_0_reproduces_sync_metrics[ppo]
def test_ppo_with_a_critic_in_one_step_off(tiny_config, ray_local):
    records = _run(tiny_config("async_rl.rollout_ranks=1", "trainer.val_before_train=false", "trainer.mode=one_step_off",
                               "algorithm.name=ppo", "resources.world_size=1"), steps=2)
    for r in records:
        assert_finite(r)
        assert "critic/vf_loss" in r and "values/mean" in r and r["weight_sync/bytes"] > 0
        assert r["controller/fetched_tensor_bytes"] == 0  # values, GAE and the critic update stay in the workers
    assert [r["staleness/max"] for r in records] == [0.0, 1.0]


def test_the_live_status_names_the_programs_phases_in_every_mode(tiny_config, ray_local):
    """`hybridflow monitor`'s timeline (observe/live_status.py) names each phase of the program
    as it starts, and the run is "training" meanwhile, in every mode: the asynchronous modes
    run the program in a task beside the pools, which reports each phase as it starts; before
    it the controller waits for the rollout pool's groups (wait_rollout)."""
    from hybridflow.trainer.observe.live_status import TIMELINE_FILE

    phases = {}
    for mode in ("sync", "async"):
        with RLTrainer(tiny_config(*ONE_EACH, f"trainer.mode={mode}")) as trainer:
            run_dir = trainer.train(steps=2).run_dir
        events = [json.loads(line) for line in (run_dir / TIMELINE_FILE).read_text(encoding="utf-8").splitlines()]
        phases[mode] = [(e["step"], e["phase"]) for e in events if e["state"] == "training"]
    assert {(1, "gen"), (2, "gen"), (1, "update_actor"), (2, "update_actor")} <= set(phases["sync"])
    expected = []
    for step, phase in phases["sync"]:
        if not expected or expected[-1][0] != step:
            expected.append((step, "wait_rollout"))
        expected.append((step, phase))
    assert phases["async"] == expected
