"""The built-in character-level tokenizer and the built-in model directory.

The demo and the tests need a tokenizer that exists without a download. This module
builds one with the `tokenizers` library: one token per printable ASCII character
(digits, letters, space, punctuation, tab, newline) plus special tokens, wrapped in
`transformers.PreTrainedTokenizerFast` and saved with `save_pretrained`, so
`AutoTokenizer.from_pretrained(dir)` loads it offline like any Hugging Face tokenizer.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from hybridflow.errors import UserInputError

# The ids of pad/bos/eos must match `hybridflow.engines.models.make_tiny_config`
# (pad 0, bos 1, eos 2), so generation stops on the token the tokenizer calls eos.
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)

# Vertical tab, form feed and carriage return are dropped: they only add ambiguity.
CHARACTERS = tuple(sorted(set(string.printable) - set("\x0b\x0c\r")))

# Jinja chat template: bos, then each message as <|role|>content; an assistant turn ends
# with eos so a model trained on it learns to stop. Unknown roles are rejected because a
# silently mis-rendered conversation would train the model on the wrong text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' ~ message['role'] ~ '; use system, user or assistant') }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# Sizes of the default built-in model: about 1.0M parameters. Measured on this 2-core
# machine (shared, so slow) with the default arithmetic task (2 digits, "+", zero-padded):
# SFT 250 steps (batch 128, AdamW lr 1e-3) reached 50% held-out greedy accuracy, and GRPO
# from there (32 prompts x 8 samples, T=1, lr 1e-4, exact-match reward) 75% after 80 steps.
DEFAULT_MODEL_SIZES: dict[str, int] = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def char_vocab() -> dict[str, int]:
    """Token -> id: the special tokens first (pad=0, bos=1, eos=2), then the characters."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in CHARACTERS:
        vocab[char] = len(vocab)
    return vocab


def build_char_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """A character-level Hugging Face fast tokenizer with pad/bos/eos/unk and a chat template.

    Characters outside printable ASCII become `<unk>`.
    """
    backend = Tokenizer(models.WordLevel(char_vocab(), unk_token=UNK))
    # Split every character into its own piece; `[\s\S]` also matches newlines.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins the pieces with no separator (the default decoder would insert spaces).
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
        padding_side="left",
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    _check_special_ids(tokenizer)
    return tokenizer


def _check_special_ids(tokenizer: PreTrainedTokenizerBase) -> None:
    expected = {"pad": 0, "bos": 1, "eos": 2}
    got = {"pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    if got != expected:
        raise RuntimeError(f"built-in tokenizer special ids are {got}, expected {expected}")


def save_char_tokenizer(path: str | Path, model_max_length: int = 512) -> Path:
    """Build the character tokenizer and `save_pretrained` it into `path`."""
    path = Path(path)
    build_char_tokenizer(model_max_length).save_pretrained(path)
    return path


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local directory (never downloads), with a clear error;
    `trust_remote_code` (model.trust_remote_code): let transformers run the directory's code."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"tokenizer path {str(path)!r} is not a directory; give a local Hugging Face "
            "tokenizer directory (tokenizer.json or a model directory). Nothing is downloaded."
        )
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - a damaged tokenizer file fails with KeyError, TypeError, ...
        raise UserInputError(f"could not load a tokenizer from {str(path)!r}: {err}") from err


def make_builtin_model_dir(
    path: str | Path,
    family: str = "llama",
    seed: int = 0,
    **sizes: Any,
) -> Path:
    """Write the character tokenizer and a tiny random model of `family` into `path`.

    `sizes` override `DEFAULT_MODEL_SIZES` (hidden_size, num_hidden_layers, ...);
    vocab_size always equals the tokenizer's size so every token id has an embedding.
    """
    # Imported here because engines is a layer above data and loads transformers models.
    from hybridflow.engines.models import save_tiny_model

    if "vocab_size" in sizes:
        raise ValueError(
            "make_builtin_model_dir sets vocab_size from the tokenizer; remove vocab_size from the sizes"
        )
    path = Path(path)
    tokenizer = build_char_tokenizer(int(sizes.get("max_position_embeddings", 512)))
    merged = {**DEFAULT_MODEL_SIZES, **sizes}
    save_tiny_model(path, family, seed=seed, vocab_size=len(tokenizer), **merged)
    tokenizer.save_pretrained(path)
    return path
