"""Helpers for the training-engine tests: gloo process groups, RL batches, a plain reference.

`run_ranks(fn, world_size, *args)` (from hybridflow.engines.local_ranks) runs
`fn(rank, world_size, *args)` in `world_size` gloo processes and returns the per-rank
results.
"""

from __future__ import annotations

from typing import Any

import torch
from hybridflow.engines.train.distributed import full_tensor

from hybridflow.engines.local_ranks import free_port, run_ranks, start_ranks  # noqa: F401 (re-exported)


def make_rl_batch(
    n: int,
    *,
    prompt_len: int = 6,
    response_len: int = 5,
    vocab: int = 256,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A batch in the ARCHITECTURE.md layout with random lengths, advantages and targets.

    Prompts are left-padded (1..prompt_len valid tokens), responses right-padded
    (1..response_len tokens). old/ref log-probs are filled with placeholders of the right
    shape; tests overwrite them with real model log-probs where it matters.
    """
    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(1, prompt_len + 1, (n,), generator=g)
    r_lens = torch.randint(1, response_len + 1, (n,), generator=g)
    prompt_mask = (torch.arange(prompt_len) >= (prompt_len - p_lens)[:, None]).long()
    response_mask = (torch.arange(response_len) < r_lens[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(3, vocab, (n, prompt_len + response_len), generator=g) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    responses = input_ids[:, prompt_len:]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": responses,
        "response_mask": response_mask,
        "advantages": torch.randn(n, response_len, generator=g),
        "old_log_probs": torch.zeros(n, response_len),
        "ref_log_probs": torch.zeros(n, response_len),
        "values": torch.randn(n, response_len, generator=g) * 0.1,
        "returns": torch.randn(n, response_len, generator=g),
    }


def reference_log_probs(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """Response log-probs [B, R] from a plain (unsharded) HF causal LM, full logits, no chunking."""
    r = batch["responses"].shape[1]
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    ).logits[:, -r - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def shard_rows(batch: dict[str, torch.Tensor], n_shards: int, index: int) -> dict[str, torch.Tensor]:
    """The `index`-th of `n_shards` contiguous row blocks (what dp rank `index` receives)."""
    return {k: v.chunk(n_shards)[index] for k, v in batch.items()}


def global_mini_batches(batch: dict[str, torch.Tensor], dp: int, per_rank: int) -> list[dict[str, torch.Tensor]]:
    """The mini-batches the engine forms over all dp ranks (no shuffle), as full tensors."""
    shards = [shard_rows(batch, dp, r) for r in range(dp)]
    n_local = next(iter(shards[0].values())).shape[0]
    minis = []
    for s in range(0, n_local, per_rank):
        minis.append({k: torch.cat([sh[k][s : s + per_rank] for sh in shards]) for k in batch})
    return minis


def reference_model(path: str, config: Any) -> torch.nn.Module:
    """The plain single-process model an engine with `config` starts from: same seed, and
    the same LoRA adapters (their A matrices drawn from that seed) when config.lora is on."""
    from hybridflow.engines.models import load_model
    from hybridflow.engines.train.lora import apply_lora

    torch.manual_seed(config.seed)
    model = load_model(path)
    return apply_lora(model, config.lora) if config.lora.enabled else model


def reference_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """Plain AdamW with the engine's grouping: no weight decay on 1-D parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
        foreach=False,
    )


def reference_actor_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    *,
    dp: int,
    per_rank: int,
    loss_config: Any,
    grad_clip: float,
) -> list[float]:
    """One actor update on a plain model over the full mini-batches; returns the losses."""
    from hybridflow.algorithms import agg_loss, entropy_from_logits, get_policy_loss, kl_loss

    losses = []
    policy = get_policy_loss(loss_config.policy.loss_mode)
    mode = loss_config.policy.loss_agg_mode
    for mini in global_mini_batches(batch, dp, per_rank):
        lp = reference_log_probs(model, mini)
        mask = mini["response_mask"]
        loss, _ = policy(mini["old_log_probs"], lp, mini["advantages"], mask, config=loss_config.policy)
        if loss_config.entropy_coeff > 0:
            r = mini["responses"].shape[1]
            logits = model(
                input_ids=mini["input_ids"], attention_mask=mini["attention_mask"],
                position_ids=mini["position_ids"], use_cache=False,
            ).logits[:, -r - 1 : -1]
            loss = loss - loss_config.entropy_coeff * agg_loss(entropy_from_logits(logits), mask, mode)
        if loss_config.use_kl_loss:
            kl, _ = kl_loss(lp, mini["ref_log_probs"], mask, kl_type=loss_config.kl_loss_type, loss_agg_mode=mode)
            loss = loss + loss_config.kl_loss_coef * kl
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(float(loss))
    return losses


def full_parameters(engine: Any) -> dict[str, torch.Tensor]:
    """Every parameter of a sharded engine as a full tensor, keyed by HF name (collective)."""
    out = {}
    for name, p in engine.named_sharded_parameters():
        out[name] = full_tensor(p).detach().clone()
    return out


def param_update_error(
    engine_params: dict[str, torch.Tensor], model: torch.nn.Module, initial: dict[str, torch.Tensor]
) -> tuple[float, float, str]:
    """(||theta_engine - theta_ref|| / ||theta_ref - theta_0||, largest abs diff, its parameter).

    The relative error of the whole update is the robust measure: Adam divides by
    sqrt(v) + eps, so an entry whose gradient is at float-noise level (~1e-7, e.g. under
    Qwen3's q/k norms) can move by a sizeable fraction of lr from rounding alone, while
    a wrongly sharded or reduced gradient makes the relative error O(1).
    """
    from hybridflow.engines.train.lora import hf_name

    ref = {hf_name(n): p for n, p in model.named_parameters()}
    assert set(ref) == set(engine_params), sorted(set(ref) ^ set(engine_params))
    err_sq, upd_sq, worst, worst_name = 0.0, 0.0, 0.0, ""
    for name, value in engine_params.items():
        r = ref[name].detach().float()
        d = value.float() - r
        err_sq += float(d.square().sum())
        upd_sq += float((r - initial[name].float()).square().sum())
        if float(d.abs().max()) > worst:
            worst, worst_name = float(d.abs().max()), name
    return (err_sq / max(upd_sq, 1e-30)) ** 0.5, worst, worst_name
