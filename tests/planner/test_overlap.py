"""The asynchronous modes' overlap rule in the planner (hybridflow/planner/overlap.py)."""

from __future__ import annotations

import pytest

from hybridflow.config.schema import load_run_config
from hybridflow.planner import LLAMA, Cluster
from hybridflow.planner.overlap import (
    Lengths,
    batch_length,
    compare_modes,
    generate_s,
    min_train_devices,
    mode_step,
    overlapped_step,
    train_s,
)
from hybridflow.planner.problem import problem_from_config


def test_overlap_rule_by_hand():
    assert overlapped_step("sync", 5.0, 2.0, 0.5) == 7.0  # one after the other, no sync
    assert overlapped_step("one_step_off", 5.0, 2.0, 0.5) == 5.5  # training hidden under generation
    assert overlapped_step("async", 1.0, 3.0, 0.25) == 3.25  # generation hidden under training
    with pytest.raises(ValueError, match="mode must be"):
        overlapped_step("fast", 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="mean <= longest"):
        Lengths(mean=10, longest=5)


@pytest.fixture(scope="module")
def problem():
    cfg = load_run_config(None, ["resources.world_size=1", "data.train_batch_size=64", "rollout.n=8",
                                 "data.prompt.max_prompt_length=256", "rollout.response_length=4096",
                                 "rollout.max_num_seqs=16", "model.builtin.max_position_embeddings=8192"])
    return problem_from_config(cfg, Cluster.of(2, 8, "h100"), model=LLAMA["llama-7b"])


def test_batch_length_is_waves_of_mean_plus_one_longest(problem):
    lengths = Lengths(mean=500, longest=4000)
    # 512 sequences on 16 replicas: 32 each, 2 waves of 16 -> (500 + 4000) / 2
    assert batch_length(problem, 16, 1, lengths) == 2250
    assert batch_length(problem, 16, 1, Lengths(700, 700)) == 700  # no tail: the mean


def test_modes_compose_the_simulated_phases(problem):
    lengths = Lengths(mean=500, longest=4000)
    sync = mode_step(problem, "sync", lengths, 16)
    assert sync.step_s == pytest.approx(generate_s(problem, 16, 2250, 1, in_place_reshard=True) + train_s(problem, 16, 500, 1))
    off = mode_step(problem, "one_step_off", lengths, 12)
    streamed = mode_step(problem, "async", lengths, 12)
    assert off.train_devices == streamed.train_devices == 4
    assert off.step_s == pytest.approx(max(off.generate_s, off.train_s) + off.sync_s) and off.sync_s > 0
    assert streamed.generate_s < off.generate_s  # streaming follows the mean, not the tail
    with pytest.raises(ValueError, match="both pools"):
        mode_step(problem, "async", lengths, 16)


def test_compare_modes_picks_feasible_splits_and_async_wins_on_a_long_tail(problem):
    rows = {r.mode: r for r in compare_modes(problem, Lengths(mean=500, longest=4000))}
    assert min(r.train_devices for r in rows.values()) >= min_train_devices(problem) >= 2  # 7B at 16 B/param
    assert rows["async"].samples_per_s > rows["sync"].samples_per_s
    same = {r.mode: r for r in compare_modes(problem, Lengths(mean=4000, longest=4000))}
    assert same["async"].generate_s == pytest.approx(same["one_step_off"].generate_s)  # no tail: no streaming gain
