"""Multi-turn SFT rows from chat messages with the model's own chat template (issue 26):
the model's turns (up to and including their end-of-turn token) are trained on, everything
else is context; SFTDataset takes a `messages` column and collates them in the multi-turn
RL layout (attention on every token, response_mask 0 on the context)."""

from __future__ import annotations

import copy

import pytest

from hybridflow.data import SFTDataset, conversation_row
from hybridflow.data.configs import SFTDataConfig

CONVERSATION = [
    {"role": "user", "content": "cat?"},
    {"role": "assistant", "content": "@lookup[cat]"},
    {"role": "user", "content": "chat"},
    {"role": "assistant", "content": "chat"},
]


def _trained(tokenizer, row) -> str:
    return "".join(tokenizer.decode([t]) for t, m in zip(row["response_ids"], row["response_loss_mask"]) if m)


def test_the_model_turns_are_trained_on_and_the_rest_is_context(char_tokenizer):
    row = conversation_row(char_tokenizer, CONVERSATION)
    whole = char_tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    prompt = char_tokenizer.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True)
    assert char_tokenizer.decode(row["prompt_ids"]) == prompt
    assert char_tokenizer.decode(row["prompt_ids"] + row["response_ids"]) == whole  # the template, token for token
    assert _trained(char_tokenizer, row) == "@lookup[cat]</s>chat</s>"
    assert len(row["response_loss_mask"]) == len(row["response_ids"])


def test_what_the_template_writes_after_the_end_of_turn_token_is_context(char_tokenizer):
    tokenizer = copy.deepcopy(char_tokenizer)
    # ChatML-like: a newline after each turn's end token, which the model never generates.
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                               "{% if m['role'] == 'assistant' %}{{ eos_token }}\n{% endif %}{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    row = conversation_row(tokenizer, CONVERSATION)
    assert _trained(tokenizer, row) == "@lookup[cat]</s>chat</s>"
    assert tokenizer.decode(row["response_ids"][-1:]) == "\n" and row["response_loss_mask"][-1] == 0


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": "x"}], "at least one assistant message"),
    ([{"role": "assistant", "content": "x"}], "starts with an assistant message"),
])
def test_conversations_that_cannot_train_are_refused(char_tokenizer, messages, match):
    with pytest.raises(ValueError, match=match):
        conversation_row(char_tokenizer, messages)


def test_sft_dataset_mixes_conversations_and_pairs_in_the_multi_turn_layout(char_tokenizer):
    rows = [{"messages": CONVERSATION}, {"prompt": "1+1=", "response": "2"}]
    ds = SFTDataset(None, char_tokenizer, SFTDataConfig(), rows=rows)
    batch = ds.collate([ds[0], ds[1]]).batch
    conv = conversation_row(char_tokenizer, CONVERSATION)
    n, width = len(conv["response_ids"]), batch["responses"].shape[1]
    assert batch["response_mask"][0].tolist() == conv["response_loss_mask"] + [0] * (width - n)
    prompt_width = batch["prompts"].shape[1]
    assert batch["attention_mask"][0, prompt_width:].tolist() == [1] * n + [0] * (width - n)  # context attended
    assert batch["loss_mask"][0, prompt_width:].tolist() == batch["response_mask"][0].tolist()
    assert batch["response_mask"][1].sum() == 2  # the pair: "2" and eos, all trained as before


def test_a_bad_conversation_row_is_named(char_tokenizer):
    with pytest.raises(ValueError, match=r"SFT row 1 \('messages'\): .*at least one assistant"):
        SFTDataset(None, char_tokenizer, SFTDataConfig(),
                   rows=[{"messages": CONVERSATION}, {"messages": [{"role": "user", "content": "x"}]}])
