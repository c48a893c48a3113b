"""RewardManager: score placement, extras, and containment of failing, hanging and
crashing reward functions, in-process and in a reused worker pool."""

from __future__ import annotations

import textwrap

import pytest
import torch

from hybridflow.data import build_char_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn

# A reward function whose behaviour is chosen by the ground truth, so one pool can show
# every failure mode. "hard" blocks the alarm, so only killing its process stops it.
REWARD_FILE = textwrap.dedent(
    '''
    import os, signal, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == "raise":
            raise RuntimeError("bad sample")
        if ground_truth == "hang":
            time.sleep(60)
        if ground_truth == "hard":
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            time.sleep(60)
        if ground_truth == "crash":
            os._exit(3)
        if ground_truth == "nan":
            return float("nan")
        if ground_truth == "text":
            return "great"
        if ground_truth == "nokey":
            return {"value": 1.0}
        return {"score": float(solution_str == ground_truth), "pid": os.getpid(), "length": len(solution_str)}

    def two_args(solution_str, ground_truth):
        return 1.0

    def wrong_shape(text, answer):
        return 1.0
    '''
)

TIMEOUT = 0.5
GRACE = 0.5


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "my_reward.py"
    path.write_text(REWARD_FILE)
    return load_reward_fn(path, "compute_score")


@pytest.fixture(scope="module")
def pooled(tokenizer, reward_fn):
    manager = RewardManager(tokenizer, RewardConfig(num_workers=2, timeout_s=TIMEOUT, kill_grace_s=GRACE), reward_fn)
    yield manager
    manager.close()


