"""The cold-start learning trial (docs/learning.md, "Cold start"): the recipe on three tasks,
seeds and ablations, each run checked by the independent evaluator, one JSON per run.

    python benchmarks/rl/coldstart_trial.py --out-dir benchmarks/rl/results/coldstart          # the whole trial
    python benchmarks/rl/coldstart_trial.py --out-dir /tmp/rehearsal --quick                # a rehearsal (minutes)
    python benchmarks/rl/coldstart_trial.py --out-dir D --tasks arith --seeds 0 --variants full   # a part
    python benchmarks/rl/coldstart_trial.py --out-dir D --summary-only                     # the table again

What runs: per task, its data (examples/make_coldstart_data.py, data seed 0) and the starting
model's held-out accuracy by eval_plain (`base_<task>.json`, once); then `hybridflow train`
with examples/grpo_coldstart_smollm2.yaml for every seed (variant "full") and, on the first
seed, each ablation (VARIANTS: one feature off), then eval_plain (--answer exact) on the
run's final_model. Resumable per run: a run whose JSON exists is not run again (delete it
to redo it); a failed run's JSON records the failure and is redone next time. Each run's
JSON: task, seed, variant and its overrides, the features on/off, eval_plain's accuracy,
distinct answers and top share before (the base model) and after, hybridflow's own
evaluations, per-step signal and exploration, wall times, the load average sampled every
15 s during the run, and the machine. `summary.json` and `summary.md` (the table) are
rewritten from every run JSON present at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # run by path: the root, for benchmarks.*
from benchmarks.rl.learning_trial import run_logged, run_metrics  # noqa: E402
from benchmarks.common.plain_machine import load_average, machine  # noqa: E402

RECIPE = ROOT / "examples" / "grpo_coldstart_smollm2.yaml"
TASKS = ("numwords", "arith", "units")
# variant -> (overrides, features on). "full" is the recipe; each ablation turns one feature off.
VARIANTS: dict[str, tuple[tuple[str, ...], dict[str, bool]]] = {
    "full": ((), {"warm_start": True, "exploration": True, "skip_no_signal": True}),
    "no_warm_start": (("sft.steps=0",), {"warm_start": False, "exploration": True, "skip_no_signal": True}),
    "no_exploration": (("algorithm.exploration.max_extra_groups=0",),
                       {"warm_start": True, "exploration": False, "skip_no_signal": True}),
    "no_skip": (("actor.loss.skip_no_signal_updates=false",),
                {"warm_start": True, "exploration": True, "skip_no_signal": False}),
}
ABLATIONS = ("no_warm_start", "no_exploration", "no_skip")
# A rehearsal: every part runs, on 8 held-out prompts, 2 SFT and 2 RL steps.
QUICK = ("trainer.total_steps=2", "sft.steps=2", "data.max_val_samples=8", "algorithm.exploration.max_extra_groups=2")
QUICK_LIMIT = 8
RESPONSE_LENGTH = yaml.safe_load(RECIPE.read_text())["rollout"]["response_length"]  # eval_plain's token limit


class LoadSampler:
    """The 1-minute load average every `every` seconds while in a `with` block."""

    def __init__(self, every: float = 15.0) -> None:
        self.every, self.samples, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(load_average()[0])
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        s = self.samples
        return {"every_s": self.every, "samples": len(s), "min": min(s), "mean": round(statistics.fmean(s), 2),
                "max": max(s)} if s else {"samples": 0}


def task_files(data_dir: Path, task: str) -> dict[str, Path]:
    files = {part: data_dir / f"{task}_{part}.jsonl" for part in ("heldout", "demos", "train")}
    if not all(f.is_file() for f in files.values()):
        subprocess.run([sys.executable, str(ROOT / "examples" / "make_coldstart_data.py"), "--task", task, "--seed", "0",
                        "--out-dir", str(data_dir)], check=True, env=_env())
    return files


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def eval_plain(model: str, heldout: Path, out: Path, log: Path, dtype: str, limit: int | None,
               label: str) -> dict[str, Any]:
    """eval_plain --answer exact on `model`: exit code, wall, load and its overall summary."""
    cmd = [sys.executable, str(HERE / "eval_plain.py"), model, "--data", str(heldout), "--answer", "exact",
           "--max-new-tokens", str(RESPONSE_LENGTH), "--dtype", dtype, "--batch-size", "50", "--label", label,
           "--out", str(out)]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    code, wall, load0, load1 = run_logged(cmd, log, _env())
    result: dict[str, Any] = {"exit_code": code, "wall_s": wall, "load_before": load0, "load_after": load1,
                              "json": str(out)}
    if code == 0:
        summary = json.loads(out.read_text())["all"]
        result.update({k: summary[k] for k in ("accuracy", "correct", "samples", "distinct_answers", "top_answer",
                                               "top_share", "clip_share", "mean_length")})
        result["sample_responses"] = summary["sample_responses"]
    return result


def base_eval(args: argparse.Namespace, task: str, heldout: Path) -> dict[str, Any]:
    """The starting model on the task's held-out set (measured once per out-dir)."""
    path = args.out_dir / f"base_{task}.json"
    if path.is_file() and json.loads(path.read_text()).get("exit_code") == 0:
        return json.loads(path.read_text())
    plain = set_aside(args.out_dir / f"base_{task}_plain.json")
    result = eval_plain("smollm2-135m-instruct", heldout, plain, args.out_dir / f"base_{task}.log", args.dtype,
                        args.limit, f"base {task}")
    path.write_text(json.dumps({**result, "machine": machine()}, indent=1) + "\n")
    return result


