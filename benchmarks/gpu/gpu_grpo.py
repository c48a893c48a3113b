"""One GRPO step of a Qwen2.5-0.5B-shaped model, ours vs TRL's GRPOTrainer, for gpu_check.py.

Both sides get the same model directory (random weights from the config, the built-in
character tokenizer), the same prompts, `n` samples per prompt, `max_new` new tokens at
temperature 1, no KL, one optimizer step on the whole batch, and a reward of the
responses. Ours runs the engines a GRPO step is made of, in one process, each phase timed:
`gen` (the native rollout engine), `reward`, `adv` (algorithms' grpo estimator),
`update` (ActorEngine.update_policy: forward, backward, AdamW; on-policy fused, so no
separate old-log-prob pass, as TRL at num_iterations=1), `sync` (the actor's weights into
the rollout engine). The reward is the share of even token ids (random weights write no
text worth judging; TRL's run scores its texts with vs_trl_runs.trl_reward: both cost
nothing next to the rest; TRL's rows say gsm8k: the last number of a text). TRL runs
vs_trl_runs.run_trl (its GRPOTrainer with per-phase timers) for two steps and the second is kept. Where TRL cannot be imported (not carried, or its
dependencies broken), the stand-in is transformers' own loop on the same work: `generate`
and one training step (forward, the same surrogate loss, backward, AdamW), with the
import error recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from hybridflow.algorithms import compute_advantage
from hybridflow.algorithms.settings import AdvantageConfig
from hybridflow.data.tokenizer import build_char_tokenizer
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.engines.rollout.batch_io import left_pad_ids
from hybridflow.engines.train import ActorEngine, MicroBatchConfig, OptimConfig, TrainEngineConfig
from hybridflow.engines.train.distributed import full_tensor
from hybridflow.protocol import DataProto

# Qwen2.5-0.5B's config.json (the same as bench_vs_trl.QWEN05_CONFIG): shape only, random weights
QWEN05 = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
              num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False)


def save_grpo_model(path: Path, tiny: bool, device: str) -> Path:
    """The Qwen2.5-0.5B-shaped model (or a tiny Qwen2) with the character tokenizer, bf16 on disk."""
    if (path / "config.json").exists():
        return path
    tokenizer = build_char_tokenizer(model_max_length=4096)
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
                 tie_word_embeddings=True) if tiny else QWEN05
    config = transformers.Qwen2Config(**sizes, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def prompt_texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "sum", "of", "the", "numbers", "and", "what", "is"]
    return [" ".join(rng.choice(words, size=int(rng.integers(6, 20)))) + "?" for _ in range(count)]


def prompt_ids(tokenizer, count: int, seed: int) -> list[list[int]]:
    """The prompts as TRL feeds them: one user message through the chat template."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
             for t in prompt_texts(count, seed)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def even_share(ids: list[int]) -> float:
    """The reward: the share of even token ids in a response (random weights: no text to judge)."""
    return sum(1 for t in ids if t % 2 == 0) / max(1, len(ids))


def _timed(phases: dict[str, float], name: str, sync: Callable[[], None], fn: Callable[[], Any]) -> Any:
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    phases[name] = round(time.perf_counter() - start, 4)
    return out