def make_batch(tokenizer, texts, truths, pad_to=None, data_source="custom"):
    """Right-padded responses (text + eos) with their masks, as a rollout would return them."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] if t else [] for t in texts]
    width = pad_to or max(len(x) for x in ids)
    responses = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, x in enumerate(ids):
        responses[row, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[row, : len(x)] = 1
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={"data_source": [data_source] * len(ids), "ground_truth": list(truths),
                     "extra_info": [{"i": i} for i in range(len(ids))]},
    )


def test_in_process_places_score_on_last_valid_token(tokenizer, reward_fn):
    manager = RewardManager(tokenizer, RewardConfig(num_workers=0, timeout_s=TIMEOUT), reward_fn)
    batch = make_batch(tokenizer, ["12", "7", "", "99"], ["12", "8", "x", "99"], pad_to=5)
    out = manager(batch)
    assert out.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    expected = torch.zeros(4, 5)
    expected[0, 2] = 1.0  # "1", "2", eos: the score sits on eos, the last valid token
    expected[3, 2] = 1.0
    assert out.token_level_scores.equal(expected)
    assert out.metrics["reward/empty_responses"] == 1.0
    assert out.extra_info["length"] == [2, 1, 0, 2]  # decoded without the eos token
    proto = out.to_dataproto()
    assert proto.batch["token_level_scores"].equal(expected)
    assert list(proto.non_tensor_batch["length"]) == [2, 1, 0, 2]


def test_in_process_contains_errors_and_timeouts(tokenizer, reward_fn):
    manager = RewardManager(tokenizer, RewardConfig(num_workers=0, timeout_s=TIMEOUT, error_score=-1.0), reward_fn)
    out = manager(make_batch(tokenizer, ["1", "2", "3", "4", "5", "6"], ["1", "raise", "hang", "nan", "text", "nokey"]))
    assert out.scores.tolist() == [1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
    assert out.metrics["reward/errors"] == 4.0 and out.metrics["reward/timeouts"] == 1.0
    messages = dict(out.errors)
    assert "RuntimeError: bad sample" in messages[1] and "my_reward.py" in messages[1]
    assert messages[2].startswith("timeout")
    assert "non-finite" in messages[3] and "return a float" in messages[4] and "without 'score'" in messages[5]


def test_pool_scores_and_is_reused(tokenizer, pooled):
    first = pooled(make_batch(tokenizer, ["1", "22", "3", "44"], ["1", "22", "0", "44"]))
    second = pooled(make_batch(tokenizer, ["5", "6", "7", "8"], ["5", "6", "7", "8"]))
    assert first.scores.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert second.scores.tolist() == [1.0] * 4
    assert first.metrics["reward/worker_restarts"] == second.metrics["reward/worker_restarts"] == 0.0
    # the same (at most num_workers) processes served both batches: no pool per batch
    assert len(set(first.extra_info["pid"]) | set(second.extra_info["pid"])) <= 2


def test_pool_contains_exceptions_and_interruptible_hangs(tokenizer, pooled):
    out = pooled(make_batch(tokenizer, ["1", "2", "3", "4", "5"], ["1", "raise", "hang", "4", "hang"]))
    assert out.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert out.metrics["reward/errors"] == 1.0
    assert out.metrics["reward/timeouts"] == 2.0
    assert out.metrics["reward/worker_restarts"] == 0.0  # the alarm stopped them; workers live on


def test_pool_kills_a_worker_that_ignores_the_timeout(tokenizer, pooled):
    out = pooled(make_batch(tokenizer, ["1", "2", "3", "4", "5", "6"], ["1", "hard", "3", "hard", "5", "hard"]))
    assert out.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert out.metrics["reward/timeouts"] == 3.0 and out.metrics["reward/errors"] == 0.0
    assert 1.0 <= out.metrics["reward/worker_restarts"] <= 3.0  # hung workers killed together when they can be
    assert all("was killed" in dict(out.errors)[i] for i in (1, 3, 5))
    after = pooled(make_batch(tokenizer, ["9"], ["9"]))  # the replaced pool keeps working
    assert after.scores.tolist() == [1.0]


def test_pool_survives_a_crashing_worker(tokenizer, pooled):
    out = pooled(make_batch(tokenizer, ["1", "2", "3", "4", "5"], ["1", "crash", "3", "4", "5"]))
    assert out.scores.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0]  # innocent samples are not blamed
    assert out.metrics["reward/errors"] == 1.0
    assert "died while scoring this sample" in dict(out.errors)[1]


def test_pool_chunks_keep_per_sample_timeouts_and_blame(tokenizer, pooled):
    # 24 samples on 2 workers travel in chunks of 3: a sample that hangs (alarm blocked) or
    # kills its worker in the middle of a chunk is the only one that fails.
    truths = [str(i) for i in range(24)]
    truths[4], truths[13], truths[20] = "hard", "crash", "hang"
    out = pooled(make_batch(tokenizer, [str(i) for i in range(24)], truths))
    want = [0.0 if i in (4, 13, 20) else 1.0 for i in range(24)]
    assert out.scores.tolist() == want
    assert out.metrics["reward/timeouts"] == 2.0 and out.metrics["reward/errors"] == 1.0
    assert "was killed" in dict(out.errors)[4] and "died while scoring" in dict(out.errors)[13]


def test_pool_with_builtin_scorers(tokenizer):
    with RewardManager(tokenizer, RewardConfig(num_workers=1, timeout_s=5.0)) as manager:
        out = manager(make_batch(tokenizer, ["46", "45"], ["46", "46"], data_source="arithmetic"))
    assert out.scores.tolist() == [1.0, 0.0]


def test_missing_inputs_are_named(tokenizer, reward_fn):
    manager = RewardManager(tokenizer, RewardConfig(num_workers=0), reward_fn)
    batch = make_batch(tokenizer, ["1"], ["1"])
    batch.non_tensor_batch.pop("ground_truth")
    with pytest.raises(KeyError, match="missing \\['ground_truth'\\]"):
        manager(batch)


def test_load_reward_fn_errors(tmp_path, reward_fn):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_reward_fn(tmp_path / "absent.py", "compute_score")
    with pytest.raises(AttributeError, match=r"defines no 'score_fn'.*\['compute_score', 'two_args', 'wrong_shape'\]"):
        load_reward_fn(reward_fn.path, "score_fn")
    # verl's per-data-set scorers take (solution_str, ground_truth): called with just those
    assert load_reward_fn(reward_fn.path, "two_args")(data_source="x", solution_str="1", ground_truth="1",
                                                     extra_info=None) == 1.0
    with pytest.raises(TypeError, match=r"wrong_shape in my_reward.py has parameters \['text', 'answer'\].*"
                                        r"compute_score\(data_source, solution_str, ground_truth.*"
                                        r"compute_score\(solution_str, ground_truth.*reward\(completions"):
        load_reward_fn(reward_fn.path, "wrong_shape")
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(ImportError, match="importing reward file .* failed: ModuleNotFoundError"):
        load_reward_fn(broken, "compute_score")


def test_unpicklable_function_is_refused_for_a_pool(tokenizer):
    with pytest.raises(ValueError, match="cannot be sent to worker processes.*load_reward_fn"):
        RewardManager(tokenizer, RewardConfig(num_workers=1), lambda **kwargs: 1.0)


def test_config_validation():
    with pytest.raises(ValueError, match="num_workers"):
        RewardConfig(num_workers=-1)
    with pytest.raises(ValueError, match="mp_context"):
        RewardConfig(mp_context="fork")


def test_in_process_restores_an_outer_alarm(tokenizer, reward_fn):
    import signal

    handler = signal.signal(signal.SIGALRM, lambda *args: None)
    outer = signal.getitimer(signal.ITIMER_REAL)
    try:
        signal.setitimer(signal.ITIMER_REAL, 300.0)
        manager = RewardManager(tokenizer, RewardConfig(num_workers=0, timeout_s=TIMEOUT), reward_fn)
        manager(make_batch(tokenizer, ["1", "2"], ["1", "hang"]))
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 200.0 < remaining <= 300.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, *outer)
        signal.signal(signal.SIGALRM, handler)
