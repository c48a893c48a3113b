"""Learning curves of several trials in one PNG (docs/learning.md): left, the mean training
reward (`score/mean`) per GRPO step of each trial JSON written by
benchmarks/rl/learning_trial.py; right, its greedy held-out accuracy at each evaluation
(before training, every `trainer.test_freq` steps, after), with before -> after in the
legend. `--summary` also prints one row per trial (before/after by both evaluators, their
row-by-row agreement, distinct answers, the top answer's share, wall time per phase) and
writes them as JSON.

    python benchmarks/rl/learning_curves.py benchmarks/rl/results/learn25_seed*.json --window 5 --out curves.png \
        --summary summary.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402


def held_out(trial: dict) -> list[tuple[int, float]]:
    """(step, accuracy) of every held-out evaluation of the run, in step order."""
    train = trial["train"]
    points = {e["step"]: e["val/accuracy"] for e in train.get("evals", []) if "val/accuracy" in e}
    # Mid-run evaluations are logged in their step's row (learning_trial keeps their val/ keys).
    points.update({s["step"]: s["val/accuracy"] for s in train.get("steps", []) if "val/accuracy" in s})
    return sorted(points.items())


PHASES = (("generate", ("timing_s/gen",)), ("reward", ("timing_s/reward",)), ("update", ("timing_s/update_actor",)),
          ("reshard", ("timing_s/reshard_to_generation", "timing_s/reshard_to_training")))


def summary(trial: dict) -> dict:
    """One trial's before/after, anti-collapse figures and wall time per phase (seconds)."""
    train, points = trial["train"], held_out(trial)
    steps = train.get("steps", [])
    step_s = sum(s.get("timing_s/step", 0.0) for s in steps)
    eval_s = sum(s.get("timing_s/eval", 0.0) for s in steps) + sum(e.get("timing_s/eval", 0.0)
                                                                    for e in train.get("evals", []))
    # milliseconds: a tiny run's phases are under 0.1 s, and rounding them to 0.1 made them equal
    phases = {name: round(sum(s.get(k, 0.0) for s in steps for k in keys), 3) for name, keys in PHASES}
    plain = trial.get("eval_plain", {})
    return {
        "name": trial["name"], "steps": len(steps), "held_out": points,
        "hybridflow_eval_after": trial.get("hybridflow_eval", {}).get("metrics", {}).get("val/accuracy"),
        "eval_plain_after": plain.get("after", {}).get("accuracy"),
        "same_verdict_rows": plain.get("compare", {}).get("same_correct"),
        "distinct_answers": plain.get("after", {}).get("distinct_answers"),
        "top_share": plain.get("after", {}).get("top_share"),
        "wall_s": {"train_total": train["wall_s"], "rl_steps": round(step_s, 3), **phases,
                   "held_out_evals": round(eval_s, 3), "start_up_and_export": round(train["wall_s"] - step_s - eval_s, 3),
                   "hybridflow_eval_cli": trial.get("hybridflow_eval", {}).get("wall_s"),
                   "eval_plain": plain.get("wall_s")},
    }


def common_machine(trials: list[dict]) -> dict | str:
    """The machine every trial ran on (load averages left out), or a note where they differ."""
    machines = [t.get("machine") if isinstance(t.get("machine"), dict) else {} for t in trials]
    described = [{k: v for k, v in m.items() if not k.startswith("load_avg")} for m in machines]
    if described and described[0] and all(d == described[0] for d in described):
        return described[0]
    return "differs between trials: each trial's JSON records its own"


def print_table(rows: list[dict]) -> None:
    print("| trial | held-out (run) | hybridflow eval after | eval_plain after | same verdict | distinct / top share "
          "| train wall s | steps s (gen / update) | evals s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        w = r["wall_s"]
        curve = " -> ".join(f"{a:.1%}" for _, a in r["held_out"])
        print(f"| {r['name']} | {curve} | {r['hybridflow_eval_after']:.1%} | {r['eval_plain_after']:.1%} "
              f"| {r['same_verdict_rows']}/200 | {r['distinct_answers']} / {r['top_share']:.1%} | {w['train_total']:.0f} "
              f"| {w['rl_steps']:.0f} ({w['generate']:.0f} / {w['update']:.0f}) | {w['held_out_evals']:.0f} |")


def moving_mean(ys: list[float], window: int) -> list[float]:
    w = max(1, window)
    return [sum(ys[max(0, i - w + 1): i + 1]) / len(ys[max(0, i - w + 1): i + 1]) for i in range(len(ys))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trials", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--window", type=int, default=1, help="moving-average window of the reward (steps)")
    parser.add_argument("--summary", type=Path, default=None, help="also print the per-trial table and write it here")
    args = parser.parse_args()
    if args.summary is not None:
        trials = [json.loads(p.read_text()) for p in args.trials]
        rows = [summary(t) for t in trials]
        print_table(rows)
        key = {f"{r['name']} held-out after": r["held_out"][-1][1] for r in rows if r["held_out"]}
        if rows and rows[0]["held_out"]:
            key["before"] = rows[0]["held_out"][0][1]
        record = stamp({"rows": rows, "sources": [str(p) for p in args.trials], "machine": common_machine(trials),
                        "key_figures": key})
        args.summary.write_text(json.dumps(record, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, (reward_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for path in args.trials:
        trial = json.loads(path.read_text())
        steps = [s for s in trial["train"].get("steps", []) if "score/mean" in s]
        xs, ys = [s["step"] for s in steps], [s["score/mean"] for s in steps]
        line, = reward_ax.plot(xs, moving_mean(ys, args.window), marker="." if len(xs) < 40 else None,
                               label=trial["name"])
        points = held_out(trial)
        if points:
            label = f"{trial['name']}: {points[0][1]:.1%} -> {points[-1][1]:.1%}"
            acc_ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=line.get_color(), label=label)
    reward_ax.set_xlabel("GRPO step")
    reward_ax.set_ylabel("mean training reward" + (f" ({args.window}-step mean)" if args.window > 1 else ""))
    acc_ax.set_xlabel("GRPO step")
    acc_ax.set_ylabel("held-out exact accuracy (greedy)")
    acc_ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    for ax in (reward_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
