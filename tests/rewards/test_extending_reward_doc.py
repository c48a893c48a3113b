"""docs/extending.md, "Add a reward function": its code block, saved as a file, scores a
batch through the RewardManager exactly as the section says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hybridflow.data import build_char_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def doc_example() -> str:
    section = DOC.read_text().split("## Add a reward function", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the reward section of docs/extending.md has no python example"
    return blocks[0]


def _batch(tokenizer, texts: list[str], truths: list[str]) -> DataProto:
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    width = max(len(x) for x in ids)
    responses = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, x in enumerate(ids):
        responses[row, : len(x)] = torch.tensor(x)
        mask[row, : len(x)] = 1
    return DataProto.from_dict(tensors={"responses": responses, "response_mask": mask},
                               non_tensors={"data_source": ["mine"] * len(ids), "ground_truth": truths})


@pytest.mark.parametrize("workers", [0, 1])
def test_the_documented_reward_function_scores_a_batch(tmp_path, workers):
    path = tmp_path / "my_reward.py"
    path.write_text(doc_example())
    tokenizer = build_char_tokenizer()
    fn = load_reward_fn(path, "compute_score")
    with RewardManager(tokenizer, RewardConfig(num_workers=workers, timeout_s=5.0), fn) as manager:
        out = manager(_batch(tokenizer, ["1+2=3", "3", "4"], ["3", "3", "3"]))
    assert out.scores.tolist() == pytest.approx([1.1, 1.0, 0.0])
    assert out.extra_info["shown_work"] == [True, False, None]
    assert out.metrics["reward/errors"] == 0.0
