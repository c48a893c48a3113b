"""The trainer: the RL loop on the controller, one short function per algorithm.

    from hybridflow import RLTrainer
    from hybridflow.config.schema import load_run_config

    with RLTrainer(load_run_config()) as trainer:   # the built-in demo: SFT warm start + GRPO
        result = trainer.train(steps=30)

- entry.py: `RLTrainer`: the one trainer, for every task kind (language-model post-training and
  environment tasks).
- env/: Environment tasks (PPO, SAC and your registered environment algorithms on Gymnasium-style
  environments), what `RLTrainer` runs for a config that names an `env`.
- jobs/: Jobs besides RL training: supervised fine-tuning (and its warm-start data), reward-model
  training, eval / export of a saved policy, the calibration runs of `hybridflow plan`.
- lm/: The language-model task: `LanguageModelTask` (the RL loop that runs an algorithm's program
  each step) and held-out evaluation of the policy.
- modes/: The execution modes beside synchronous: one_step_off and async run the same program, its
  generation served by a rollout pool's stream (docs/async.md).
- observe/: What a run reports: per-step metrics, steps without learning signal, the console,
  loggers, plots, the live status file and `hybridflow monitor`.
- programs/: The algorithms as programs: one short function per algorithm over worker groups (what
  every mode runs), built from named phases.
- run/: A run's life: its directory, setup and pre-flight checks, where it starts (fresh or
  resumed), checkpoints, recovery after a worker failure, elastic restarts, SIGTERM.
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# Lazy (hybridflow/lazy.py): the CLI reads light modules of this package (checkpointing,
# preflight) before a config is known to be valid, and RLTrainer imports torch and Ray.
__getattr__, __dir__ = lazy_exports(__name__, {"RLTrainer": "entry", "TrainResult": "lm.task"})

__all__ = ["RLTrainer", "TrainResult"]
