"""The data layer: built-in arithmetic task and tokenizer, prompt/SFT/preference-pair data
sets, a resumable loader, and preprocessing of public data sets into verl's parquet format.

    from hybridflow.data import (ArithmeticConfig, make_builtin_model_dir, RLPromptDataset,
                                 PromptDataConfig, ResumableLoader, SFTDataset, SFTDataConfig,
                                 PairwiseDataset, PairwiseDataConfig)
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# name -> the module that defines it; imported on first use (hybridflow/lazy.py), so
# importing a torch-free module of this package (config classes) stays torch-free.
_EXPORTS = {
    "ARITHMETIC_DATA_SOURCE": "arithmetic:DATA_SOURCE",
    "ArithmeticConfig": "arithmetic",
    "Problem": "arithmetic",
    "generate_problems": "arithmetic",
    "rl_records": "arithmetic",
    "sft_records": "arithmetic",
    "split_size": "arithmetic",
    "write_arithmetic_dataset": "arithmetic",
    "ResumableLoader": "loader",
    "PairwiseDataConfig": "configs",
    "PairwiseDataset": "pairwise_dataset",
    "collate_pairs": "pairwise_dataset",
    "split_held_out": "pairwise_dataset",
    "preprocess_gsm8k": "preprocess",
    "preprocess_hh_rlhf": "preprocess",
    "PromptRecord": "records",
    "read_many": "records",
    "read_records": "records",
    "write_records": "records",
    "PromptDataConfig": "configs",
    "RLPromptDataset": "rl_dataset",
    "collate_prompts": "rl_dataset",
    "render_prompt": "rl_dataset",
    "SFTDataConfig": "configs",
    "SFTDataset": "sft_dataset",
    "conversation_row": "conversation",
    "collate_sft": "sft_dataset",
    "build_char_tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "make_builtin_model_dir": "tokenizer",
    "save_char_tokenizer": "tokenizer",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ARITHMETIC_DATA_SOURCE",
    "ArithmeticConfig",
    "PairwiseDataConfig",
    "PairwiseDataset",
    "Problem",
    "PromptDataConfig",
    "PromptRecord",
    "RLPromptDataset",
    "ResumableLoader",
    "SFTDataConfig",
    "SFTDataset",
    "conversation_row",
    "build_char_tokenizer",
    "collate_pairs",
    "collate_prompts",
    "collate_sft",
    "generate_problems",
    "load_tokenizer",
    "make_builtin_model_dir",
    "preprocess_gsm8k",
    "preprocess_hh_rlhf",
    "read_many",
    "read_records",
    "render_prompt",
    "rl_records",
    "save_char_tokenizer",
    "sft_records",
    "split_held_out",
    "split_size",
    "write_arithmetic_dataset",
    "write_records",
]
