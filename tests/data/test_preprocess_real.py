"""Preprocessing of the real GSM8K and hh-rlhf files in shared/data (a slice, for speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow.data import PromptDataConfig, RLPromptDataset, preprocess_gsm8k, preprocess_hh_rlhf, read_records
from hybridflow.data.preprocess import gsm8k_ground_truth, split_hh_pair
from hybridflow.rewards import default_compute_score

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
GSM8K_TRAIN = DATA / "gsm8k" / "train.jsonl"
HH_TEST = DATA / "hh-rlhf-harmless" / "test.jsonl.gz"

pytestmark = pytest.mark.skipif(not GSM8K_TRAIN.is_file(), reason=f"shared data not found at {DATA}")


def test_gsm8k_to_verl_parquet(tmp_path, char_tokenizer):
    report = preprocess_gsm8k(GSM8K_TRAIN, tmp_path / "train.parquet", split="train", limit=40)
    assert report["rows_written"] == 40
    rows = read_records(tmp_path / "train.parquet")
    # the first two GSM8K train problems: 48 + 48/2 = 72 clips, $12/h * 50 min = $10
    assert [r["reward_model"]["ground_truth"] for r in rows[:2]] == ["72", "10"]
    assert rows[0]["data_source"] == "openai/gsm8k"
    assert rows[0]["reward_model"]["style"] == "rule"
    assert rows[0]["prompt"][0]["role"] == "user"
    assert rows[0]["prompt"][0]["content"].startswith("Natalia sold clips")
    assert "####" in rows[0]["prompt"][0]["content"]  # the instruction says where the answer goes
    assert rows[5]["extra_info"]["index"] == 5 and rows[5]["extra_info"]["split"] == "train"
    # the reference solutions score 1.0 against the extracted ground truth
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        assert default_compute_score(row["data_source"], row["extra_info"]["answer"], truth) == 1.0
    # and the parquet loads unchanged as an RL prompt data set
    ds = RLPromptDataset(tmp_path / "train.parquet", char_tokenizer, PromptDataConfig(max_prompt_length=2048))
    assert len(ds) == 40 and ds[0]["ground_truth"] == "72"


def test_gsm8k_ground_truth_strips_separators():
    assert gsm8k_ground_truth("so 1,000 + 200\n#### 1,200") == "1200"
    with pytest.raises(ValueError, match="no '#### <number>' line"):
        gsm8k_ground_truth("the answer is 4")


def test_gsm8k_rejects_other_files(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(ValueError, match="lacks 'question'/'answer'"):
        preprocess_gsm8k(path, tmp_path / "o.parquet", split="train")


def test_hh_rlhf_to_pairs(tmp_path):
    report = preprocess_hh_rlhf(HH_TEST, tmp_path / "hh.parquet", limit=60)
    assert report["rows_written"] + report["rows_skipped"] == 60
    assert report["rows_written"] > 50
    source = read_records(HH_TEST, limit=60)
    for out in read_records(tmp_path / "hh.parquet"):
        original = source[out["extra_info"]["index"]]
        assert out["prompt"][-1]["role"] == "user"
        assert out["chosen"] != out["rejected"]
        # the shared prefix plus each final reply gives back the original conversation
        speaker = {"user": "Human", "assistant": "Assistant"}
        prefix = "".join(f"\n\n{speaker[m['role']]}: {m['content']}" for m in out["prompt"])
        assert original["chosen"].startswith(prefix[:200].rstrip())
        assert original["chosen"].rstrip().endswith(out["chosen"])
        assert original["rejected"].rstrip().endswith(out["rejected"])


def test_hh_pair_split_and_skips():
    chosen = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant: A pun."
    rejected = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant: No."
    prompt, good, bad = split_hh_pair(chosen, rejected)
    assert prompt == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                      {"role": "user", "content": "joke?"}]
    assert (good, bad) == ("A pun.", "No.")
    assert split_hh_pair(chosen, chosen) is None  # no preference signal
    assert split_hh_pair(chosen, "\n\nHuman: other\n\nAssistant: No.") is None  # different prefixes
