"""Preference-pair data set: chat-templated prompt + reply + eos per side, left-padded pair
batches, the length limit (filter / truncate / error) with counts, and the held-out split."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.data import PairwiseDataConfig, PairwiseDataset, split_held_out, write_records

ROWS = [
    {"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "joke?"}],
     "chosen": "A pun.", "rejected": "No."},
    {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": "4", "rejected": "five"},
]


def _side(tok, prompt, reply):
    text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"] + tok(reply, add_special_tokens=False)["input_ids"] + [
        tok.eos_token_id]


def test_pairs_are_rendered_like_rl_sequences_and_left_padded(tmp_path, char_tokenizer):
    path = write_records(ROWS, tmp_path / "pairs.parquet")
    ds = PairwiseDataset(path, char_tokenizer, PairwiseDataConfig(max_length=128))
    assert len(ds) == 2 and ds.stats == {"rows": 2, "filtered_overlong": 0, "truncated": 0, "kept": 2}
    for i, row in enumerate(ROWS):
        assert ds[i]["chosen_ids"] == _side(char_tokenizer, row["prompt"], row["chosen"])
        assert ds[i]["rejected_ids"] == _side(char_tokenizer, row["prompt"], row["rejected"])
        assert ds[i]["index"] == i
    # the char template: <s><|user|>2+2?<|assistant|>4</s>
    assert char_tokenizer.decode(ds[1]["chosen_ids"]) == "<s><|user|>2+2?<|assistant|>4</s>"
    batch = ds.collate([ds[0], ds[1]]).batch
    width = max(len(ds[i][f"{s}_ids"]) for i in range(2) for s in ("chosen", "rejected"))
    for side in ("chosen", "rejected"):
        ids, mask, pos = (batch[f"{side}_{k}"] for k in ("input_ids", "attention_mask", "position_ids"))
        assert ids.shape == mask.shape == pos.shape == (2, width)
        for row in range(2):
            tokens = ds[row][f"{side}_ids"]
            pad = width - len(tokens)
            assert ids[row, pad:].tolist() == tokens and ids[row, :pad].eq(char_tokenizer.pad_token_id).all()
            assert mask[row].tolist() == [0] * pad + [1] * len(tokens)
            assert pos[row, pad:].tolist() == list(range(len(tokens)))


def test_string_and_numpy_prompts(char_tokenizer):
    rows = [{"prompt": "2+2?", "chosen": "4", "rejected": "5"},
            {"prompt": np.array([{"role": "user", "content": "2+2?"}], dtype=object), "chosen": "4", "rejected": "5"}]
    ds = PairwiseDataset(None, char_tokenizer, PairwiseDataConfig(max_length=64), rows=rows)
    assert ds[0]["chosen_ids"] == ds[1]["chosen_ids"]  # a string prompt is one user message


def _long_rows():
    # <s><|user|>abc<|assistant|> is 6 tokens: sides of 6 + reply + 1 (eos) tokens
    return [{"prompt": "abc", "chosen": "yes", "rejected": "no"},
            {"prompt": "abc", "chosen": "y" * 30, "rejected": "no"},
            {"prompt": "abc", "chosen": "ok", "rejected": "n" * 40}]


def test_overlong_pairs_are_filtered_and_counted(char_tokenizer):
    ds = PairwiseDataset(None, char_tokenizer, PairwiseDataConfig(max_length=30), rows=_long_rows())
    assert ds.stats == {"rows": 3, "filtered_overlong": 2, "truncated": 0, "kept": 1}
    assert [ds[i]["index"] for i in range(len(ds))] == [0]


def test_overlong_pairs_are_truncated_from_the_start(char_tokenizer):
    ds = PairwiseDataset(None, char_tokenizer, PairwiseDataConfig(max_length=30, overlong="truncate"),
                         rows=_long_rows())
    assert ds.stats["truncated"] == 2 and ds.stats["kept"] == 3
    full = _side(char_tokenizer, [{"role": "user", "content": "abc"}], "y" * 30)
    assert ds[1]["chosen_ids"] == full[-30:]  # the reply's end and eos stay, where the score is read
    assert len(ds[2]["rejected_ids"]) == 30 and ds[2]["rejected_ids"][-1] == char_tokenizer.eos_token_id
    assert ds[0]["chosen_ids"] == _side(char_tokenizer, [{"role": "user", "content": "abc"}], "yes")


def test_overlong_error_and_nothing_left(char_tokenizer):
    with pytest.raises(ValueError, match="pair row 1: a side has 37 tokens > max_length=30"):
        PairwiseDataset(None, char_tokenizer, PairwiseDataConfig(max_length=30, overlong="error"), rows=_long_rows())
    with pytest.raises(ValueError, match="no pairs left out of 3 rows"):
        PairwiseDataset(None, char_tokenizer, PairwiseDataConfig(max_length=5), rows=_long_rows())


def test_bad_rows_are_named(char_tokenizer):
    cfg = PairwiseDataConfig()
    with pytest.raises(ValueError, match="pair row 0 has no 'rejected' column"):
        PairwiseDataset(None, char_tokenizer, cfg, rows=[{"prompt": "a", "chosen": "b"}])
    with pytest.raises(ValueError, match="'chosen' must be a string reply"):
        PairwiseDataset(None, char_tokenizer, cfg, rows=[{"prompt": "a", "chosen": ["b"], "rejected": "c"}])
    with pytest.raises(ValueError, match="each chat message must be a dict"):
        PairwiseDataset(None, char_tokenizer, cfg, rows=[{"prompt": ["a"], "chosen": "b", "rejected": "c"}])
    with pytest.raises(ValueError, match="overlong: must be"):
        PairwiseDataConfig(overlong="drop")


def test_held_out_split_is_seeded_disjoint_and_complete(char_tokenizer):
    train, val = split_held_out(50, 0.2, seed=3)
    assert len(val) == 10 and len(train) == 40
    assert sorted(train + val) == list(range(50))
    assert (train, val) == split_held_out(50, 0.2, seed=3)
    assert val != split_held_out(50, 0.2, seed=4)[1]
    assert split_held_out(3, 0.01, seed=0)[1] and split_held_out(3, 0.99, seed=0)[0]  # one pair each side at least
    with pytest.raises(ValueError, match="in \\(0, 1\\)"):
        split_held_out(10, 0.0, seed=0)
    rows = [{"prompt": str(i), "chosen": "a", "rejected": "b"} for i in range(6)]
    ds = PairwiseDataset(None, char_tokenizer, PairwiseDataConfig(max_length=64), rows=rows)
    part = ds.select([4, 1])
    assert len(part) == 2 and [part[0]["index"], part[1]["index"]] == [4, 1]
    assert part[1]["chosen_ids"] == ds[1]["chosen_ids"]
