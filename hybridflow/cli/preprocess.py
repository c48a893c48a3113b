"""`hybridflow preprocess gsm8k|hh-rlhf`: public data sets -> our (verl-format) parquet files.

    hybridflow preprocess gsm8k --input gsm8k/train.jsonl --output data/gsm8k_train.parquet
    hybridflow preprocess gsm8k --input gsm8k/test.jsonl --output data/gsm8k_test.parquet --split test
    hybridflow preprocess hh-rlhf --input hh-rlhf-harmless/test.jsonl.gz --output data/hh_pairs.parquet
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("preprocess", help="convert GSM8K / hh-rlhf files into training parquet files")
    kinds = parser.add_subparsers(dest="dataset", required=True)

    gsm8k = kinds.add_parser("gsm8k", help="GSM8K jsonl ({question, answer}) -> verl RL prompts")
    _common_arguments(gsm8k)
    gsm8k.add_argument("--split", default=None,
                       help="split name stored in extra_info (default: the input's file stem, e.g. train)")
    gsm8k.set_defaults(handler=run_preprocess)

    hh = kinds.add_parser("hh-rlhf", help="hh-rlhf jsonl(.gz) ({chosen, rejected}) -> reward-model pairs")
    _common_arguments(hh)
    hh.set_defaults(handler=run_preprocess)


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="the downloaded file (.jsonl, .jsonl.gz or .parquet)")
    parser.add_argument("--output", required=True, help="file to write (.parquet, or .jsonl)")
    parser.add_argument("--limit", type=int, default=None, help="convert only the first N rows")
    parser.add_argument("--force", action="store_true", help="replace the output if it exists")


def _split_of(args: argparse.Namespace) -> str:
    if args.split is not None:
        return args.split
    name = Path(args.input).name
    return name.split(".", 1)[0]  # train.jsonl -> train, test.jsonl.gz -> test


def run_preprocess(args: argparse.Namespace) -> int:
    from hybridflow.data import preprocess_gsm8k, preprocess_hh_rlhf

    if args.limit is not None and args.limit < 1:
        print(f"hybridflow preprocess: --limit must be >= 1, got {args.limit}", file=sys.stderr)
        return 2
    try:
        if args.dataset == "gsm8k":
            report = preprocess_gsm8k(args.input, args.output, _split_of(args), args.limit, overwrite=args.force)
            unit = "prompts"
        else:
            report = preprocess_hh_rlhf(args.input, args.output, args.limit, overwrite=args.force)
            unit = "pairs"
    except (OSError, ValueError) as err:
        print(f"hybridflow preprocess {args.dataset}: error: {err}", file=sys.stderr)
        return 1
    print(f"{args.dataset}: read {report['rows_read']} rows, wrote {report['rows_written']} {unit}, "
          f"skipped {report['rows_skipped']} -> {report['out']}")
    return 0
