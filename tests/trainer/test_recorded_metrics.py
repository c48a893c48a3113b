"""Every LM algorithm's numbers are pinned: a short fixed-seed run of each built-in (and of
the user example, examples/custom_algorithm) in sync mode, and of the asynchronous modes'
reproduction and staleness cases, must log exactly the metrics recorded in
tests/trainer/data/recorded_metrics.json (issue 23, "what must not change": the redesign
of how modes run the programs may move code, never numbers).

The fixture was recorded at 6c4bac7, before the one-task-lifecycle refactor (fp32, gloo, an
AMD EPYC of the CI kind); bit-identical floats assume the same torch build and CPU kind.
`make test` runs three cases; the rest are marked extended. After a change
that is *meant* to change numbers, record again (and say why in the commit):

    HYBRIDFLOW_RECORD_METRICS=1 python -m pytest tests/trainer/test_recorded_metrics.py -m slow

Only timing-free keys are compared (`comparable`): wall times, throughput, weight-sync
transfer statistics and the controller's fetch counters differ between runs or modes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hybridflow import RLTrainer
from hybridflow.config.sections.resources import local_cores
from test_algorithms_e2e import HALF_UNIFORM_REWARD, STEPPED_COST, VARIED_REWARD
from test_algorithms_e2e import reward_model_dir  # noqa: F401 - a fixture (a random reward model)
from trainer_helpers import rl_records

pytestmark = pytest.mark.slow  # one or two tiny runs per case

FIXTURE = Path(__file__).parent / "data" / "recorded_metrics.json"
# Where the fixture was recorded: floats are bit-exact only on the same CPU model and torch
# build (CI runs on the developers' kind of machine, whose CPU varies between sessions).
MACHINE = Path(__file__).parent / "data" / "recorded_metrics_machine.json"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_algorithm" / "grpo_brevity.py"
RECORD = os.environ.get("HYBRIDFLOW_RECORD_METRICS") == "1"

# One training rank, one rollout rank (async modes), no evaluation: the cheapest real run.
# Threads as recorded (all cores), also where resources.omp_wait_policy auto would find the
# machine shared and take fewer (controller/omp.py): the last bits of a log-prob depend on them.
BASE = ("resources.world_size=1", f"resources.threads_per_rank={local_cores()}", "async_rl.rollout_ranks=1",
        "trainer.val_before_train=false")
SKIP = ("timing_s/", "perf/", "reshard/", "weight_sync/", "controller/", "agent_loop/")
ASYNC_1 = ("trainer.mode=async", "async_rl.max_staleness=1", "async_rl.chunk_prompts=2", "async_rl.steps_per_call=3")
# The fixture was recorded when dtype "auto" meant bf16 on any CPU with AVX512_BF16 (this
# machine's); auto is now measured (issue 24), so the roles that used it name bf16 here.
BF16_AGENT = ("actor.dtype=bf16", "rollout.dtype=bf16")
AGENT = (*BF16_AGENT, "rollout.response_length=40", "rollout.agent.enable=true", "rollout.agent.default_env=guess_number",
         "rollout.agent.env_kwargs={low: 0, high: 200}", "rollout.agent.max_turns=4", "rollout.temperature=0.5")

# case -> (overrides, files the case writes: {override key: file text}, needs: score_model / turn_model)
CASES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    # every built-in and the user example, sync mode
    "sync/grpo": (("algorithm.name=grpo",), {}),
    "sync/ppo": (("algorithm.name=ppo",), {}),
    "sync/remax": (("algorithm.name=remax",), {"reward.custom_fn_path": VARIED_REWARD}),
    "sync/rloo": (("algorithm.name=rloo",), {}),
    "sync/reinforce_plus_plus": (("algorithm.name=reinforce_plus_plus",), {}),
    "sync/reinforce_plus_plus_baseline": (("algorithm.name=reinforce_plus_plus_baseline",), {}),
    "sync/drgrpo": (("algorithm.name=drgrpo",), {}),
    "sync/dapo": (("algorithm.name=dapo", "rollout.n=4"), {"reward.custom_fn_path": HALF_UNIFORM_REWARD}),
    "sync/safe_rlhf": (("algorithm.name=safe_rlhf",), {"reward.custom_fn_path": VARIED_REWARD,
                                                        "cost_model.custom_fn_path": STEPPED_COST}),
    "sync/grpo_brevity": (("algorithm.name=grpo_brevity", f"algorithm.module={EXAMPLE}"), {}),
    # test_async_modes.py's reproduction cases (max_staleness=0)
    "async0/grpo_kl": (("trainer.mode=async", "async_rl.max_staleness=0", "algorithm.name=grpo",
                        "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive"), {}),
    "async0/dapo": (("trainer.mode=async", "async_rl.max_staleness=0", "algorithm.name=dapo", "rollout.n=4"),
                    {"reward.custom_fn_path": HALF_UNIFORM_REWARD}),
    "async0/safe_rlhf": (("trainer.mode=async", "async_rl.max_staleness=0", "algorithm.name=safe_rlhf",
                          "cost_model.path=SCORE_MODEL", "cost_model.dtype=bf16"),
                         {"reward.custom_fn_path": VARIED_REWARD, "cost_model.custom_fn_path": STEPPED_COST}),
    "async0/ppo_rm": (("trainer.mode=async", "async_rl.max_staleness=0", "algorithm.name=ppo",
                       "reward_model.path=SCORE_MODEL", "reward_model.add_rule_reward=true",
                       "reward_model.dtype=bf16"), {}),
    "async0/remax": (("trainer.mode=async", "async_rl.max_staleness=0", "algorithm.name=remax"),
                     {"reward.custom_fn_path": VARIED_REWARD}),
    "async0/agent": (("trainer.mode=async", "async_rl.max_staleness=0", "algorithm.name=grpo",
                      "model.path=TURN_MODEL", *AGENT), {}),
    "async0/remax_agent": (("trainer.mode=async", "async_rl.max_staleness=0", "algorithm.name=remax",
                            "model.path=TURN_MODEL", *AGENT), {}),
    "async0/hf": (("trainer.mode=async", "async_rl.max_staleness=0", "rollout.name=hf"), {}),
    # the asynchronous modes off-policy: one step off, partial rollouts with staleness 1
    "one_step_off/ppo": (("trainer.mode=one_step_off", "algorithm.name=ppo"), {}),
    "one_step_off/safe_rlhf": (("trainer.mode=one_step_off", "algorithm.name=safe_rlhf"),
                               {"reward.custom_fn_path": VARIED_REWARD, "cost_model.custom_fn_path": STEPPED_COST}),
    "async1/dapo": ((*ASYNC_1, "algorithm.name=dapo", "rollout.n=4", "async_rl.steps_per_call=4"),
                    {"reward.custom_fn_path": HALF_UNIFORM_REWARD}),
    "async1/remax": ((*ASYNC_1, "algorithm.name=remax", "actor.loss.off_policy.is_level=token"),
                     {"reward.custom_fn_path": VARIED_REWARD}),
    "async1/grpo": ((*ASYNC_1, "actor.loss.off_policy.is_level=token"), {}),
}


def comparable(record: dict) -> dict:
    """The keys of a metrics record that a fixed seed fixes (no times, no transfer stats)."""
    return {k: v for k, v in record.items() if not k.startswith(SKIP) and k != "time"}


def run_case(case: str, tiny_config, tmp_path: Path, score_model: Path | None, turn_model: Path | None) -> list[dict]:
    """The comparable metrics of each step of a 2-step run of `case`."""
    overrides, files = CASES[case]
    chosen = [o.replace("SCORE_MODEL", str(score_model)).replace("TURN_MODEL", str(turn_model)) for o in overrides]
    for key, text in files.items():
        path = tmp_path / f"{key.split('.')[0]}.py"
        path.write_text(text, encoding="utf-8")
        chosen.append(f"{key}={path}")
    with RLTrainer(tiny_config(*BASE, *chosen)) as trainer:
        result = trainer.train(steps=2)
    return [comparable(r) for r in rl_records(result.run_dir)]


def this_machine() -> dict[str, str]:
    """What bit-exact floats depend on: the CPU (model, flags, cores) and the torch build."""
    import torch

    from hybridflow.engines.precision import machine_id

    return {"cpu": machine_id(), "torch": torch.__version__}


# A sync critic-free run, a sync run with a critic, and an off-policy asynchronous one.
REPRESENTATIVE = ("sync/grpo", "sync/ppo", "async1/grpo")


@pytest.mark.parametrize("case", [c if c in REPRESENTATIVE else pytest.param(c, marks=pytest.mark.extended)
                                  for c in CASES])
def test_metrics_equal_the_recorded_ones(case, tiny_config, ray_local, tmp_path, request, turn_model_dir):
    recorded_on = json.loads(MACHINE.read_text(encoding="utf-8")) if MACHINE.is_file() else None
    if not RECORD and recorded_on is not None and recorded_on != this_machine():
        pytest.skip(f"metrics recorded on {recorded_on}, this machine is {this_machine()}: floats are bit-exact "
                    "only on the same CPU model and torch build; record them here first (module docstring)")
    overrides = " ".join(CASES[case][0])
    score_model = request.getfixturevalue("reward_model_dir") if "SCORE_MODEL" in overrides else None
    records = run_case(case, tiny_config, tmp_path, score_model, turn_model_dir)
    recorded = json.loads(FIXTURE.read_text(encoding="utf-8")) if FIXTURE.is_file() else {}
    if RECORD:
        recorded[case] = records
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(_dumps(recorded), encoding="utf-8")
        MACHINE.write_text(json.dumps(this_machine(), indent=1) + "\n", encoding="utf-8")
        return
    assert case in recorded, f"no recorded metrics for {case}: record them (module docstring)"
    # Every recorded number must come back bit for bit; a metric added since the recording
    # (a new key, e.g. adv/silent_groups) is not a changed number and is not compared.
    assert len(records) == len(recorded[case])
    for got, want in zip(records, recorded[case]):
        assert {key: got.get(key, "<missing>") for key in want} == want


def _dumps(recorded: dict[str, list[dict]]) -> str:
    """One line per case (floats as repr: they read back bit for bit)."""
    lines = [f"{json.dumps(case)}: {json.dumps(recorded[case], sort_keys=True, separators=(',', ':'))}"
             for case in sorted(recorded)]
    return "{\n" + ",\n".join(lines) + "\n}\n"
