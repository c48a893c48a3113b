"""Shared builders for the rollout tests: perturbed tiny HF models, prompt batches, tokenizer.

Randomly initialised HF models have all-ones norms and zero biases, so a bug that ignores a
norm weight or a bias would go unnoticed; `save_model` perturbs every parameter so each
one changes the output.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from hybridflow.engines.models import make_tiny_config
from hybridflow.protocol import DataProto


def save_model(path: Path, family: str = "llama", *, seed: int = 0, logit_scale: float = 1.0,
               config_overrides: dict | None = None, **sizes) -> Path:
    """Save a tiny `family` model whose every parameter is randomly perturbed (fp32)."""
    config = make_tiny_config(family, **sizes)
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
        # sharper logits make sampling tests informative and greedy choices robust
        model.lm_head.weight.mul_(logit_scale)
    model.save_pretrained(path, safe_serialization=True)
    return Path(path)


def load_hf(path: Path, dtype: torch.dtype = torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def left_padded(lengths: list[int], vocab: int, *, seed: int = 0, low: int = 3) -> DataProto:
    """A DataProto of random prompts with the given lengths, left-padded with 0."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(low, vocab, (n,), generator=gen)
        mask[i, width - n :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def full_forward_log_probs(hf_model, out: DataProto, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) of each response token from one HF forward over prompt+response."""
    with torch.no_grad():
        logits = hf_model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits.float()
    p = out.batch["prompts"].shape[1]
    # logits at position j predict token j+1: response token i is predicted at p-1+i
    pred = logits[:, p - 1 : -1] / temperature
    return pred.log_softmax(-1).gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)


def truncated_log_probs(hf, out, temp: float, top_k: int, top_p: float) -> torch.Tensor:
    """Log-prob under the top-k-then-top-p renormalised distribution, computed independently."""
    with torch.no_grad():
        logits = hf(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                    position_ids=out.batch["position_ids"]).logits.float()
    p = out.batch["prompts"].shape[1]
    probs = (logits[:, p - 1 : -1] / temp).softmax(-1)
    result = torch.zeros(out.batch["responses"].shape)
    for (i, j), tok in zip(torch.cartesian_prod(torch.arange(result.shape[0]), torch.arange(result.shape[1])),
                           out.batch["responses"].flatten()):
        row = probs[i, j]
        order = row.argsort(descending=True)
        order = order[:top_k] if top_k > 0 else order
        kept = row[order] / row[order].sum()
        n_keep = int((kept.cumsum(0) - kept < top_p).sum())
        support = order[:n_keep]
        renorm = row[support] / row[support].sum()
        hit = (support == tok).nonzero()
        result[i, j] = renorm[hit[0, 0]].log() if len(hit) else float("-inf")
    return result


def char_tokenizer(vocab: int):
    """A local tokenizer whose token i decodes to one distinct character (no downloads)."""
    from tokenizers import Tokenizer, decoders, models

    chars = [chr(0x4E00 + i) for i in range(vocab)]
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token=chars[0]))
    tok.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok), chars


def build_engine(backend: str, path: Path, config=None, *, hf_config=None, tokenizer=None):
    """Backend `backend` made by the registry's factory, holding the weights of `path`."""
    from hybridflow.engines.models import load_hf_config
    from hybridflow.engines.rollout import RolloutConfig, build_rollout_engine
    from hybridflow.engines.rollout.weights import iter_safetensors

    engine = build_rollout_engine(backend, hf_config if hf_config is not None else load_hf_config(path),
                                  config if config is not None else RolloutConfig(dtype=torch.float32),
                                  process_group=None, tokenizer=tokenizer, model_path=str(path))
    engine.load_weights(iter_safetensors(path))
    return engine
