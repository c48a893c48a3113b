"""`hybridflow preprocess` on the real shared files (a few rows), what it writes loading in
the RL prompt and preference-pair data sets, verl's own parquet schema loading unchanged,
and the count of over-long prompts on the trainer's console."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.cli import main
from hybridflow.data import PairwiseDataConfig, PairwiseDataset, PromptDataConfig, RLPromptDataset, read_records

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
GSM8K_TEST = DATA / "gsm8k" / "test.jsonl"
HH_TEST = DATA / "hh-rlhf-harmless" / "test.jsonl.gz"

needs_data = pytest.mark.skipif(not GSM8K_TEST.is_file() or not HH_TEST.is_file(),
                                reason=f"shared data not found at {DATA}")


@needs_data
def test_gsm8k_command_writes_verl_prompts_and_refuses_to_overwrite(tmp_path, capsys, char_tokenizer):
    out = tmp_path / "gsm8k_test.parquet"
    assert main(["preprocess", "gsm8k", "--input", str(GSM8K_TEST), "--output", str(out), "--limit", "6"]) == 0
    assert f"read 6 rows, wrote 6 prompts, skipped 0 -> {out}" in capsys.readouterr().out
    rows = read_records(out)
    assert [r["extra_info"]["split"] for r in rows] == ["test"] * 6  # from the file name
    assert rows[0]["reward_model"]["ground_truth"] == "18"  # Janet's ducks
    ds = RLPromptDataset(out, char_tokenizer, PromptDataConfig(max_prompt_length=2048))
    assert len(ds) == 6 and ds[0]["data_source"] == "openai/gsm8k" and ds[0]["ground_truth"] == "18"

    before = out.read_bytes()
    argv = ["preprocess", "gsm8k", "--input", str(GSM8K_TEST), "--output", str(out), "--limit", "2"]
    assert main(argv) == 1
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == before
    assert main([*argv, "--force", "--split", "dev"]) == 0
    assert [r["extra_info"]["split"] for r in read_records(out)] == ["dev", "dev"]
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left behind


@needs_data
def test_hh_rlhf_command_writes_pairs_the_pair_data_set_reads(tmp_path, capsys, char_tokenizer):
    out = tmp_path / "hh.parquet"
    assert main(["preprocess", "hh-rlhf", "--input", str(HH_TEST), "--output", str(out), "--limit", "12"]) == 0
    printed = capsys.readouterr().out
    rows = read_records(out)
    assert f"read 12 rows, wrote {len(rows)} pairs, skipped {12 - len(rows)}" in printed and len(rows) >= 10
    ds = PairwiseDataset(out, char_tokenizer, PairwiseDataConfig(max_length=100_000))
    assert len(ds) == len(rows) and ds.stats["filtered_overlong"] == 0
    text = char_tokenizer.decode(ds[0]["chosen_ids"])
    assert text.startswith("<s><|user|>") and text.endswith(f"<|assistant|>{rows[0]['chosen']}</s>")
    # a length limit drops the long conversations and says how many
    short = PairwiseDataset(out, char_tokenizer, PairwiseDataConfig(max_length=300))
    assert short.stats["filtered_overlong"] == len(rows) - len(short) > 0


def test_bad_input_is_reported(tmp_path, capsys):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"prompt": "hi"}\n')
    assert main(["preprocess", "hh-rlhf", "--input", str(bad), "--output", str(tmp_path / "o.parquet")]) == 1
    assert "lacks 'chosen'/'rejected'" in capsys.readouterr().err
    assert main(["preprocess", "gsm8k", "--input", str(bad), "--output", str(tmp_path / "o.csv")]) == 1
    assert "unsupported file type" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


# verl's GSM8K parquet as its own preprocessing writes it (datasets / pandas -> pyarrow):
# struct fields in alphabetical order, int64 index, no pandas metadata needed.
VERL_SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
    ("extra_info", pa.struct([("answer", pa.string()), ("index", pa.int64()), ("question", pa.string()),
                              ("split", pa.string())])),
])


def _verl_rows(n: int, long_every: int) -> list[dict]:
    return [{
        "data_source": "openai/gsm8k",
        "prompt": [{"content": ("long " * 20 if i % long_every == 0 else "") + f"What is {i}+1?", "role": "user"}],
        "ability": "math",
        "reward_model": {"ground_truth": str(i + 1), "style": "rule"},
        "extra_info": {"answer": f"#### {i + 1}", "index": i, "question": f"What is {i}+1?", "split": "train"},
    } for i in range(n)]


def test_verl_written_parquet_loads_unchanged(tmp_path, char_tokenizer):
    rows = _verl_rows(5, long_every=100)
    path = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=VERL_SCHEMA), path)
    ds = RLPromptDataset(path, char_tokenizer, PromptDataConfig(max_prompt_length=256))
    assert len(ds) == 5
    for i, row in enumerate(rows):
        assert ds[i]["raw_prompt"] == row["prompt"]
        assert ds[i]["data_source"] == "openai/gsm8k" and ds[i]["ground_truth"] == str(i + 1)
        assert ds[i]["extra_info"] == row["extra_info"]
        text = char_tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        assert ds[i]["input_ids"] == char_tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("filter_overlong, expected", [(True, "2 filtered, 0 truncated"),
                                                       (False, "0 filtered, 2 truncated")])
def test_trainer_reports_overlong_prompts(tmp_path, capsys, char_tokenizer, filter_overlong, expected):
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer.run.setup import train_prompts

    path = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(_verl_rows(6, long_every=3), schema=VERL_SCHEMA), path)
    cfg = load_run_config(None, [f"data.train_files=[{path}]", "trainer.console=plain",
                                 "data.prompt.max_prompt_length=40", "sft.steps=0",
                                 f"data.prompt.filter_overlong_prompts={str(filter_overlong).lower()}",
                                 "data.prompt.truncation=left"])
    ds = train_prompts(cfg, char_tokenizer)
    out = capsys.readouterr().out
    kept = 4 if filter_overlong else 6
    assert f"train prompts: {kept} of 6 kept; longer than data.prompt.max_prompt_length=40 tokens: {expected}" in out
    assert len(ds) == kept
