"""The built-in arithmetic task: exact answers, determinism, disjoint splits, files."""

from __future__ import annotations

import pytest

from hybridflow.data import (
    ArithmeticConfig,
    Problem,
    PromptDataConfig,
    RLPromptDataset,
    SFTDataConfig,
    SFTDataset,
    generate_problems,
    rl_records,
    split_size,
    write_arithmetic_dataset,
)
from hybridflow.data.arithmetic import _enumerate_split


def _evaluate(prompt: str) -> int:
    expr = prompt.rstrip("=")
    for op in "+-*":
        left, sep, right = expr.partition(op)
        if sep and left:
            return {"+": int(left) + int(right), "-": int(left) - int(right), "*": int(left) * int(right)}[op]
    raise AssertionError(prompt)


@pytest.mark.parametrize("ops", [("+",), ("-",), ("*",), ("+", "-", "*")])
def test_answers_are_correct_plain(ops):
    for p in generate_problems(ArithmeticConfig(max_digits=3, operations=ops, zero_pad=False), "train", 300):
        assert p.prompt == f"{p.a}{p.op}{p.b}="
        assert p.answer == str(_evaluate(p.prompt))
        assert p.op in ops
        assert 0 <= p.a < 1000 and 0 <= p.b < 1000


def test_zero_padded_format_has_fixed_widths():
    cfg = ArithmeticConfig(max_digits=2, operations=("+", "-", "*"), allow_negative=True)
    widths = {"+": 3, "-": 2, "*": 4}
    for p in generate_problems(cfg, "train", 500):
        assert p.prompt == f"{p.a:02d}{p.op}{p.b:02d}="
        assert int(p.answer) == _evaluate(p.prompt)
        assert len(p.answer.lstrip("-")) == widths[p.op]
    assert Problem(7, "+", 5, pad_digits=2).prompt == "07+05=" and Problem(7, "+", 5, pad_digits=2).answer == "012"
    assert Problem(3, "-", 9, pad_digits=2).answer == "-06"


def test_subtraction_is_non_negative_unless_allowed():
    plain = generate_problems(ArithmeticConfig(operations=("-",)), "train", 2000)
    assert all(int(p.answer) >= 0 for p in plain)
    signed = generate_problems(ArithmeticConfig(operations=("-",), allow_negative=True), "train", 2000)
    assert any(int(p.answer) < 0 for p in signed)


def test_deterministic_by_seed():
    cfg = ArithmeticConfig(max_digits=3, operations=("+", "*"), seed=7)
    same = ArithmeticConfig(max_digits=3, operations=("+", "*"), seed=7)
    assert generate_problems(cfg, "train", 500) == generate_problems(same, "train", 500)
    other = generate_problems(ArithmeticConfig(max_digits=3, operations=("+", "*"), seed=8), "train", 500)
    assert other != generate_problems(cfg, "train", 500)


def test_splits_partition_the_whole_space():
    cfg = ArithmeticConfig(max_digits=2, operations=("+", "-"), allow_negative=True, test_fraction=0.2)
    train = {tuple(r) for r in _enumerate_split(cfg, "train").tolist()}
    test = {tuple(r) for r in _enumerate_split(cfg, "test").tolist()}
    assert not train & test
    assert len(train) + len(test) == 2 * 100 * 100
    assert 0.17 < len(test) / (len(train) + len(test)) < 0.23
    assert split_size(cfg, "test") == len(test)


@pytest.mark.parametrize("max_digits", [2, 6])  # enumerated space, then a sampled one
def test_train_and_test_never_overlap(max_digits):
    cfg = ArithmeticConfig(max_digits=max_digits, operations=("+", "*"))
    train = {p.prompt for p in generate_problems(cfg, "train", 3000)}
    test = {p.prompt for p in generate_problems(cfg, "test", 500)}
    assert len(train) == 3000 and len(test) == 500  # distinct within a split
    assert not train & test


def test_sampled_space_split_matches_the_hash():
    # In a space too large to enumerate, sampled test problems must still be test-split ones.
    import numpy as np

    from hybridflow.data.arithmetic import _in_split

    cfg = ArithmeticConfig(max_digits=7, operations=("+",))
    assert split_size(cfg, "test") is None
    problems = generate_problems(cfg, "test", 200)
    a = np.array([p.a for p in problems])
    b = np.array([p.b for p in problems])
    assert _in_split(cfg, a, np.zeros(len(a), dtype=np.int64), b, "test").all()
    assert not _in_split(cfg, a, np.zeros(len(a), dtype=np.int64), b, "train").any()


def test_asking_for_more_than_the_split_holds_is_an_error():
    cfg = ArithmeticConfig(max_digits=1)
    size = split_size(cfg, "test")
    assert len(generate_problems(cfg, "test", size)) == size
    with pytest.raises(ValueError, match=f"holds only {size} distinct problems"):
        generate_problems(cfg, "test", size + 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_digits": 0}, "max_digits"),
        ({"operations": ("/",)}, "operations"),
        ({"operations": ()}, "operations"),
        ({"test_fraction": 1.0}, "test_fraction"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArithmeticConfig(**kwargs)


def test_records_are_verl_format():
    record = rl_records(ArithmeticConfig(seed=1), "test", 3)[0]
    assert record["data_source"] == "arithmetic"
    assert record["prompt"][0]["role"] == "user"
    assert record["reward_model"]["style"] == "rule"
    assert int(record["reward_model"]["ground_truth"]) == _evaluate(record["prompt"][0]["content"])
    assert record["extra_info"] == {"split": "test", "index": 0}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_written_files_load_as_datasets(tmp_path, char_tokenizer, fmt):
    files = write_arithmetic_dataset(tmp_path, ArithmeticConfig(), num_train=40, num_test=10, fmt=fmt)
    rl = RLPromptDataset(files["train"], char_tokenizer, PromptDataConfig(max_prompt_length=32))
    test = RLPromptDataset(files["test"], char_tokenizer, PromptDataConfig(max_prompt_length=32))
    sft = SFTDataset(files["sft"], char_tokenizer, SFTDataConfig(max_length=32))
    assert (len(rl), len(test), len(sft)) == (40, 10, 40)
    train_prompts = {rl[i]["raw_prompt"][0]["content"] for i in range(len(rl))}
    assert not train_prompts & {test[i]["raw_prompt"][0]["content"] for i in range(len(test))}
    # SFT pairs are the RL train problems with their answers
    decoded = {char_tokenizer.decode(sft[i]["prompt_ids"], skip_special_tokens=True) for i in range(len(sft))}
    assert decoded == train_prompts
