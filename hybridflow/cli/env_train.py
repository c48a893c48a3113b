"""`hybridflow train` for environment tasks: a --config naming an `env` (or --resume of such a run).

    hybridflow train --config examples/ppo_cartpole.yaml [key=value ...]
    hybridflow train --config examples/sac_pendulum.yaml trainer.total_env_steps=20000
    hybridflow train --resume runs/CartPole-v1-ppo-20260101-120000 [trainer.total_env_steps=200000]

`train.py` hands these over (`is_env_run`); the flags mean what they mean for language-model
runs. A resumed run trains on to trainer.total_env_steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def is_env_run(args: argparse.Namespace) -> bool:
    """Does the command name an environment task (its --config, or the run it resumes)?"""
    from hybridflow.errors import UserInputError  # ConfigError, CheckpointNotFoundError

    try:
        if args.config is not None:
            from hybridflow.config.env_schema import is_env_tree
            from hybridflow.config.loader import user_tree

            return is_env_tree(user_tree(args.config))
        resume = getattr(args, "resume", None)
        if isinstance(resume, str) and Path(resume).exists():
            from hybridflow.trainer.entry import describes_env_task

            return describes_env_task(None, resume)
    except UserInputError:
        return False  # the language-model path reports the problem in its own words
    return False


def run_env_train(args: argparse.Namespace) -> int:
    from hybridflow.config import ConfigError, config_to_dict

    overrides = list(args.overrides)
    resume = getattr(args, "resume", None)
    if isinstance(resume, str) and "=" in resume and not Path(resume).exists():
        resume, overrides = None, [resume, *overrides]  # `--resume key=value`: argparse took an override
    if resume is True:
        print("hybridflow train --resume: for environment runs give the run directory (--resume PATH)",
              file=sys.stderr)
        return 2
    try:
        from hybridflow.config.env_schema import load_env_config

        if args.config is not None:
            cfg = load_env_config(args.config, overrides)
        else:  # resuming: the run's saved config plus the overrides
            from hybridflow.trainer.checkpointing import find_checkpoint, run_config_path

            cfg = load_env_config(run_config_path(find_checkpoint(resume)), overrides)
        if args.print_config:
            import yaml

            print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
            return 0
        from hybridflow.trainer.env_trainer import EnvTrainer

        with EnvTrainer(cfg, resume=resume) as trainer:
            trainer.train()
    except ConfigError as err:
        print(f"hybridflow train: config error: {err}", file=sys.stderr)
        return 2
    return 0
