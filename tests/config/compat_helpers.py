"""What the tests of verl's and TRL's configs share: verl's files (tests/config/data/verl), a
tiny local model, and small data sets in the columns verl's preprocessing scripts write.

    overrides = verl_overrides("grpo_gsm8k")            # the script's command line, one item each
    swapped = for_this_machine(overrides, model, data)  # the model path and device counts swapped
"""

from __future__ import annotations

import math
from pathlib import Path

from hybridflow.data import make_builtin_model_dir
from hybridflow.data.records import write_records

VERL = Path(__file__).parent / "data" / "verl"
EXAMPLES = ("grpo_gsm8k", "grpo_gsm8k_math", "ppo_gsm8k", "dapo_gsm8k", "reinforce_plus_plus_gsm8k_math",
            "rloo_gsm8k", "remax_gsm8k")
GSM8K_INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def verl_overrides(name: str) -> list[str]:
    """The command-line overrides of one of verl's example scripts, as the shell passes them."""
    return [line for line in (VERL / f"{name}.overrides").read_text().splitlines() if line]


def tiny_model(path: Path) -> Path:
    """A 2-layer, 32-wide Llama with the character tokenizer, positions for verl's lengths."""
    return make_builtin_model_dir(path, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)


def gsm8k_rows(count: int, split: str) -> list[dict]:
    """Word problems in the columns of verl's examples/data_preprocess/gsm8k.py."""
    rows = []
    for i in range(count):
        a, b = 3 + i % 7, 2 + i % 5
        question = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
        rows.append({"data_source": "openai/gsm8k",
                     "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                     "extra_info": {"split": split, "index": i, "answer": f"{a}+{b}={a + b}\n#### {a + b}",
                                    "question": question}})
    return rows


def math_rows(count: int, split: str) -> list[dict]:
    """Problems in the columns of verl's examples/data_preprocess/math_dataset.py."""
    rows = []
    for i in range(count):
        n = 2 + i % 6
        problem = f"What is $\\sqrt{{{n * n}}}$?"
        rows.append({"data_source": "DigitalLearningGmbH/MATH-lighteval",
                     "prompt": [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(n)},
                     "extra_info": {"split": split, "index": i}})
    return rows


def verl_data(root: Path, count: int = 32) -> dict[str, Path]:
    """gsm8k and math train / test parquet files under `root`, as verl's scripts name them."""
    files = {}
    for name, rows in (("gsm8k", gsm8k_rows), ("math", math_rows)):
        for split in ("train", "test"):
            files[f"{name}/{split}"] = write_records(rows(count, split), root / name / f"{split}.parquet")
    return files


def for_this_machine(overrides: list[str], model: Path, data: dict[str, Path]) -> list[str]:
    """`overrides` with what differs between verl's machine and this one swapped: the model
    paths, the data files (~/data/... -> the local copies) and the device counts (1 GPU per
    node -> 1 CPU rank, generation on 1 rank)."""
    out = []
    for item in overrides:
        key, _, value = item.partition("=")
        bare = key.lstrip("+")
        if bare in ("actor_rollout_ref.model.path", "critic.model.path"):
            value = str(model)
        elif bare in ("trainer.n_gpus_per_node", "actor_rollout_ref.rollout.tensor_model_parallel_size"):
            value = "1"
        elif bare in ("data.train_files", "data.val_files"):
            for name, path in data.items():
                value = value.replace(f"~/data/{name}.parquet", str(path))
        out.append(f"{key}={value}")
    return out


def one_small_step(overrides: list[str], run_dir: Path) -> list[str]:
    """The sizes that make one step fit this 2-core machine, as verl keys after the script's
    own: one step (total_training_steps) of the fewest prompts whose mini-batch (of rollout.n
    responses each) the script's micro-batches divide, responses up to 256 tokens (a random
    model rarely stops on its own), 4 held-out prompts, the run in `run_dir`."""
    given = dict(item.lstrip("+").split("=", 1) for item in overrides)
    n = int(given.get("actor_rollout_ref.rollout.n", 1))
    micros = [int(given.get(key, 1)) for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                                                 "critic.ppo_micro_batch_size_per_gpu")]
    prompts = math.lcm(*(m // math.gcd(m, n) for m in micros))
    return [f"data.train_batch_size={prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            "data.max_response_length=256", "data.val_max_samples=4", "trainer.total_training_steps=1",
            f"trainer.default_local_dir={run_dir}"]


# A reward file as verl users write them (data_source dispatch, modules beside it), with
# partial credit: what DAPO's dynamic sampling needs from a random model to keep a group.
PARTIAL_CREDIT = [f"custom_reward_function.path={Path(__file__).parent / 'data' / 'verl_reward' / 'reward.py'}"]
