"""CPU seconds of one training update (forward, backward, clip, AdamW) under this process's
allocator: glibc malloc, or jemalloc through LD_PRELOAD (issue 17's allocator question).

Run each allocator in its own process and compare (CPU time, so other jobs on the shared
cores do not skew it; Ray's wheel ships a jemalloc):

    JE=.venv/lib/python3.11/site-packages/ray/core/libjemalloc.so
    .venv/bin/python benchmarks/engines/bench_allocator.py MODEL_DIR --steps 5 --batch 4
    LD_PRELOAD=$JE MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 \
        .venv/bin/python benchmarks/engines/bench_allocator.py MODEL_DIR --steps 5 --batch 4

The batch is `--batch` sequences of `--seq` tokens (random ids), log-probs of the last
`--response` tokens as in the RL update. Prints one JSON line: median and best CPU
seconds per step over steps 3..N, the process's user and system seconds, the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=146)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, trust_remote_code=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq))
    r = args.response
    cpu = []
    for _ in range(args.steps):
        start = time.process_time()
        logits = model(input_ids=ids, logits_to_keep=r + 1).logits[:, :-1]
        log_probs = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -r:, None]).squeeze(-1)
        (-log_probs.mean()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        cpu.append(time.process_time() - start)
    later = cpu[2:] or cpu
    times = os.times()
    print(json.dumps({
        "allocator": os.environ.get("LD_PRELOAD", "glibc malloc"), "malloc_conf": os.environ.get("MALLOC_CONF"),
        "cpu_s_per_step_median": statistics.median(later), "cpu_s_per_step_best": min(later),
        "user_s": times.user, "system_s": times.system, "load_avg": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
