"""`hybridflow train` (RL: language-model runs and environment tasks, through `RLTrainer`) and
`hybridflow sft` (supervised warm start) on the run config tree.

    hybridflow train --config examples/grpo_arithmetic.yaml [key=value ...]
    hybridflow train --config examples/ppo_cartpole.yaml trainer.total_env_steps=20000
    hybridflow train --resume runs/CartPole-v1-ppo-20260101-120000 [trainer.total_env_steps=200000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hybridflow.cli.run_config import add_config_arguments, load, print_config


def add_parsers(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="RL training (GRPO / PPO / ...); no arguments runs the built-in demo")
    add_config_arguments(train)
    train.add_argument(
        "--resume", nargs="?", const=True, default=None, metavar="PATH",
        help="continue a run from a checkpoint, in its run directory: PATH is a run directory (its newest "
             "complete checkpoint) or a checkpoints/global_step_<N> directory; without PATH, the newest "
             "checkpoint among the runs of this config's name under trainer.output_dir. The config is the "
             "run's saved config.yaml (or --config FILE) plus the key=value overrides, which may change "
             "trainer.* (e.g. a larger trainer.total_steps), resources.* and the reward workers only (an environment "
             "run: trainer.* and distributed.ray_address, cpus_per_worker, learner_cpus)")
    train.set_defaults(handler=run_train)

    sft = sub.add_parser("sft", help="supervised fine-tuning on prompt/response pairs")
    add_config_arguments(sft)
    sft.set_defaults(handler=run_sft)


def run_train(args: argparse.Namespace) -> int:
    """`hybridflow train`: every task kind through `RLTrainer`. The config file is read once
    (PyYAML only: a config error is reported before torch is imported), its top-level keys
    checked, its kind decided once (config/tasks.py) and its config built, then the run."""
    from hybridflow.config import ConfigError, config_to_dict
    from hybridflow.config.loader import user_tree, with_overrides
    from hybridflow.config.tasks import read_task_config

    resume, overrides = args.resume, list(args.overrides)
    if isinstance(resume, str) and "=" in resume and not Path(resume).exists():
        # `--resume key=value`: argparse gave the first override to the optional PATH.
        resume, overrides = True, [resume, *overrides]
    try:
        if resume is True and args.config is None:  # the newest run of the overrides' name, with its saved config
            from hybridflow.trainer.run.lifecycle import checkpoint_of_runs

            resume = checkpoint_of_runs(read_task_config(user_tree(None, overrides))[1])
        if args.config is None and isinstance(resume, (str, Path)):
            from hybridflow.trainer.run.checkpointing import saved_run

            # The run's config.yaml, read once: the new config is its tree with the overrides,
            # and the trainer checks the difference against the same tree.
            resume = saved_run(resume)
            tree = with_overrides(resume.tree, overrides)
        else:
            tree = user_tree(args.config, overrides)
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
    cfg = load(args)
    if cfg is None:
        return 2
    if args.print_config:
        print_config(cfg)
        return 0
    if cfg.sft.steps < 1:
        print("hybridflow sft: set sft.steps to the number of fine-tuning steps (>= 1)", file=sys.stderr)
        return 2
    from hybridflow.trainer.jobs.sft import run_sft_job

    run_sft_job(cfg)
    return 0
