"""The planner's dataflow (AlgorithmSpec.phases) says what the step programs do: every
built-in program runs here with recording phase functions (no workers), and the phases it
calls with a model, in order, are the spec's active phases, in the `concurrently` blocks
the spec declares (FlowPhase.block): the planner overlaps those across pools."""

from __future__ import annotations

import dataclasses

import pytest

from hybridflow.config.algorithm import algorithm_spec
from hybridflow.config.schema import load_run_config
from hybridflow.planner.problem import active_phases, run_settings
from hybridflow.trainer.programs import phases as P
from hybridflow.trainer.programs.algorithms import build_algo_state, step_program
from hybridflow.trainer.programs.phases import Roles, Step

ROLE_NAMES = ("actor", "critic", "cost_critic", "reward_model", "cost_model", "controller")


def _record(monkeypatch) -> list[tuple[str, str, int | None]]:
    """Replace the phase functions by recorders of (phase, role, the block it runs in: the
    id of the step's open `concurrently` block, the real one of concurrent.py, or None)."""
    calls: list[tuple[str, str, int | None]] = []
    for attr in dir(P):
        fn = getattr(P, attr)
        if not callable(fn) or isinstance(fn, type) or getattr(fn, "__module__", None) != P.__name__ or attr == "phase":
            continue
        name = getattr(fn, "phase_name", None)  # None: controller-side math, recorded as nothing
        if name == "dynamic_sampling":  # a loop around generate + reward: run one round of it
            monkeypatch.setattr(P, attr, lambda step, sample_round, *a, **k: sample_round(step, 0))
            continue

        def recorder(*args, _name=name, **kwargs):
            step = next(a for a in args if isinstance(a, Step))
            block = None if step.block is None else id(step.block)
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, str) and arg in ROLE_NAMES:
                    calls.append((_name, arg, block))

        monkeypatch.setattr(P, attr, recorder)
    return calls


def _roles(cfg) -> Roles:
    return Roles(actor="actor", critic="critic" if cfg.use_critic else None,
                 reward="controller", reward_model="reward_model" if cfg.reward_model.path else None,
                 cost_critic="cost_critic" if "cost_critic" in cfg.algorithm.spec.critics else None,
                 cost_model="cost_model" if cfg.cost_model.path else None,
                 cost_fn="controller" if cfg.cost_model.custom_fn_path else None)


CASES = [(name, extra) for name in ("grpo", "ppo", "remax", "dapo", "drgrpo", "rloo", "safe_rlhf")
         for extra in ([], ["actor.loss.use_kl_loss=true"], ["actor.old_log_probs=recompute"],
                       ["reward_model.add_rule_reward=true"])]


@pytest.mark.parametrize("name, extra", CASES)
def test_program_calls_the_phases_its_spec_lists(name, extra, monkeypatch, tmp_path, tiny_reward_dir):
    overrides = [f"algorithm.name={name}", *extra]
    if "reward_model.add_rule_reward=true" in extra:
        overrides.append(f"reward_model.path={tiny_reward_dir}")
    if algorithm_spec(name).cost:  # a cost model, plus the rule-based cost function in two of the cases
        overrides.append(f"cost_model.path={tiny_reward_dir}")
        if extra and extra[0] != "actor.loss.use_kl_loss=true":
            overrides.append(f"cost_model.custom_fn_path={tmp_path / 'cost.py'}")
    cfg = load_run_config(None, overrides)
    calls = _record(monkeypatch)
    step_program(cfg.algorithm.spec)(Step(0, batch=None), _roles(cfg), cfg, build_algo_state(cfg))
    owner = {"reference": "actor"}  # the reference policy runs in the actor's worker
    declared = active_phases(cfg.algorithm.spec.phases, run_settings(cfg))
    assert [(name, role) for name, role, _ in calls] == [(p.name, owner.get(p.role, p.role)) for p in declared]
    assert _partition([block for _, _, block in calls]) == _partition([p.block for p in declared])


def _partition(labels: list) -> list[int | None]:
    """Which calls share a block, whatever the blocks are called: each label replaced by
    the position of its first call (None: not in a block)."""
    first: dict = {}
    return [None if label is None else first.setdefault(label, i) for i, label in enumerate(labels)]


def test_a_spec_that_misses_a_phase_is_caught(monkeypatch):
    """The check above can fail: ReMax's program run against the standard (grpo) dataflow."""
    cfg = load_run_config(None, ["algorithm.name=remax"])
    calls = _record(monkeypatch)
    step_program(cfg.algorithm.spec)(Step(0, batch=None), _roles(cfg), cfg, build_algo_state(cfg))
    standard = [(p.name, p.role) for p in active_phases(algorithm_spec("grpo").phases, run_settings(cfg))]
    assert ("greedy_baseline", "actor") in [(n, r) for n, r, _ in calls] and [(n, r) for n, r, _ in calls] != standard


def test_a_spec_that_misses_a_block_is_caught(monkeypatch):
    """The block check can fail: PPO's program against its dataflow without the blocks."""
    cfg = load_run_config(None, ["algorithm.name=ppo", "actor.old_log_probs=recompute"])
    calls = _record(monkeypatch)
    step_program(cfg.algorithm.spec)(Step(0, batch=None), _roles(cfg), cfg, build_algo_state(cfg))
    serial = [dataclasses.replace(p, block=None) for p in active_phases(cfg.algorithm.spec.phases, run_settings(cfg))]
    recorded = _partition([block for _, _, block in calls])
    assert recorded != _partition([p.block for p in serial])
    # the actor's update and the critic's are in one block, the values with the log-probs in another
    by_name = dict(zip([n for n, _, _ in calls], recorded))
    assert by_name["update_actor"] == by_name["update_critic"] is not None
    assert by_name["values"] == by_name["old_log_prob"] is not None and by_name["values"] != by_name["update_actor"]