def ours_step(path: Path, args, sync: Callable[[], None]) -> dict[str, Any]:
    """Two GRPO steps on our engines (the first warms up: kernels, graphs); the second's phases."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    prompts, n, max_new = args.grpo_prompts, args.grpo_n, args.grpo_max_new
    fast = args.device == "cuda"
    rollout = NativeRolloutEngine.from_pretrained(path, RolloutConfig(
        dtype=torch.bfloat16, device=args.device, max_num_seqs=prompts * n, decode_loop="device",
        cuda_graphs=fast), tokenizer=tokenizer)
    mb = MicroBatchConfig(mini_batch_size=prompts * n, micro_batch_size_per_device=args.grpo_micro,
                          forward_micro_batch_size_per_device=args.grpo_micro)
    actor = ActorEngine(TrainEngineConfig(model_path=str(path), dtype="bf16", micro_batch=mb,
                                          optim=OptimConfig(lr=1e-6, grad_clip=1.0), fused_head=True))
    result: dict[str, Any] = {}
    for step in range(2):
        ids, mask = left_pad_ids(prompt_ids(tokenizer, prompts, seed=step), tokenizer.pad_token_id)
        batch = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask})
        phases: dict[str, float] = {}
        params = SamplingParams(temperature=1.0, max_new_tokens=max_new, n=n, seed=step)
        out = _timed(phases, "gen", sync, lambda: rollout.generate(batch, params))
        resp, resp_mask = out.batch["responses"], out.batch["response_mask"]

        def reward() -> torch.Tensor:
            scores = torch.zeros(resp.shape, dtype=torch.float32)
            last = resp_mask.sum(-1).clamp(min=1) - 1
            values = [even_share(r[: int(m.sum())].tolist()) for r, m in zip(resp, resp_mask)]
            scores[torch.arange(len(values)), last] = torch.tensor(values)
            return scores

        scores = _timed(phases, "reward", sync, reward)
        uid = np.repeat(np.arange(prompts), n)
        adv, _ = _timed(phases, "adv", sync, lambda: compute_advantage("grpo", scores, resp_mask,
                                                                       config=AdvantageConfig(), uid=uid))
        train_batch = {k: out.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses",
                                                 "response_mask")}
        train_batch["advantages"] = adv
        metrics = _timed(phases, "update", sync, lambda: actor.update_policy(train_batch, fused_old_log_probs=True))

        def weight_sync() -> None:
            rollout.load_weights((name, full_tensor(p).detach()) for name, p in actor.named_sharded_parameters())

        _timed(phases, "sync", sync, weight_sync)
        phases["step"] = round(sum(phases.values()), 4)
        result = {"phases_s": phases, "samples": prompts * n,
                  "prompt_tokens": int(mask.sum()) * n, "completion_tokens": int(resp_mask.sum()),
                  "reward_mean": round(float(scores.sum(-1).mean()), 4), "grad_norm": round(
                      float(metrics.get("actor/grad_norm", float("nan"))), 4),
                  "rollout_stats": vars(rollout.last_stats)}
    return result


def trl_step(path: Path, args, work: Path) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same work (two steps, the second kept)."""
    from vs_trl_runs import run_trl

    rows = [{"prompt": [{"role": "user", "content": t}], "reward_model": {"ground_truth": "0"},
             "data_source": "gsm8k"} for t in prompt_texts(args.grpo_prompts * 2, seed=0)]
    prompts_file = work / "grpo_prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"threads": torch.get_num_threads(), "prompts_file": str(prompts_file), "work_dir": str(work),
            "prompts_per_step": args.grpo_prompts, "n": args.grpo_n, "max_new_tokens": args.grpo_max_new,
            "temperature": 1.0, "lr": 1e-6, "dtype": "bf16", "steps": 2, "seed": 0, "model_dir": str(path),
            "device": args.device}
    out = run_trl(spec)
    last = out["records"][-1]
    return {"phases_s": {k: round(v, 4) for k, v in last["phases"].items()}, "step_s": round(last["own_step_s"], 4),
            "samples": last["samples"], "prompt_tokens": last["prompt_tokens"],
            "completion_tokens": last["completion_tokens"], "startup": out["startup"]}


def hf_stand_in_step(path: Path, args, sync: Callable[[], None]) -> dict[str, Any]:
    """transformers' generate + one training step (the same surrogate loss) on the same work."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False).to(args.device)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    prompts, n, max_new = args.grpo_prompts, args.grpo_n, args.grpo_max_new
    result: dict[str, Any] = {}
    autocast = torch.autocast(args.device, dtype=torch.bfloat16)
    for step in range(2):
        ids, mask = left_pad_ids(prompt_ids(tokenizer, prompts, seed=step), tokenizer.pad_token_id, args.device)
        phases: dict[str, float] = {}
        gen = transformers.GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                            max_new_tokens=max_new, num_return_sequences=n,
                                            pad_token_id=tokenizer.pad_token_id)

        def generate() -> torch.Tensor:
            with torch.no_grad(), autocast:  # not inference mode: the update trains on these ids
                return model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)

        seqs = _timed(phases, "gen", sync, generate)
        completion = seqs[:, ids.shape[1]:]
        comp_mask = (completion != tokenizer.pad_token_id).long()
        rewards = torch.tensor([even_share(c[m.bool()].tolist()) for c, m in zip(completion, comp_mask)],
                               device=args.device).view(prompts, n)
        adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(-1, 1)

        def train() -> None:
            full_mask = torch.cat([mask.repeat_interleave(n, 0), comp_mask], 1)
            with autocast:
                logits = model(input_ids=seqs, attention_mask=full_mask).logits[:, ids.shape[1] - 1 : -1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
            loss = -((torch.exp(lp - lp.detach()) * adv) * comp_mask).sum() / comp_mask.sum().clamp(min=1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            optim.zero_grad(set_to_none=True)

        _timed(phases, "update", sync, train)
        phases["step"] = round(sum(phases.values()), 4)
        result = {"phases_s": phases, "samples": prompts * n, "completion_tokens": int(comp_mask.sum())}
    return result
