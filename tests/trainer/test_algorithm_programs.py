"""The algorithm registry without workers: every built-in name has a program, a spec row and
docs; presets and invalid combinations; DAPO's dynamic-sampling loop and the exploration of
silent groups on real DataProtos; the algorithm state (Lagrange multiplier) round trip. No Ray here."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow.config import ConfigError
from hybridflow.config.algorithm import algorithm_names, algorithm_spec
from hybridflow.config.schema import load_run_config
from hybridflow.protocol import DataProto
from hybridflow.trainer.programs import algorithms
from hybridflow.trainer.programs.algorithms import build_algo_state, step_program
from hybridflow.trainer.programs.phases import Step, explore_silent_groups, sample_informative_groups

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"
# The rows hybridflow registers itself (tests elsewhere may register more in this session).
BUILTIN = [name for name in algorithm_names() if str(algorithm_spec(name).program).startswith("hybridflow.")]


def test_every_algorithm_name_has_a_program_a_spec_and_docs():
    assert len(BUILTIN) == 9
    for name in BUILTIN:  # each row's "module:function" names a program of trainer/programs/algorithms.py
        program = step_program(algorithm_spec(name))
        assert callable(program) and getattr(algorithms, program.__name__) is program, name
    text = DOC.read_text()
    assert not [name for name in BUILTIN if f"`{name}`" not in text]
    for key in ("algorithm.name", "algorithm.dapo.filter_groups.max_extra_rounds", "algorithm.dapo.overlong_buffer.len",
                "algorithm.safe_rlhf.{lambda_init", "reward_model.path", "reward_model.add_rule_reward",
                "cost_model.path", "cost_model.custom_fn_path", "actor.loss.policy.loss_mode"):
        assert key in text, key


def test_a_program_path_that_does_not_import_names_the_key_and_the_path():
    """step_program resolves a row's "module:function" with registry.import_object."""
    missing_module = dataclasses.replace(algorithm_spec("grpo"), program="no_such_module_xyz:grpo")
    with pytest.raises(ConfigError, match="algorithm.name: cannot import program 'no_such_module_xyz:grpo'"):
        step_program(missing_module)
    missing_attr = dataclasses.replace(algorithm_spec("grpo"),
                                       program="hybridflow.trainer.programs.algorithms:no_such_fn")
    with pytest.raises(ConfigError, match="has no program 'no_such_fn'"):
        step_program(missing_attr)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_algorithm_validates_with_its_defaults(name, tmp_path):
    spec = algorithm_spec(name)
    extra = [f"cost_model.custom_fn_path={tmp_path / 'cost.py'}"] if spec.cost else []
    cfg = load_run_config(None, [f"algorithm.name={name}", *extra])
    assert cfg.algorithm.estimator == spec.default_estimator
    assert cfg.use_critic == bool(spec.critics)


def test_presets_fill_only_what_the_user_left_unset(tmp_path):
    assert load_run_config(None, ["algorithm.name=dapo"]).actor.loss.policy.clip_ratio_high == 0.28
    assert load_run_config(None, ["algorithm.name=dapo",
                                  "actor.loss.policy.clip_ratio_high=0.3"]).actor.loss.policy.clip_ratio_high == 0.3
    config_file = tmp_path / "run.yaml"
    config_file.write_text("algorithm:\n  name: dapo\nactor:\n  loss:\n    policy:\n      clip_ratio_high: 0.35\n")
    assert load_run_config(config_file).actor.loss.policy.clip_ratio_high == 0.35
    assert load_run_config(None, []).actor.loss.policy.clip_ratio_high == 0.2  # grpo: no preset


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.name=drgrpo", "actor.loss.policy.loss_agg_mode=token-mean"],
     r"drgrpo is defined by actor.loss.policy.loss_agg_mode=\"seq-mean-token-sum-norm\""),
    (["algorithm.name=drgrpo", "algorithm.norm_adv_by_std_in_grpo=true"], r"norm_adv_by_std_in_grpo=false"),
    (["algorithm.name=dapo", "actor.loss.policy.loss_agg_mode=seq-mean-token-mean"], r"dapo is defined by"),
    (["algorithm.name=dapo", "actor.loss.policy.clip_ratio_high=0.1"], r"clip_ratio_high=0.1 must be > clip_ratio_low"),
    (["algorithm.name=dapo", "algorithm.dapo.overlong_buffer.len=7"], r"overlong_buffer.len=7 exceeds rollout"),
    (["algorithm.name=remax", "algorithm.adv_estimator=rloo"], r"remax uses adv_estimator=remax.*algorithm.name=rloo"),
    (["algorithm.name=rloo", "rollout.n=1"], r"rloo compares the samples .* rollout.n >= 2"),
    (["algorithm.name=safe_rlhf"], r"safe_rlhf needs a cost"),
    (["algorithm.dapo.filter_groups.max_extra_rounds=2"], r"algorithm.dapo.\* is read only by algorithm.name=dapo"),
    (["cost_model.path=/x"], r"read only by algorithm.name=safe_rlhf"),
    (["algorithm.name=safe_rlhf", "cost_model.custom_fn_path=c.py", "algorithm.safe_rlhf.lambda_init=0"],
     r"init must be > 0"),
    (["resources.world_size=2", "reward_model.path=/rm", "reward_model.tp_size=4"],
     r"reward_model.tp_size: 4 does not divide"),
])
def test_invalid_combinations_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, overrides)


