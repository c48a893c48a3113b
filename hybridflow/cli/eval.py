"""`hybridflow eval PATH [key=value ...] [--data FILE ...] [--show N] [--output OUT.json]`:
score a saved policy on prompts and print accuracy, score, response length (and, for agent
tasks, tool-call rate and turns) overall and per data source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="score a checkpoint or model on prompt files (per data source)")
    parser.add_argument("path", help="run directory, checkpoint directory or Hugging Face model directory")
    parser.add_argument("--data", action="append", default=[], metavar="FILE",
                        help="prompt file (parquet/jsonl, verl columns); repeat for several (default: the run's "
                             "held-out prompts)")
    parser.add_argument("--output", default=None, metavar="FILE.json",
                        help="write the report with every response (prompt, response, ground truth, score) as "
                             "JSON to this new file (never overwritten)")
    parser.add_argument("--show", type=int, default=0, metavar="N",
                        help="print the first N responses with their prompt, ground truth and score")
    parser.add_argument("--max-samples", type=int, default=None, help="score only the first N prompts")
    parser.add_argument("--use-run-reward", action="store_true",
                        help="score with the reward settings of the run's config.yaml as saved (a reward file, its "
                             "reward.manager confinement); without it a run's reward file is used only when named "
                             "on the command line (reward.custom_fn_path=FILE)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. "
                             "resources.world_size=1 rollout.response_length=256")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.output is not None and Path(args.output).exists():
        print(f"hybridflow eval: --output {args.output!r} exists; nothing is overwritten, pick a new file",
              file=sys.stderr)
        return 2
    for flag, value in (("--max-samples", args.max_samples), ("--show", args.show)):
        if value is not None and value < (1 if flag == "--max-samples" else 0):
            print(f"hybridflow eval: {flag} must be >= {1 if flag == '--max-samples' else 0}, got {value}",
                  file=sys.stderr)
            return 2
    from hybridflow.config import ConfigError
    from hybridflow.trainer.jobs.offline import evaluate_source, resolve_source, settings_lines, write_json_once

    try:
        source = resolve_source(args.path, args.overrides, use_run_reward=args.use_run_reward)
        print("\n".join(settings_lines(source)), flush=True)
        report = evaluate_source(source, args.data, args.max_samples)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"hybridflow eval: {err}", file=sys.stderr)
        return 2
    print_report(report)
    show_responses(report.responses[: args.show])
    if args.output is not None:
        try:
            path = write_json_once(args.output, report.to_json())
        except FileExistsError:
            print(f"hybridflow eval: --output {args.output!r} appeared while scoring; not overwritten",
                  file=sys.stderr)
            return 2
        print(f"report with {len(report.responses)} responses written to {path}")
    return 0


def print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    from hybridflow.config.dtypes import dtype_summary
    from hybridflow.config.loader import config_to_dict
    from hybridflow.trainer.observe.display import per_source

    src, metrics = report.source, report.metrics
    what = f"checkpoint {src.checkpoint} (step {src.step})" if src.checkpoint is not None else src.model_path
    how = "sampled" if src.cfg.trainer.validation.do_sample else "greedy"
    print(f"{what}: {how}, {', '.join(report.data)}")  # above the table: a long path would wrap as its title
    table = Table()
    for column in ("data source", "responses", "accuracy", "score"):
        table.add_column(column, justify="left" if column == "data source" else "right")
    rows = list(per_source(metrics).items()) + [("all", {name: metrics[f"val/{name}"]
                                                         for name in ("samples", "accuracy", "score")})]
    for name, values in rows:
        table.add_row(name, str(int(values["samples"])), f"{values['accuracy']:.1%}", f"{values['score']:.4f}")
    Console().print(table)
    print(f"dtype: {dtype_summary(config_to_dict(src.cfg))}")  # the precision it was scored in
    print("\n".join(response_lines(metrics, src.cfg.rollout.response_length)))


def response_lines(metrics: dict[str, float], limit: int) -> list[str]:
    """What the responses were like, under the table (docs/eval.md)."""
    lines = ["accuracy: share of responses scoring >= 1; score: mean score (docs/eval.md)",
             f"responses: {metrics['val/response_length']:.1f} tokens on average"]
    if "val/clip_ratio" in metrics:
        lines[-1] += f"; {metrics['val/clip_ratio']:.1%} cut at rollout.response_length={limit}"
        if metrics["val/clip_ratio"] > 0.5:
            lines[-1] += " (most did not finish: raise it before trusting the accuracy)"
    if "val/tool_call_rate" in metrics:
        lines.append(f"agent: tool-call rate {metrics['val/tool_call_rate']:.1%}, "
                     f"{metrics['val/num_tool_calls_mean']:.2f} tool calls and {metrics['val/num_turns_mean']:.2f} "
                     "turns per response")
    return lines


def show_responses(records: list[dict]) -> None:
    """Each record's prompt, response, ground truth and score, plainly (no markup: model text)."""
    for record in records:
        prompt = record["prompt"]
        if isinstance(prompt, list):  # chat messages: the last one is what the model answers
            prompt = prompt[-1]["content"] if prompt and isinstance(prompt[-1], dict) else prompt
        tools = (f", {record['num_tool_calls']} tool call(s) in {record['num_turns']} turn(s)"
                 if "num_tool_calls" in record else "")
        print(f"--- response {record['index']} ({record['data_source']}): score {record['score']:g}"
              f"{' (correct)' if record['correct'] else ''}, {record['length']} tokens{tools}")
        print(f"prompt:       {prompt!r}")
        print(f"response:     {record['response']!r}")
        print(f"ground truth: {record['ground_truth']!r}")
