"""SFT data set: response-only loss mask, RL-compatible layout, length limits."""

from __future__ import annotations

import pytest

from hybridflow.data import (
    ArithmeticConfig,
    PromptDataConfig,
    RLPromptDataset,
    SFTDataConfig,
    SFTDataset,
    rl_records,
    sft_records,
)


def test_loss_mask_covers_exactly_the_response_and_eos(char_tokenizer):
    rows = [{"prompt": [{"role": "user", "content": "12+5="}], "response": "17"},
            {"prompt": "3+4=", "response": "7"}]
    ds = SFTDataset(None, char_tokenizer, SFTDataConfig(), rows=rows)
    batch = ds.collate([ds[0], ds[1]]).batch
    ids, loss_mask, attn = batch["input_ids"], batch["loss_mask"], batch["attention_mask"]
    for row, response in enumerate(["17", "7"]):
        targets = ids[row][loss_mask[row].bool()].tolist()
        assert targets[-1] == char_tokenizer.eos_token_id
        assert char_tokenizer.decode(targets[:-1]) == response
        assert (loss_mask[row] <= attn[row]).all()
    # RL layout: input_ids = left-padded prompts + right-padded responses
    p = batch["prompts"].shape[1]
    assert ids[:, :p].equal(batch["prompts"]) and ids[:, p:].equal(batch["responses"])
    assert loss_mask[:, p:].equal(batch["response_mask"]) and loss_mask[:, :p].sum() == 0
    # positions count real tokens only, continuing from the prompt into the response
    lengths = attn.sum(1)
    for row in range(2):
        real = batch["position_ids"][row][attn[row].bool()].tolist()
        assert real == list(range(int(lengths[row])))


def test_prompt_tokens_match_the_rl_prompt_tokens(char_tokenizer):
    cfg = ArithmeticConfig(seed=3)
    sft = SFTDataset(None, char_tokenizer, SFTDataConfig(), rows=sft_records(cfg, 20))
    rl = RLPromptDataset(None, char_tokenizer, PromptDataConfig(), rows=rl_records(cfg, "train", 20))
    assert [sft[i]["prompt_ids"] for i in range(20)] == [rl[i]["input_ids"] for i in range(20)]


def test_overlong_pairs_filtered_truncated_or_rejected(char_tokenizer):
    rows = [{"prompt": "ab", "response": "c"}, {"prompt": "ab", "response": "cdefgh"}]
    kwargs = {"apply_chat_template": False, "max_length": 5}
    filtered = SFTDataset(None, char_tokenizer, SFTDataConfig(**kwargs), rows=rows)
    assert filtered.stats == {"rows": 2, "filtered_overlong": 1, "truncated": 0, "kept": 1}
    cut = SFTDataset(None, char_tokenizer, SFTDataConfig(overlong="truncate", **kwargs), rows=rows)
    assert cut.stats["truncated"] == 1
    assert char_tokenizer.decode(cut[1]["response_ids"]) == "cde"
    with pytest.raises(ValueError, match="SFT row 1: prompt 2 \\+ response 7 tokens > max_length=5"):
        SFTDataset(None, char_tokenizer, SFTDataConfig(overlong="error", **kwargs), rows=rows)


def test_missing_column_is_an_error(char_tokenizer):
    with pytest.raises(ValueError, match="no 'response' column"):
        SFTDataset(None, char_tokenizer, SFTDataConfig(), rows=[{"prompt": "a", "answer": "b"}])