# ----------------------------------------------------------------------------- dynamic sampling


def _round(prompts: DataProto, n: int, scores_of_prompt: dict[int, list[float]], round_: int) -> DataProto:
    """What generate + compute_reward give for `prompts`: n samples per prompt, the prompt
    width of this batch, the given scores on the last response token."""
    rows, width, resp = len(prompts), prompts.batch["input_ids"].shape[1], 3
    index = np.repeat(prompts.non_tensor_batch["index"], n)
    scores = torch.zeros(rows * n, resp)
    scores[:, -1] = torch.tensor([s for i in prompts.non_tensor_batch["index"] for s in scores_of_prompt[i]])
    return DataProto.from_dict(
        tensors={"prompts": torch.ones(rows * n, width, dtype=torch.long),
                 "input_ids": torch.ones(rows * n, width + resp, dtype=torch.long),
                 "attention_mask": torch.ones(rows * n, width + resp, dtype=torch.long),
                 "position_ids": torch.arange(width + resp).repeat(rows * n, 1),
                 "responses": torch.ones(rows * n, resp, dtype=torch.long),
                 "response_mask": torch.ones(rows * n, resp), "token_level_scores": scores},
        non_tensors={"uid": [f"{round_}-{i}" for i in index], "index": index.tolist()},
    )


def _prompts(indices: list[int], width: int) -> DataProto:
    return DataProto.from_dict(tensors={"input_ids": torch.ones(len(indices), width, dtype=torch.long)},
                               non_tensors={"index": indices})


def _run_sampling(scores: dict[int, list[float]], groups: int, max_extra_rounds: int, unit: int = 1) -> Step:
    batches = iter([_prompts([4, 5, 6, 7], 7), _prompts([8, 9, 10, 11], 3), _prompts([12, 13, 14, 15], 5)])
    step = Step(1, _prompts([0, 1, 2, 3], 5), more_prompts=lambda: next(batches))

    def sample_round(part: Step, round_: int) -> None:
        part.batch = _round(part.batch, 2, scores, round_)

    sample_informative_groups(step, sample_round, groups, max_extra_rounds, unit)
    return step


def test_dynamic_sampling_keeps_generating_until_the_batch_is_full():
    # Informative (scores differ): prompts 1, 4, 5, 9, 10, 13; the rest are all-equal groups.
    informative = {1, 4, 5, 9, 10, 13}
    scores = {i: [0.0, 1.0] if i in informative else [0.5, 0.5] for i in range(16)}
    step = _run_sampling(scores, groups=4, max_extra_rounds=8)
    kept = step.batch.non_tensor_batch["index"]
    assert kept.tolist() == [1, 1, 4, 4, 5, 5, 9, 9]  # exactly 4 groups, the first found, in order
    assert step.batch.batch["input_ids"].shape[1] == 7 + 3  # prompts of all rounds padded to the widest
    m = step.metrics
    assert (m["dapo/rounds"], m["dapo/generated_groups"], m["dapo/kept_groups"], m["dapo/trained_groups"],
            m["dapo/cap_hit"]) == (3, 12, 5, 4, 0)


