"""Configs, prompts and single-process references shared by the worker tests.

Everything runs in fp32 so that log-probs from the training engine, the rollout engine
and a plain Hugging Face forward agree to ~1e-6; the tests allow 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.engines.train import (
    ActorLossConfig,
    CriticLossConfig,
    LoraConfig,
    MicroBatchConfig,
    OptimConfig,
    TrainEngineConfig,
)
from hybridflow.protocol import DataProto
from hybridflow.workers import (
    ActorRolloutRefConfig,
    CriticWorkerConfig,
    RewardModelWorkerConfig,
    RolloutWorkerConfig,
)

LOGPROB_TOL = 1e-4
VOCAB = 256  # the tiny models' vocabulary (hybridflow.engines.models.make_tiny_config)


def engine_config(model_dir: Path, *, lr: float, mini_batch_size: int, lora_rank: int = 0) -> TrainEngineConfig:
    return TrainEngineConfig(
        model_path=str(model_dir), dtype="fp32",
        optim=OptimConfig(lr=lr, weight_decay=0.0, grad_clip=0.0),
        micro_batch=MicroBatchConfig(mini_batch_size=mini_batch_size, micro_batch_size_per_device=2,
                                     forward_micro_batch_size_per_device=4),
        lora=LoraConfig(rank=lora_rank, alpha=8.0),
    )


def actor_config(model_dir: Path, *, gen_tp: int, mini_batch_size: int, use_reference: bool, lr: float = 1e-2,
                 lora_rank: int = 0) -> ActorRolloutRefConfig:
    return ActorRolloutRefConfig(
        engine=engine_config(model_dir, lr=lr, mini_batch_size=mini_batch_size, lora_rank=lora_rank),
        loss=ActorLossConfig(use_kl_loss=use_reference, kl_loss_coef=0.01),
        rollout=RolloutWorkerConfig(tensor_model_parallel_size=gen_tp, dtype="fp32", response_length=6,
                                    ignore_eos=True, seed=3),
        use_reference=use_reference,
    )


def critic_config(model_dir: Path, *, mini_batch_size: int) -> CriticWorkerConfig:
    return CriticWorkerConfig(engine=engine_config(model_dir, lr=1e-2, mini_batch_size=mini_batch_size),
                              loss=CriticLossConfig(cliprange_value=None))


def reward_config(model_dir: Path) -> RewardModelWorkerConfig:
    return RewardModelWorkerConfig(engine=engine_config(model_dir, lr=1e-6, mini_batch_size=4))


def make_prompts(lengths: list[int], *, seed: int = 0, same: bool = False, **meta) -> DataProto:
    """Left-padded random prompts with the non-tensor fields a data set provides.

    same=True repeats one prompt on every row (for comparing random streams).
    """
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    first = torch.randint(3, VOCAB, (width,), generator=g)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = first[:n] if same else torch.randint(3, VOCAB, (n,), generator=g)
        mask[i, width - n:] = 1
    rows = range(len(lengths))
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask},
        non_tensors={"uid": [f"u{i}" for i in rows], "data_source": ["toy"] * len(lengths),
                     "ground_truth": [str(i) for i in rows],
                     "raw_prompt": [[{"role": "user", "content": f"q{i}"}] for i in rows]},
        meta_info=meta,
    )


def masked_max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask.bool()].abs().max())


def hf_log_probs(model_dir: Path, batch: DataProto) -> torch.Tensor:
    """Response log-probs [B, R] from a plain Hugging Face forward, one sequence at a time."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"].bool()
    r = batch.batch["responses"].shape[1]
    out = torch.zeros(ids.shape[0], r)
    with torch.no_grad():
        for i in range(ids.shape[0]):
            # Left padding before the prompt, right padding after the response: the valid
            # tokens are one contiguous run at positions 0..L-1.
            start = int(mask[i].nonzero()[0])
            seq = ids[i, start:].unsqueeze(0)
            logits = model(input_ids=seq).logits[0, -r - 1:-1]
            out[i] = logits.log_softmax(-1).gather(-1, ids[i, -r:].unsqueeze(-1)).squeeze(-1)
    return out


def hf_reward_scores(model_dir: Path, batch: DataProto) -> torch.Tensor:
    """Scores [B]: the score head at each sequence's last valid token, one sequence at a time."""
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"].bool()
    scores = torch.zeros(ids.shape[0])
    with torch.no_grad():
        for i in range(ids.shape[0]):
            hidden = model.model(input_ids=ids[i][mask[i]].unsqueeze(0)).last_hidden_state
            scores[i] = model.score(hidden)[0, -1, 0]
    return scores
