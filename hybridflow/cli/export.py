"""`hybridflow export PATH [key=value ...] --out DIR`: write a checkpoint's policy as a
Hugging Face model directory (safetensors, config, tokenizer; LoRA merged).

PATH is a run directory (its newest checkpoint) or a checkpoint directory
(<run>/checkpoints/global_step_<N>). DIR must not exist or be empty. The actor is loaded
with the run's config (world size included; override with resources.world_size=N).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export", help="write a checkpoint's policy as a Hugging Face model directory")
    parser.add_argument("path", help="run directory or checkpoint directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="new (or empty) output directory")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. "
                             "resources.world_size=1")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from hybridflow.config import ConfigError
    from hybridflow.trainer.jobs.offline import export_source, refuse_existing_dir, resolve_source

    try:
        refuse_existing_dir(Path(args.out))  # before anything starts
        source = resolve_source(args.path, args.overrides, reward=False)  # export scores nothing
        out = export_source(source, args.out)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"hybridflow export: {err}", file=sys.stderr)
        return 2
    print(f"exported step {source.step} of {source.checkpoint} to {out}")
    return 0
