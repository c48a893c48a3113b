"""`hybridflow train` (RL) and `hybridflow sft` (supervised warm start) on the run config tree."""

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
             "trainer.* (e.g. a larger trainer.total_steps), resources.* and the reward workers only")
    train.set_defaults(handler=run_train)

    sft = sub.add_parser("sft", help="supervised fine-tuning on prompt/response pairs")
    add_config_arguments(sft)
    sft.set_defaults(handler=run_sft)


def run_train(args: argparse.Namespace) -> int:
    from hybridflow.cli.env_train import is_env_run, run_env_train

    if is_env_run(args):  # a config (or resumed run) that names an `env`: PPO / SAC on environments
        return run_env_train(args)
    if args.resume is not None:
        return resume_train(args)
    cfg = load(args)
    if cfg is None:
        return 2
    if args.print_config:
        print_config(cfg)
        return 0
    from hybridflow.trainer import RLTrainer

    with RLTrainer(cfg) as trainer:
        trainer.train()
    return 0


def resume_train(args: argparse.Namespace) -> int:
    """`hybridflow train --resume [PATH]`: train until trainer.total_steps from a checkpoint."""
    from hybridflow.config import ConfigError
    from hybridflow.trainer import RLTrainer
    from hybridflow.trainer.checkpointing import CheckpointNotFoundError
    from hybridflow.trainer.lifecycle import check_steps_left, resume_point

    resume, overrides = args.resume, list(args.overrides)
    if isinstance(resume, str) and "=" in resume and not Path(resume).exists():
        # `--resume key=value`: argparse gave the first override to the optional PATH.
        resume, overrides = True, [resume, *overrides]
    try:
        point = resume_point(resume, args.config, overrides)
        check_steps_left(point.step, point.cfg.trainer.total_steps)
    except (ConfigError, CheckpointNotFoundError) as err:
        print(f"hybridflow train --resume: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print_config(point.cfg)
        return 0
    with RLTrainer(resume=point) as trainer:
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
    from hybridflow.trainer.sft import run_sft_job

    run_sft_job(cfg)
    return 0