def test_dynamic_sampling_rounds_run_with_the_steps_phase_callback_and_concurrency():
    """Every round's phases are told to the live status (on_phase) and keep trainer.concurrent_phases."""
    heard, seen = [], []
    step = Step(1, _prompts([0, 1, 2, 3], 5), more_prompts=lambda: _prompts([4, 5, 6, 7], 7),
                on_phase=heard.append, concurrent=False)

    def sample_round(part: Step, round_: int) -> None:
        part.on_phase(f"gen{round_}")
        seen.append(part.concurrent)
        part.batch = _round(part.batch, 2, {i: [0.5, 0.5] for i in range(8)}, round_)

    with pytest.raises(RuntimeError, match="kept 0 groups"):
        sample_informative_groups(step, sample_round, groups=4, max_extra_rounds=1, group_unit=1)
    assert heard == ["dynamic_sampling", "gen0", "gen1"] and seen == [False, False]


def test_dynamic_sampling_cap_trains_on_whole_mini_batches_or_fails_when_nothing_is_kept():
    scores = {i: [0.0, 1.0] if i in (1, 4, 5) else [0.5, 0.5] for i in range(16)}
    step = _run_sampling(scores, groups=4, max_extra_rounds=1, unit=2)  # 3 found, cut to 2
    assert step.batch.non_tensor_batch["index"].tolist() == [1, 1, 4, 4]
    assert step.metrics["dapo/cap_hit"] == 1 and step.metrics["dapo/rounds"] == 2
    uniform = {i: [0.5, 0.5] for i in range(16)}
    with pytest.raises(RuntimeError, match="kept 0 groups .* in 2 rounds .*max_extra_rounds"):
        _run_sampling(uniform, groups=4, max_extra_rounds=1)


# ----------------------------------------------------------------------------- exploration


def _run_exploration(scores_per_try: dict[int, list[list[float]]], max_extra_groups: int, per_prompt: int,
                     unit: int = 1) -> tuple[Step, list[list[int]]]:
    """Explore prompts 0-3 (n=2); prompt i's k-th group (k = 0, 1, ...) scores scores_per_try[i][k]
    (the last one again once they run out). Returns the step and the prompts of each round."""
    step = Step(1, _prompts([0, 1, 2, 3], 5))
    tries: dict[int, int] = {}
    rounds: list[list[int]] = []

    def sample_round(part: Step, round_: int) -> None:
        indices = part.batch.non_tensor_batch["index"].tolist()
        rounds.append(indices)
        scores = {}
        for i in indices:  # a prompt drawn twice in one round gets its next two groups
            k = tries.get(i, 0)
            tries[i] = k + 1
            scores.setdefault(i, []).extend(scores_per_try[i][min(k, len(scores_per_try[i]) - 1)])
        part.batch = _round(part.batch, 2, {i: s for i, s in scores.items()}, round_) if len(set(indices)) == len(
            indices) else _round_dup(part.batch, scores, round_)

    explore_silent_groups(step, sample_round, max_extra_groups, per_prompt, unit)
    return step, rounds


def _round_dup(prompts: DataProto, scores: dict[int, list[float]], round_: int) -> DataProto:
    """_round for a round that draws a prompt twice: each draw its own group (uid) and scores."""
    parts, used = [], {}
    for row, i in enumerate(prompts.non_tensor_batch["index"].tolist()):
        k = used.get(i, 0)
        used[i] = k + 1
        part = _round(prompts[row:row + 1], 2, {i: scores[i][2 * k:2 * k + 2]}, round_)
        part.non_tensor_batch["uid"] = np.array([f"{round_}-{row}"] * 2, dtype=object)
        parts.append(part)
    return DataProto.concat(parts)


SILENT, DIFFERS = [0.0, 0.0], [0.0, 1.0]


