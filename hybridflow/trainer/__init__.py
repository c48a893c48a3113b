"""The trainer: the RL loop on the controller, one short function per algorithm.

    from hybridflow import RLTrainer
    from hybridflow.config.schema import load_run_config

    with RLTrainer(load_run_config()) as trainer:   # the built-in demo: SFT warm start + GRPO
        result = trainer.train(steps=30)

- algorithms.py: grpo/rloo/reinforce_plus_plus[_baseline]/drgrpo, remax, dapo, ppo, safe_rlhf,
  each a step as a sequence of named phases (phases.py);
- entry.py: `RLTrainer`, the one trainer of every task kind (config/tasks.py decides which);
- rl_trainer.py: `LanguageModelTask` (loop, evaluation, checkpoints, metrics);
- env/: environment tasks (`EnvironmentTask`, the PPO/SAC programs, worker groups, records);
- checkpointing.py: step checkpoints (atomic, keep last K), reopening a run to resume;
- lifecycle.py: where a run starts: the policy's starting model, the resume point;
- sft.py: supervised fine-tuning / warm start on the same actor worker;
- rm.py: Bradley-Terry reward-model training (`hybridflow rm`);
- offline.py: `hybridflow eval` / `export` on a run, checkpoint or model directory;
- setup.py: run directory, Ray, built-in model and data, worker configs and placement;
- evaluate.py: greedy (by default) held-out evaluation, overall and per data source;
- metrics.py, display.py, run_dir.py, loggers.py, plots.py: per-step metrics, console,
  metrics.jsonl / TensorBoard / W&B, PNG plots (of language-model and environment runs).
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# Lazy (hybridflow/lazy.py): the CLI reads light modules of this package (checkpointing,
# preflight) before a config is known to be valid, and RLTrainer imports torch and Ray.
__getattr__, __dir__ = lazy_exports(__name__, {"RLTrainer": "entry", "TrainResult": "rl_trainer"})

__all__ = ["RLTrainer", "TrainResult"]
