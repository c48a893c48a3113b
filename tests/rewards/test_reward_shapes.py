"""Reward functions as people write them (rewards/shapes.py): verl's scorer shape called with
the arguments it names, a reward file importing the modules beside it (in the confined
worker processes too), and TRL's batched functions with the prompts, completions,
completion ids and data set columns TRL passes, several summed with weights."""

from __future__ import annotations

import textwrap

import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn
from test_reward_manager import tokenizer  # noqa: F401 - the fixture

TRL_REWARDS = textwrap.dedent(
    '''
    def accuracy(completions, solution, **kwargs):
        return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]

    def seen(prompts, completions, completion_ids, solution, data_source, **kwargs):
        """What TRL passes, encoded in the value: the chunk's size, then checks of each argument."""
        assert all(p[0]["role"] == "user" for p in prompts) and len(prompts) == len(completion_ids)
        return [100 * len(completions) + len(ids) for ids in completion_ids]

    def text_lengths(completions, **kwargs):
        return [float(len(c)) for c in completions]

    def some_none(completions, solution, **kwargs):
        return [None if s == "skip" else 1.0 for s in solution]
    '''
)

SCORER_FILE = textwrap.dedent(
    '''
    import helpers
    from . import helpers as same_helpers

    def compute_score(solution_str, ground_truth):
        return float(helpers.normalise(solution_str) == same_helpers.normalise(ground_truth))
    '''
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rewards")
    (folder / "trl_rewards.py").write_text(TRL_REWARDS)
    (folder / "scorer.py").write_text(SCORER_FILE)
    (folder / "helpers.py").write_text("def normalise(text):\n    return text.strip().lstrip('0') or '0'\n")
    return folder


def batch(tokenizer, texts, solutions, chat=True):
    """Responses (text + eos) with the non-tensors a rollout carries: the prompt as the data
    set gave it and the row's other columns."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    width = max(map(len, ids))
    responses, mask = torch.zeros(len(ids), width, dtype=torch.long), torch.zeros(len(ids), width, dtype=torch.long)
    for row, x in enumerate(ids):
        responses[row, : len(x)], mask[row, : len(x)] = torch.tensor(x), 1
    prompts = [[{"role": "user", "content": f"q{i}"}] if chat else f"q{i}" for i in range(len(texts))]
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={"data_source": ["dataset"] * len(ids), "ground_truth": [None] * len(ids),
                     "extra_info": [{}] * len(ids), "raw_prompt": prompts,
                     "columns": [{"solution": s, "data_source": "dataset"} for s in solutions]})


def test_trl_functions_get_what_trl_passes_in_one_call_per_worker(tokenizer, files):
    fn = load_reward_fn(files / "trl_rewards.py", "seen")
    with RewardManager(tokenizer, RewardConfig(num_workers=2), fn) as manager:  # confined worker processes
        out = manager(batch(tokenizer, ["7", "42", "1", "123"], ["7", "42", "2", "3"]))
    assert out.errors == []
    # two chunks of two completions; each completion's ids are its text and eos
    assert out.scores.tolist() == [202.0, 203.0, 202.0, 204.0]
    accuracy = load_reward_fn(files / "trl_rewards.py", "accuracy")
    with RewardManager(tokenizer, RewardConfig(num_workers=0), accuracy) as manager:
        assert manager(batch(tokenizer, ["7", "42", "1"], ["7", "42", "2"])).scores.tolist() == [1.0, 1.0, 0.0]


def test_plain_text_prompts_give_text_completions(tokenizer, files):
    fn = load_reward_fn(files / "trl_rewards.py", "text_lengths")
    with RewardManager(tokenizer, RewardConfig(num_workers=0), fn) as manager:
        assert manager(batch(tokenizer, ["ab", "abcd"], ["", ""], chat=False)).scores.tolist() == [2.0, 4.0]


def test_several_functions_are_summed_with_weights_and_none_means_no_reward(tokenizer, files):
    fn = load_reward_fn(files / "trl_rewards.py", ["accuracy", "some_none"], [2.0, 0.5])
    with RewardManager(tokenizer, RewardConfig(num_workers=1), fn) as manager:
        out = manager(batch(tokenizer, ["7", "8", "9"], ["7", "skip", "1"]))
    assert out.scores.tolist() == [2.5, 0.0, 0.5]  # 8: only accuracy gave a value (0)
    # each function's own value, logged as its batch mean over the completions it scored
    assert out.metrics["reward_fn/accuracy"] == pytest.approx(1 / 3) and out.metrics["reward_fn/some_none"] == 1.0
    alone = load_reward_fn(files / "trl_rewards.py", "some_none")
    with RewardManager(tokenizer, RewardConfig(num_workers=0, error_score=-1.0), alone) as manager:
        out = manager(batch(tokenizer, ["7", "8"], ["7", "skip"]))
    assert out.scores.tolist() == [1.0, -1.0] and "returned None" in out.errors[0][1]


def test_a_verl_scorer_imports_the_modules_beside_it_in_confined_workers(tokenizer, files):
    """verl's scorer shape (solution_str, ground_truth), no wrapper; `import helpers` and
    `from . import helpers` of the file's folder, in sandboxed worker processes."""
    fn = load_reward_fn(files / "scorer.py")
    with RewardManager(tokenizer, RewardConfig(num_workers=1, sandbox=True), fn) as manager:
        data = batch(tokenizer, ["007", "8"], ["", ""])
        data.non_tensor_batch["ground_truth"][:] = ["7", "9"]
        out = manager(data)
    assert out.errors == [] and out.scores.tolist() == [1.0, 0.0]
