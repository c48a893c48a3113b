"""A reward function that fails on every sample stops the run at the first step, with the
first sample's error: before it has ever succeeded, a scoring call in which every sample
failed stops the run, and the call itself is given up after GIVE_UP_AFTER failed samples
(or one round of all workers), so a broken or hanging function costs a few samples, not a
batch of time limits. Once it has succeeded, failures are scored and the in-a-row rule
(max_failed_steps) applies."""

from __future__ import annotations

import textwrap

import pytest

from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn
from hybridflow.rewards.manager import GIVE_UP_AFTER, RewardFailureError
from test_reward_manager import make_batch, tokenizer  # noqa: F401 - the fixture

REWARD_FILE = textwrap.dedent(
    '''
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == "broken":
            time.sleep(0.2)  # long enough that the parent sees failures before the batch is done
            raise RuntimeError("always broken")
        if ground_truth == "hang":
            time.sleep(60)
        return 1.0
    '''
)


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "fail_fast_reward.py"
    path.write_text(REWARD_FILE)
    return load_reward_fn(path, "compute_score")


def given_up(err: pytest.ExceptionInfo) -> int:
    text = str(err.value)
    return int(text.split(" given up")[0].rsplit(", ", 1)[1]) if "given up" in text else 0


@pytest.mark.parametrize("truth, first_error", [("broken", "RuntimeError: always broken"),
                                                ("hang", "timeout: reward function ran longer than 1.0 s")])
def test_a_function_failing_every_sample_stops_the_first_step(tokenizer, reward_fn, truth, first_error):
    config = RewardConfig(num_workers=2, timeout_s=1.0, kill_grace_s=1.0)
    with RewardManager(tokenizer, config, reward_fn) as manager, pytest.raises(RewardFailureError) as err:
        manager(make_batch(tokenizer, [str(i) for i in range(32)], [truth] * 32))
    assert "failed on every sample of this step" in str(err.value) and first_error in str(err.value)
    assert given_up(err) > 0  # the call did not run the whole batch
    assert len(str(err.value).splitlines()) == 1


def test_in_process_the_same(tokenizer, reward_fn):
    manager = RewardManager(tokenizer, RewardConfig(num_workers=0, timeout_s=5.0), reward_fn)
    with pytest.raises(RewardFailureError, match=rf"{GIVE_UP_AFTER} scored, 4 given up.*always broken"):
        manager(make_batch(tokenizer, [str(i) for i in range(8)], ["broken"] * 8))


def test_after_a_success_failures_are_scored_and_the_in_a_row_rule_applies(tokenizer, reward_fn):
    config = RewardConfig(num_workers=2, timeout_s=5.0, max_failed_steps=2)
    with RewardManager(tokenizer, config, reward_fn) as manager:
        manager(make_batch(tokenizer, ["1", "2"], ["1", "2"]))
        out = manager(make_batch(tokenizer, [str(i) for i in range(8)], ["broken"] * 4 + ["5", "6", "7", "8"]))
        assert len(out.errors) == 4 and all("always broken" in e for _, e in out.errors)  # none given up
        out = manager(make_batch(tokenizer, [str(i) for i in range(4)], ["broken"] * 4))  # a flaky call, not a stop
        assert len(out.errors) == 4
        with pytest.raises(RewardFailureError, match=r"failed on 4 of 4 samples.*last 2 steps.*always broken"):
            manager(make_batch(tokenizer, [str(i) for i in range(4)], ["broken"] * 4))


def test_max_failed_steps_zero_never_stops(tokenizer, reward_fn):
    config = RewardConfig(num_workers=0, timeout_s=5.0, max_failed_steps=0)
    out = RewardManager(tokenizer, config, reward_fn)(make_batch(tokenizer, ["1"] * 5, ["broken"] * 5))
    assert len(out.errors) == 5 and not any("not scored" in e for _, e in out.errors)


COUNTING_FILE = textwrap.dedent(
    '''
    import os

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as calls:
            calls.write(solution_str + "\\n")
        raise RuntimeError("always broken")
    '''
)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_function_that_fails_at_once_is_called_on_the_first_samples_only(tokenizer, tmp_path, workers):
    # docs/robustness.md: until it has succeeded, the first GIVE_UP_AFTER samples (or one round
    # of all workers, if more) are scored first, and no other sample when they all failed.
    # The function counts its own calls (unconfined, to write the count).
    (tmp_path / "counting_reward.py").write_text(COUNTING_FILE)
    fn = load_reward_fn(tmp_path / "counting_reward.py")
    config = RewardConfig(num_workers=workers, timeout_s=5.0, sandbox=False)
    with RewardManager(tokenizer, config, fn) as manager, pytest.raises(RewardFailureError) as err:
        manager(make_batch(tokenizer, [str(i) for i in range(64)], ["1"] * 64))
    expected = max(GIVE_UP_AFTER, workers)
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == expected
    assert f"({expected} scored, {64 - expected} given up" in str(err.value)