def test_exploration_samples_silent_prompts_again_until_their_group_differs():
    # Prompt 0 differs at once; 1 on its 2nd extra try; 2 never; 3 on its 1st extra try.
    scores = {0: [DIFFERS], 1: [SILENT, SILENT, DIFFERS], 2: [SILENT], 3: [SILENT, DIFFERS]}
    step, rounds = _run_exploration(scores, max_extra_groups=16, per_prompt=3)
    assert rounds == [[0, 1, 2, 3], [1, 2, 3], [1, 2], [2]]  # silent ones again, until found or tried 3 times
    assert step.batch.non_tensor_batch["index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # one group per prompt, in order
    sums = step.batch.batch["token_level_scores"].sum(-1).tolist()
    assert sums == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]  # the groups that differ replaced the silent ones
    m = step.metrics
    assert (m["explore/silent_before"], m["explore/silent_after"], m["explore/found"], m["explore/rounds"],
            m["explore/extra_groups"], m["explore/extra_samples"], m["explore/extra_response_tokens"]) == (
        3, 1, 2, 3, 6, 12, 36)
    assert "timing_s/explore" in m


def test_exploration_stops_at_the_step_budget_and_draws_whole_rollout_units():
    scores = {0: [SILENT], 1: [SILENT], 2: [SILENT], 3: [DIFFERS]}
    _, rounds = _run_exploration(scores, max_extra_groups=5, per_prompt=4, unit=2)
    assert rounds[1:] == [[0, 1], [2, 0]]  # 4 of the budget of 5: whole units of 2, fewest tries first
    # One silent prompt left: it is drawn twice in a round (a unit of 2), within its own cap.
    step, rounds = _run_exploration({0: [SILENT], 1: [DIFFERS], 2: [DIFFERS], 3: [DIFFERS]}, 10, 3, unit=2)
    assert rounds[1:] == [[0, 0]] and step.metrics["explore/extra_groups"] == 2  # 3 left, 2 of them drawn
    assert step.batch.non_tensor_batch["index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_exploration_is_off_by_default_and_read_only_by_rows_that_declare_it(tmp_path):
    assert not load_run_config(None, []).algorithm.exploration.enabled
    assert load_run_config(None, ["algorithm.exploration.max_extra_groups=8"]).algorithm.exploration.enabled
    assert [n for n in BUILTIN if algorithm_spec(n).exploration] == ["grpo", "rloo", "reinforce_plus_plus_baseline",
                                                                     "drgrpo"]
    with pytest.raises(ConfigError, match=r"^algorithm\.exploration\.max_extra_groups: is read only by "
                                          r"algorithm\.name=grpo or rloo"):
        load_run_config(None, ["algorithm.name=ppo", "algorithm.exploration.max_extra_groups=8"])
    with pytest.raises(ConfigError, match=r"^algorithm\.exploration\.max_extra_groups: samples prompts again"):
        load_run_config(None, ["trainer.mode=one_step_off", "algorithm.exploration.max_extra_groups=8"])
    with pytest.raises(ConfigError, match=r"^algorithm\.exploration\.max_tries_per_prompt: must be >= 1"):
        load_run_config(None, ["algorithm.exploration.max_tries_per_prompt=0"])


def test_algorithm_state_saves_the_lagrange_multiplier(tmp_path):
    cfg = load_run_config(None, ["algorithm.name=safe_rlhf", f"cost_model.custom_fn_path={tmp_path / 'c.py'}",
                                 "algorithm.safe_rlhf.cost_limit=0.5"])
    state = build_algo_state(cfg)
    state.lagrange.update(2.0)
    restored = build_algo_state(cfg)
    restored.load_state_dict(state.state_dict())
    assert restored.lagrange.value == state.lagrange.value > 1.0
    assert math.isclose(restored.lagrange.value, math.exp(0.1 * 1.5))
    with pytest.raises(ValueError, match="Lagrange multiplier"):
        build_algo_state(load_run_config(None, [])).load_state_dict(state.state_dict())


def test_a_streamed_step_serves_one_generation_and_refuses_a_second():
    """The asynchronous modes serve a program's generate phase from the rollout pool's
    groups (trainer/modes/stream_step.py), once per step: a program that generates again is told why."""
    from hybridflow.trainer.programs import phases as P

    groups = DataProto.from_dict(tensors={"x": torch.zeros(2, 1)})
    step = Step(1, DataProto(), streamed=groups, served=frozenset({"generate"}))
    P.generate(step, None, 2)  # no actor is called
    assert step.batch is groups and "timing_s/gen" in step.metrics
    with pytest.raises(RuntimeError, match="generated twice in one step.*dynamic_sampling"):
        P.generate(step, None, 2)