def set_aside(path: Path) -> Path:
    """`path`, free: what an earlier attempt left there is renamed beside it, never deleted."""
    if path.exists():
        path.rename(path.with_name(f"{path.stem}.earlier-{int(time.time())}{path.suffix}"))
    return path


def resolved_dtype(run_dir: Path) -> str:
    """The rollout dtype the run resolved (what eval_plain compares like with like)."""
    return str(yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["dtype"])


def one_run(args: argparse.Namespace, task: str, seed: int, variant: str, files: dict[str, Path],
            base: dict[str, Any]) -> dict[str, Any]:
    """Train one variant on one seed, then eval_plain on its final model; the run's record."""
    name = f"{task}_s{seed}_{variant}"
    run_dir = args.out_dir / "runs" / name
    overrides, features = VARIANTS[variant]
    chosen = [f"data.train_files=[{files['train']}]", f"data.val_files=[{files['heldout']}]",
              f"sft.files=[{files['demos']}]", f"seed={seed}", f"rollout.seed={seed}", *overrides,
              *(QUICK if args.quick else ()), *args.overrides]
    cmd = [sys.executable, "-m", "hybridflow.cli", "train", "--config", str(RECIPE), "trainer.console=plain",
           f"trainer.run_dir={run_dir}", *chosen]
    set_aside(run_dir)  # a failed earlier attempt's run: kept beside
    with LoadSampler() as load:
        code, train_s, load0, load1 = run_logged(cmd, set_aside(args.out_dir / f"{name}.train.log"), _env())
    record: dict[str, Any] = {
        "name": name, "task": task, "seed": seed, "variant": variant, "features": features,
        "overrides": chosen, "config": str(RECIPE.relative_to(ROOT)), "quick": args.quick,
        "train": {"exit_code": code, "wall_s": train_s, "load_before": load0, "load_after": load1,
                  "load_during": load.summary()},
        "before": {k: base.get(k) for k in ("accuracy", "distinct_answers", "top_answer", "top_share", "json")},
    }
    if (run_dir / "metrics.jsonl").is_file():
        record["train"].update(run_metrics(run_dir))
        record["train"]["sft_evals"] = _sft_evals(run_dir)
    if code == 0:
        record["after"] = eval_plain(str(run_dir), files["heldout"], set_aside(args.out_dir / f"{name}_plain.json"),
                                     args.out_dir / f"{name}.plain.log", resolved_dtype(run_dir), args.limit,
                                     f"after {name}")
    record["machine"] = machine()
    return record


def _sft_evals(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{"step": r["step"], "val/accuracy": r.get("val/accuracy")} for r in rows if r["phase"] == "sft_eval"]


