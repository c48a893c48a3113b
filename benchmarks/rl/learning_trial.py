"""One GRPO trial of the learning recipe (docs/learning.md), measured both ways.

Runs `hybridflow train` with a config and overrides (its held-out evaluation before and
after training is hybridflow's greedy `val/accuracy`), then `hybridflow eval RUN --output`
(the CLI on the run's final model: every response) and the independent evaluator
(benchmarks/rl/eval_plain.py --compare, row by row against that report) on the run's
final_model/, one model process at a time, and writes one JSON: the settings, wall time
per phase, the per-step reward and signal, the run's before/after accuracy, the CLI's and
eval_plain's after summaries (accuracy, distinct answers, top share, 5 responses), with
the load average around each part. `--eval-only MODEL` does the two evaluations alone on a
model directory (the starting model: the "before" of both tools); the overrides then give
`hybridflow eval` the recipe's settings.

    python benchmarks/rl/learning_trial.py --name lr1e-5 --config examples/grpo_words_smollm2.yaml \
        --heldout data/learn/words1_direct_heldout.jsonl --max-new-tokens 16 \
        --out benchmarks/rl/results/learn25_trial_lr1e-5.json -- actor.optim.lr=1e-5 trainer.total_steps=12
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.common.plain_machine import load_average, machine  # noqa: E402

STEP_KEYS = ("score/mean", "adv/silent_groups", "adv/groups", "adv/no_signal_steps", "response_length/mean",
             "response_length/clip_ratio", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac", "actor/ref_kl",
             "actor/skipped_no_signal", "explore/silent_before", "explore/silent_after", "explore/extra_groups",
             "explore/extra_response_tokens")


def run_logged(cmd: list[str], log: Path, env: dict[str, str]) -> tuple[int, float, list[float], list[float]]:
    """(exit code, wall seconds, load before, load after) of `cmd` with its output in `log`."""
    before, start = load_average(), time.perf_counter()
    with open(log, "w", encoding="utf-8") as handle:
        code = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, check=False).returncode
    return code, round(time.perf_counter() - start, 1), before, load_average()


def run_metrics(run_dir: Path) -> dict[str, Any]:
    """The evaluations and the per-step values of STEP_KEYS and timings from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [{k: v for k, v in r.items() if k == "step" or k.startswith(("val/", "timing_s/"))}
             for r in rows if r["phase"] == "eval"]
    # A mid-run evaluation (trainer.test_freq) is logged in its step's row: its val/ keys are kept.
    steps = [{k: v for k, v in r.items() if k == "step" or k in STEP_KEYS or k.startswith(("timing_s/", "val/"))}
             for r in rows if r["phase"] == "rl"]
    return {"evals": evals, "steps": steps}


def evaluate_both(args: argparse.Namespace, model: str, overrides: list[str], env: dict[str, str]) -> dict[str, Any]:
    """`hybridflow eval MODEL --output` then eval_plain on the same prompts, compared row by row."""
    report = args.out.with_name(args.out.stem + "_hfeval.json")
    plain_out = args.out.with_name(args.out.stem + "_plain.json")
    out: dict[str, Any] = {}
    eval_cmd = [sys.executable, "-m", "hybridflow.cli", "eval", model, "--data", args.heldout, "--output", str(report),
                *overrides]
    code, wall, load0, load1 = run_logged(eval_cmd, args.runs / f"{args.name}.hfeval.log", env)
    out["hybridflow_eval"] = {"exit_code": code, "wall_s": wall, "load_before": load0, "load_after": load1,
                              "json": str(report)}
    if code == 0:
        out["hybridflow_eval"]["metrics"] = json.loads(report.read_text()).get("metrics", {})
    plain_cmd = [sys.executable, str(HERE / "eval_plain.py"), model, "--data", args.heldout,
                 "--max-new-tokens", str(args.max_new_tokens), "--dtype", args.dtype, "--batch-size", "50",
                 "--label", f"{'after trial' if args.eval_only is None else 'model'} {args.name}", "--out", str(plain_out)]
    if code == 0:
        plain_cmd += ["--compare", str(report)]
    code, wall, load0, load1 = run_logged(plain_cmd, args.runs / f"{args.name}.plain.log", env)
    out["eval_plain"] = {"exit_code": code, "wall_s": wall, "load_before": load0, "load_after": load1,
                         "json": str(plain_out)}
    if code == 0:
        plain = json.loads(plain_out.read_text())
        out["eval_plain"]["after"] = dict(plain["all"])
        if "compare" in plain:
            out["eval_plain"]["compare"] = {k: v for k, v in plain["compare"].items() if k != "correct_differs"}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the trial's name (run directory runs/learn/<name>)")
    parser.add_argument("--config", required=True)
    parser.add_argument("--heldout", required=True, help="the held-out file (the config's data.val_files)")
    parser.add_argument("--max-new-tokens", type=int, required=True, help="the config's rollout.response_length")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16",
                        help="eval_plain's dtype: the run's rollout.dtype (auto is bf16 on CPUs with fast bf16)")
    parser.add_argument("--runs", type=Path, default=Path("runs/learn"))
    parser.add_argument("--note", default="", help="why this trial (stored in the JSON)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--eval-only", metavar="MODEL", default=None,
                        help="no training: both evaluations of this model directory (e.g. the starting model)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides after --")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"learning_trial: {args.out} exists; nothing is overwritten")
    run_dir = args.runs / args.name
    args.runs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}
    result: dict[str, Any] = {"name": args.name, "note": args.note, "config": args.config, "overrides": args.overrides}
    if args.eval_only is None:
        train_cmd = [sys.executable, "-m", "hybridflow.cli", "train", "--config", args.config, "trainer.console=plain",
                     f"trainer.run_dir={run_dir}", *args.overrides]
        code, train_s, load0, load1 = run_logged(train_cmd, args.runs / f"{args.name}.train.log", env)
        result["train"] = {"exit_code": code, "wall_s": train_s, "load_before": load0, "load_after": load1}
        if (run_dir / "metrics.jsonl").is_file():
            result["train"].update(run_metrics(run_dir))
        model, eval_overrides = str(run_dir), []  # the run's own settings
    else:
        code, train_s = 0, 0.0
        model, eval_overrides = args.eval_only, [o for o in args.overrides if not o.startswith("trainer.")]
    if code == 0:
        result.update(evaluate_both(args, model, eval_overrides, env))
    result["machine"] = machine()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "x", encoding="utf-8") as f:
        json.dump(stamp(result), f, indent=1)
        f.write("\n")
    evals = result.get("train", {}).get("evals", [])
    failed = [part for part in ("train", "hybridflow_eval", "eval_plain") if result.get(part, {}).get("exit_code", 0)]
    if failed:  # the JSON is kept (what ran is in it); the logs say why
        raise SystemExit(f"learning_trial: {', '.join(failed)} failed; see {args.runs}/{args.name}.*.log and {args.out}")
    print(json.dumps({"name": args.name, "train_s": train_s, "evals": [(e["step"], e.get("val/accuracy")) for e in evals],
                      "hybridflow_eval": result.get("hybridflow_eval", {}).get("metrics", {}).get("val/accuracy"),
                      "plain_after": result.get("eval_plain", {}).get("after", {}).get("accuracy")}))


if __name__ == "__main__":
    main()
