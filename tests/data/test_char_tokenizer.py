"""The built-in tokenizer: offline save/load, exact round trip, chat template, model dir."""

from __future__ import annotations

import string

import pytest
import torch
from transformers import AutoTokenizer

from hybridflow.data import load_tokenizer, make_builtin_model_dir, save_char_tokenizer
from hybridflow.data.tokenizer import CHARACTERS


def test_save_load_round_trip(tmp_path, char_tokenizer):
    save_char_tokenizer(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok", local_files_only=True)
    text = "Natalia sold 48/2 = 24 clips.\n#### 72\t(ok)!"
    ids = loaded(text, add_special_tokens=False)["input_ids"]
    assert ids == char_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert loaded.decode(ids) == text
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert len(loaded) == len(char_tokenizer)


def test_every_printable_character_survives(char_tokenizer):
    text = "".join(CHARACTERS)
    assert set(string.digits + string.ascii_letters + " \n+-*=#") <= set(text)
    ids = char_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert char_tokenizer.unk_token_id not in ids
    assert char_tokenizer.decode(ids) == text


def test_unknown_characters_become_unk(char_tokenizer):
    ids = char_tokenizer("a\u00e9b", add_special_tokens=False)["input_ids"]
    assert ids[1] == char_tokenizer.unk_token_id
    assert char_tokenizer.decode(ids, skip_special_tokens=True) == "ab"


def test_chat_template_on_verl_messages(tmp_path):
    save_char_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)
    messages = [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": "1+2="},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "2+2="},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s><|system|>Add.<|user|>1+2=<|assistant|>3</s><|user|>2+2=<|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # role markers are single special tokens, so prompts stay short
    assert ids[:3] == [tok.bos_token_id, tok.convert_tokens_to_ids("<|system|>"), tok.convert_tokens_to_ids("A")]
    assert tok.decode(ids, skip_special_tokens=True) == "Add.1+2=32+2="
    no_gen = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=False)
    assert no_gen == "<s><|system|>Add.<|user|>1+2="


def test_chat_template_rejects_unknown_role(char_tokenizer):
    with pytest.raises(Exception, match="unknown role tool"):
        char_tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_load_tokenizer_errors_on_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_tokenizer(tmp_path / "nope")


def test_builtin_model_dir_loads_and_runs(tmp_path):
    from hybridflow.engines.models import load_model

    path = make_builtin_model_dir(tmp_path / "m", "qwen2", seed=3, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    tok = load_tokenizer(path)
    model = load_model(path)
    assert model.config.vocab_size == len(tok)
    assert model.config.model_type == "qwen2"
    assert model.config.eos_token_id == tok.eos_token_id
    text = tok.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()


def test_builtin_model_dir_rejects_vocab_size(tmp_path):
    with pytest.raises(ValueError, match="sets vocab_size from the tokenizer"):
        make_builtin_model_dir(tmp_path, vocab_size=10)
