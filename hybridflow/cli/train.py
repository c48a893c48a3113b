"""`hybridflow train` (RL) and `hybridflow sft` (supervised warm start) on the run config tree."""

from __future__ import annotations

import argparse
import sys

from hybridflow.cli.run_config import add_config_arguments, load, print_config


def add_parsers(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="RL training (GRPO / PPO / ...); no arguments runs the built-in demo")
    add_config_arguments(train)
    train.set_defaults(handler=run_train)

    sft = sub.add_parser("sft", help="supervised fine-tuning on prompt/response pairs")
    add_config_arguments(sft)
    sft.set_defaults(handler=run_sft)


def run_train(args: argparse.Namespace) -> int:
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