def plan(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(task, seed, variant) of every run: each seed's full recipe, the ablations on the first seed."""
    runs = []
    for task in args.tasks:
        runs += [(task, seed, "full") for seed in args.seeds if "full" in args.variants]
        runs += [(task, args.seeds[0], v) for v in args.variants if v != "full"]
    return runs


def summarise(out_dir: Path) -> list[dict[str, Any]]:
    """summary.json and summary.md from every run JSON in `out_dir`; the table printed."""
    rows = []
    for path in sorted(out_dir.glob("*_s*_*.json")):
        r = json.loads(path.read_text())
        if "variant" not in r:
            continue
        after, steps = r.get("after", {}), r["train"].get("steps", [])
        evals = r["train"].get("evals", [])
        rows.append({
            "task": r["task"], "seed": r["seed"], "variant": r["variant"], "quick": r.get("quick", False),
            "before": r["before"].get("accuracy"), "after": after.get("accuracy"),
            "gain_points": (None if after.get("accuracy") is None or r["before"].get("accuracy") is None
                            else round(100 * (after["accuracy"] - r["before"]["accuracy"]), 1)),
            "hybridflow_after": evals[-1].get("val/accuracy") if evals else None,
            "sft_evals": [e["val/accuracy"] for e in r["train"].get("sft_evals", [])],
            "distinct_before": r["before"].get("distinct_answers"), "distinct_after": after.get("distinct_answers"),
            "top_share_after": after.get("top_share"), "steps": len(steps),
            "extra_groups": sum(s.get("explore/extra_groups", 0) for s in steps),
            "skipped_steps": sum(s.get("actor/skipped_no_signal", 0) for s in steps),
            "silent_steps": sum(s.get("adv/silent_groups") == s.get("adv/groups") for s in steps),
            "train_wall_s": r["train"]["wall_s"], "load_during": r["train"].get("load_during", {}),
            "exit_code": r["train"]["exit_code"],
        })
    (out_dir / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = ["| task | seed | variant | before | after (eval_plain) | gain | hybridflow after | after SFT | distinct "
             "before -> after (top share) | steps (silent / skipped) | extra groups | train wall | load during |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    pct = lambda v: "-" if v is None else f"{100 * v:.1f} %"  # noqa: E731
    for x in rows:
        load = x["load_during"]
        table.append(
            f"| {x['task']} | {x['seed']} | {x['variant']}{' (quick)' if x['quick'] else ''} | {pct(x['before'])} | "
            f"{pct(x['after'])} | {'-' if x['gain_points'] is None else format(x['gain_points'], '+.1f')} | "
            f"{pct(x['hybridflow_after'])} | {pct(x['sft_evals'][-1]) if x['sft_evals'] else '-'} | "
            f"{x['distinct_before']} -> {x['distinct_after']} ({pct(x['top_share_after'])}) | "
            f"{x['steps']} ({x['silent_steps']} / {x['skipped_steps']:.0f}) | {x['extra_groups']:.0f} | "
            f"{x['train_wall_s']:.0f} s | {load.get('mean', '-')} (max {load.get('max', '-')}) |")
    (out_dir / "summary.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="run JSONs, logs, runs/, summary")
    parser.add_argument("--data-dir", type=Path, default=Path("data/coldstart"))
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["full", *ABLATIONS])
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="eval_plain's dtype for the starting model (runs use the dtype they resolved)")
    parser.add_argument("--quick", action="store_true", help="a rehearsal: 2 SFT + 2 RL steps, 8 held-out prompts, "
                                                            "the first seed, the full recipe only")
    parser.add_argument("--limit", type=int, default=None, help="eval_plain scores the first N held-out prompts "
                        "(set data.max_val_samples=N after -- to match hybridflow's own evaluations)")
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("overrides", nargs="*", help="more dotted config overrides for every run, after --")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.seeds, args.variants = args.seeds[:1], ["full"]
    if args.quick:
        args.limit = QUICK_LIMIT
    if not args.summary_only:
        for task, seed, variant in plan(args):
            out = args.out_dir / f"{task}_s{seed}_{variant}.json"
            if out.is_file() and json.loads(out.read_text()).get("after", {}).get("exit_code") == 0:
                print(f"{out.name}: done, kept")
                continue
            files = task_files(args.data_dir, task)
            base = base_eval(args, task, files["heldout"])
            start = time.strftime("%H:%M:%S")
            record = one_run(args, task, seed, variant, files, base)
            out.write_text(json.dumps(record, indent=1) + "\n")
            print(f"{out.name}: {start} -> {time.strftime('%H:%M:%S')}, train exit {record['train']['exit_code']}, "
                  f"accuracy {record['before'].get('accuracy')} -> {record.get('after', {}).get('accuracy')}")
    summarise(args.out_dir)


if __name__ == "__main__":
    main()
