"""RL prompt data set: verl parquet and plain jsonl in, left-padded DataProto out."""

from __future__ import annotations

import json

import pytest
import torch

from hybridflow.data import PromptDataConfig, RLPromptDataset, collate_prompts, write_records
from hybridflow.protocol import DataProto

VERL_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "5"},
        "extra_info": {"split": "train", "index": 11},
    },
    {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": "7+8="}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": "15"},
        "extra_info": {"split": "train", "index": 12},
    },
]


def _rendered(tok, messages):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_verl_parquet_round_trip(tmp_path, char_tokenizer):
    path = write_records(VERL_ROWS, tmp_path / "train.parquet")
    ds = RLPromptDataset(path, char_tokenizer, PromptDataConfig(max_prompt_length=64))
    batch = ds.collate([ds[0], ds[1]])
    assert isinstance(batch, DataProto)
    ids, mask, pos = batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"]
    expected = [_rendered(char_tokenizer, row["prompt"]) for row in VERL_ROWS]
    width = max(map(len, expected))
    assert ids.shape == mask.shape == pos.shape == (2, width)
    for row, tokens in enumerate(expected):
        pad = width - len(tokens)
        assert ids[row, pad:].tolist() == tokens  # left padded
        assert ids[row, :pad].eq(char_tokenizer.pad_token_id).all()
        assert mask[row].tolist() == [0] * pad + [1] * len(tokens)
        assert pos[row, pad:].tolist() == list(range(len(tokens)))
    nt = batch.non_tensor_batch
    assert list(nt["data_source"]) == ["openai/gsm8k", "arithmetic"]
    assert list(nt["ground_truth"]) == ["5", "15"]
    assert list(nt["raw_prompt"]) == [VERL_ROWS[0]["prompt"], VERL_ROWS[1]["prompt"]]
    assert list(nt["extra_info"]) == [VERL_ROWS[0]["extra_info"], VERL_ROWS[1]["extra_info"]]
    assert list(nt["index"]) == [0, 1]


def test_plain_jsonl_string_prompts(tmp_path, char_tokenizer):
    path = tmp_path / "plain.jsonl"
    pairs = [("1+1=", "2"), ("10+5=", "15")]
    path.write_text("\n".join(json.dumps({"prompt": p, "ground_truth": g}) for p, g in pairs))
    cfg = PromptDataConfig(apply_chat_template=False, default_data_source="arithmetic")
    raw = RLPromptDataset(path, char_tokenizer, cfg)
    assert raw[1]["input_ids"] == char_tokenizer("10+5=", add_special_tokens=False)["input_ids"]
    assert raw[1]["ground_truth"] == "15" and raw[1]["data_source"] == "arithmetic"
    chat = RLPromptDataset(path, char_tokenizer, PromptDataConfig(default_data_source="arithmetic"))
    assert chat[0]["input_ids"] == _rendered(char_tokenizer, [{"role": "user", "content": "1+1="}])


def test_messages_without_chat_template_is_an_error(tmp_path, char_tokenizer):
    path = write_records(VERL_ROWS, tmp_path / "t.jsonl")
    with pytest.raises(ValueError, match="apply_chat_template is false"):
        RLPromptDataset(path, char_tokenizer, PromptDataConfig(apply_chat_template=False))


def test_missing_data_source_is_an_error(tmp_path, char_tokenizer):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    with pytest.raises(ValueError, match="no 'data_source' column"):
        RLPromptDataset(path, char_tokenizer, PromptDataConfig())


def test_bad_messages_are_an_error(char_tokenizer):
    rows = [{"data_source": "x", "prompt": [{"content": "no role"}]}]
    with pytest.raises(ValueError, match=r"prompt\[0\].*'role' and 'content'"):
        RLPromptDataset(None, char_tokenizer, PromptDataConfig(), rows=rows)


def _lengths_rows(lengths):
    return [{"data_source": "x", "prompt": "a" * n, "ground_truth": str(n)} for n in lengths]


def test_overlong_prompts_are_filtered_and_counted(char_tokenizer):
    cfg = PromptDataConfig(max_prompt_length=5, apply_chat_template=False)
    ds = RLPromptDataset(None, char_tokenizer, cfg, rows=_lengths_rows([3, 5, 6, 9, 1]))
    assert ds.stats == {"rows": 5, "filtered_overlong": 2, "truncated": 0, "kept": 3}
    assert [ds[i]["ground_truth"] for i in range(len(ds))] == ["3", "5", "1"]
    assert [ds[i]["index"] for i in range(len(ds))] == [0, 1, 4]  # position in the source


