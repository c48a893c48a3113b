"""`hybridflow rm [--config FILE] [key=value ...]`: train a reward model on preference pairs.

    hybridflow preprocess hh-rlhf --input hh-rlhf-harmless/test.jsonl.gz --output data/hh_pairs.parquet
    hybridflow rm --config examples/rm_hh_rlhf.yaml model.path=models/Qwen2.5-0.5B-Instruct
    hybridflow rm --resume runs/reward-model-20260101-120000 [rm.epochs=2]

Reads the config tree of hybridflow/config/rm_schema.py; prints held-out pairwise accuracy
before and after training and the exported model directory (for `reward_model.path`).
Config errors exit with status 2 before anything starts.
"""

from __future__ import annotations

import argparse
import sys

from hybridflow.cli.run_config import add_config_arguments, add_resume_argument, resume_tree


def add_parser(sub: argparse._SubParsersAction) -> None:
    rm = sub.add_parser("rm", help="train a reward model (Bradley-Terry) on chosen/rejected pairs")
    add_config_arguments(rm)
    add_resume_argument(rm, "name, trainer.*, resources.* and how long and how often (rm.total_steps, rm.epochs, "
                            "rm.eval_freq, rm.save_model)")
    rm.set_defaults(handler=run_rm)


def run_rm(args: argparse.Namespace) -> int:
    from hybridflow.config import ConfigError, config_to_dict
    from hybridflow.config.rm_schema import rm_config_from_tree, rm_runs_config

    try:
        resume, tree = resume_tree(args, rm_runs_config)
        cfg = rm_config_from_tree(tree)
    except ConfigError as err:
        print(f"hybridflow rm: config error: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
        return 0
    from hybridflow.trainer.jobs.rm import run_rm_job

    run_rm_job(cfg, resume)
    return 0
