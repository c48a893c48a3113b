"""A measured CPU peak for the memory model's test: one ActorEngine update in a fresh gloo
process, its peak resident set (ru_maxrss) above the resident set before the engine."""

from __future__ import annotations

import resource


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure_update_peak(rank: int, world: int, model_dir: str, sequences: int, prompt_len: int,
                        response_len: int, vocab: int) -> dict:
    import gc

    import torch

    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, TrainEngineConfig

    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines" / "train"))
    from train_harness import make_rl_batch

    batch = make_rl_batch(sequences, prompt_len=prompt_len, response_len=response_len, vocab=vocab, seed=0)
    # Full-length sequences: the model counts every position.
    for key in ("attention_mask", "response_mask"):
        batch[key] = torch.ones_like(batch[key])
    batch["position_ids"] = torch.arange(prompt_len + response_len).expand(sequences, -1).clone()
    gc.collect()
    before = _rss_bytes()
    mb = MicroBatchConfig(mini_batch_size=sequences, micro_batch_size_per_device=sequences,
                          forward_micro_batch_size_per_device=sequences)
    engine = ActorEngine(TrainEngineConfig(model_path=model_dir, dtype="fp32", micro_batch=mb), trainable=True)
    engine.update_policy(batch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"before": before, "peak": peak, "delta": peak - before}