@pytest.mark.parametrize("side", ["left", "right"])
def test_overlong_prompts_are_truncated_and_counted(char_tokenizer, side):
    cfg = PromptDataConfig(max_prompt_length=4, apply_chat_template=False, filter_overlong_prompts=False,
                           truncation=side)
    rows = [{"data_source": "x", "prompt": "abcdefg"}, {"data_source": "x", "prompt": "xy"}]
    ds = RLPromptDataset(None, char_tokenizer, cfg, rows=rows)
    assert ds.stats["truncated"] == 1 and ds.stats["filtered_overlong"] == 0
    kept = char_tokenizer.decode(ds[0]["input_ids"])
    assert kept == ("defg" if side == "left" else "abcd")
    assert char_tokenizer.decode(ds[1]["input_ids"]) == "xy"


def test_overlong_prompt_error_names_the_row(char_tokenizer):
    cfg = PromptDataConfig(max_prompt_length=4, apply_chat_template=False, filter_overlong_prompts=False)
    with pytest.raises(ValueError, match=r"^data\.prompt\.max_prompt_length: row 1: prompt has 6 tokens > 4; .*"
                                         r"data\.prompt\.filter_overlong_prompts=true"):
        RLPromptDataset(None, char_tokenizer, cfg, rows=_lengths_rows([2, 6]))


def test_all_filtered_is_an_error(char_tokenizer):
    # The full dotted key (issue 26: the key was named without its section).
    with pytest.raises(ValueError, match=r"^data\.prompt\.max_prompt_length: no prompts left"):
        RLPromptDataset(None, char_tokenizer, PromptDataConfig(max_prompt_length=2, apply_chat_template=False),
                        rows=_lengths_rows([3, 4]))


def test_pad_to_max_length(char_tokenizer):
    cfg = PromptDataConfig(max_prompt_length=8, apply_chat_template=False, pad_to="max_length")
    ds = RLPromptDataset(None, char_tokenizer, cfg, rows=_lengths_rows([2, 3]))
    batch = ds.collate([ds[0], ds[1]])
    assert batch.batch["input_ids"].shape == (2, 8)
    assert batch.batch["attention_mask"].sum(1).tolist() == [2, 3]


def test_max_samples_limits_rows(tmp_path, char_tokenizer):
    path = write_records(_lengths_rows([1, 2, 3, 4]), tmp_path / "r.parquet")
    ds = RLPromptDataset(path, char_tokenizer, PromptDataConfig(apply_chat_template=False, max_samples=3))
    assert len(ds) == 3


def test_collate_position_ids_skip_padding():
    batch = collate_prompts([{"input_ids": [5, 6, 7], "raw_prompt": "", "data_source": "x", "ground_truth": None,
                              "extra_info": {}, "index": 0},
                             {"input_ids": [9], "raw_prompt": "", "data_source": "x", "ground_truth": None,
                              "extra_info": {}, "index": 1}], pad_id=0)
    assert batch.batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 9]]
    assert batch.batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch.batch["input_ids"].dtype == torch.long


def test_unsupported_file_type(tmp_path, char_tokenizer):
    path = tmp_path / "data.csv"
    path.write_text("prompt\n1+1=\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        RLPromptDataset(path, char_tokenizer, PromptDataConfig())


def test_trl_rows_in_both_prompt_forms(tmp_path, char_tokenizer):
    """TRL's prompt column, as TRL reads it (apply_chat_template: conversational): chat
    messages go through the chat template, plain text to the model as written; rows need no
    data_source, and every other column travels with the prompt (what a TRL reward reads)."""
    rows = [{"prompt": [{"role": "user", "content": "2+3?"}], "solution": "5"}, {"prompt": "7+8=", "solution": "15"}]
    path = write_records(rows, tmp_path / "trl.jsonl")
    config = PromptDataConfig(max_prompt_length=64, apply_chat_template="conversational", default_data_source="dataset")
    ds = RLPromptDataset(path, char_tokenizer, config)
    batch = ds.collate([ds[0], ds[1]])
    assert ds[0]["input_ids"] == _rendered(char_tokenizer, rows[0]["prompt"])
    assert ds[1]["input_ids"] == char_tokenizer("7+8=", add_special_tokens=False)["input_ids"]
    assert [c["solution"] for c in batch.non_tensor_batch["columns"]] == ["5", "15"]
    assert list(batch.non_tensor_batch["data_source"]) == ["dataset", "dataset"]
