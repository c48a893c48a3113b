"""The trainer: the RL loop on the controller, one short function per algorithm.

    from hybridflow import RLTrainer
    from hybridflow.config.schema import load_run_config

    with RLTrainer(load_run_config()) as trainer:   # the built-in demo: SFT warm start + GRPO
        result = trainer.train(steps=30)
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# Lazy (hybridflow/lazy.py): the CLI reads light modules of this package (checkpointing,
# preflight) before a config is known to be valid, and RLTrainer imports torch and Ray.
__getattr__, __dir__ = lazy_exports(__name__, {"RLTrainer": "entry", "TrainResult": "lm.part"})

__all__ = ["RLTrainer", "TrainResult"]
