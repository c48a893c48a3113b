"""The trainer: the RL loop on the controller, one short function per algorithm.

    from hybridflow import RLTrainer
    from hybridflow.config.schema import RunConfig

    with RLTrainer(RunConfig()) as trainer:     # the built-in default: SFT warm start + GRPO
        result = trainer.train(steps=30)

- algorithms.py: `grpo`, `ppo` — a step as a sequence of named phases (phases.py);
- rl_trainer.py: `RLTrainer` (loop, evaluation, checkpoints, metrics);
- sft.py: supervised fine-tuning / warm start on the same actor worker;
- setup.py: run directory, Ray, built-in model and data, worker configs and placement;
- metrics.py, display.py, run_dir.py: per-step metrics, console, metrics.jsonl.
"""

from hybridflow.trainer.rl_trainer import RLTrainer, TrainResult

__all__ = ["RLTrainer", "TrainResult"]
