"""The data layer: built-in arithmetic task and tokenizer, prompt/SFT/preference-pair data
sets, a resumable loader, and preprocessing of public data sets into verl's parquet format.

    from hybridflow.data import (ArithmeticConfig, make_builtin_model_dir, RLPromptDataset,
                                 PromptDataConfig, ResumableLoader, SFTDataset, SFTDataConfig,
                                 PairwiseDataset, PairwiseDataConfig)
"""

from hybridflow.data.arithmetic import (
    DATA_SOURCE as ARITHMETIC_DATA_SOURCE,
)
from hybridflow.data.arithmetic import (
    ArithmeticConfig,
    Problem,
    generate_problems,
    rl_records,
    sft_records,
    split_size,
    write_arithmetic_dataset,
)
from hybridflow.data.loader import ResumableLoader
from hybridflow.data.pairwise_dataset import PairwiseDataConfig, PairwiseDataset, collate_pairs, split_held_out
from hybridflow.data.preprocess import preprocess_gsm8k, preprocess_hh_rlhf
from hybridflow.data.records import PromptRecord, read_many, read_records, write_records
from hybridflow.data.rl_dataset import (
    PromptDataConfig,
    RLPromptDataset,
    collate_prompts,
    render_prompt,
)
from hybridflow.data.sft_dataset import SFTDataConfig, SFTDataset, collate_sft
from hybridflow.data.tokenizer import (
    build_char_tokenizer,
    load_tokenizer,
    make_builtin_model_dir,
    save_char_tokenizer,
)

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
