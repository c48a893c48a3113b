"""`hybridflow train` (RL: language-model runs and environment tasks, through `RLTrainer`) and
`hybridflow sft` (supervised warm start) on the run config tree.

    hybridflow train --config examples/grpo_arithmetic.yaml [key=value ...]
    hybridflow train --config examples/ppo_cartpole.yaml trainer.total_env_steps=20000
    hybridflow train --resume runs/CartPole-v1-ppo-20260101-120000 [trainer.total_env_steps=200000]
    hybridflow sft --resume runs/hybridflow-20260101-120000 [sft.steps=800]
"""

from __future__ import annotations

import argparse
import sys

from hybridflow.cli.run_config import add_config_arguments, add_resume_argument, load, print_config, resume_tree


def add_parsers(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="RL training (GRPO / PPO / ...); no arguments runs the built-in demo")
    add_config_arguments(train)
    add_resume_argument(train, "trainer.* (e.g. a larger trainer.total_steps), resources.* and the reward workers "
                        "only (an environment run: trainer.* and distributed.ray_address, cpus_per_worker, learner_cpus)")
    train.set_defaults(handler=run_train)

    sft = sub.add_parser("sft", help="supervised fine-tuning on prompt/response pairs")
    add_config_arguments(sft)
    add_resume_argument(sft, "what `hybridflow train --resume` may, sft.steps and sft.test_freq")
    sft.set_defaults(handler=run_sft)


def run_train(args: argparse.Namespace) -> int:
    """`hybridflow train`: every task kind through `RLTrainer`. The config file is read once
    (PyYAML only: a config error is reported before torch is imported), its top-level keys
    checked, its kind decided once (config/tasks.py) and its config built, then the run."""
    from hybridflow.config import ConfigError, config_to_dict
    from hybridflow.config.tasks import read_task_config

    try:
        resume, tree = resume_tree(args, lambda tree: read_task_config(tree)[1])
        kind, cfg = read_task_config(tree)
    except ConfigError as err:
        print(f"hybridflow train: config error: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config_to_dict(kind.resolve(cfg)), sort_keys=False), end="")
        return 0
    from hybridflow.trainer import RLTrainer

    with RLTrainer(cfg, resume=resume) as trainer:
        trainer.train()
    return 0


def run_sft(args: argparse.Namespace) -> int:
    loaded = load(args)
    if loaded is None:
        return 2
    resume, cfg = loaded
    if args.print_config:
        print_config(cfg)
        return 0
    if cfg.sft.steps < 1:
        print("hybridflow sft: set sft.steps to the number of fine-tuning steps (>= 1)", file=sys.stderr)
        return 2
    from hybridflow.trainer.jobs.sft import run_sft_job

    run_sft_job(cfg, resume)
    return 0
