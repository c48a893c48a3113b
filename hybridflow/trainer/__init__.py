"""The trainer: the RL loop on the controller, one short function per algorithm.

    from hybridflow import RLTrainer
    from hybridflow.config.schema import load_run_config

    with RLTrainer(load_run_config()) as trainer:   # the built-in demo: SFT warm start + GRPO
        result = trainer.train(steps=30)

A subpackage per purpose: `RLTrainer`, the one trainer of every task kind (entry.py); the two
task kinds, language models (lm/) and environments (env/); the algorithms as programs of named
phases (programs/), what every mode runs; the execution modes beside sync (modes/); a run's life:
directory, setup, checkpoints, recovery (run/); what a run reports (observe/); jobs besides RL
training: SFT, RM, eval / export, calibration (jobs/).
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# Lazy (hybridflow/lazy.py): the CLI reads light modules of this package (checkpointing,
# preflight) before a config is known to be valid, and RLTrainer imports torch and Ray.
__getattr__, __dir__ = lazy_exports(__name__, {"RLTrainer": "entry", "TrainResult": "lm.part"})

__all__ = ["RLTrainer", "TrainResult"]
