"""Reward curves of several learning trials in one PNG (docs/learning.md): the mean
training reward (`score/mean`) per GRPO step of each trial JSON written by
benchmarks/learning_trial.py, with each trial's held-out accuracy before -> after in
the legend.

    python benchmarks/learning_curves.py benchmarks/results/learn25_trial_*.json --out curves.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def label(trial: dict) -> str:
    evals = trial["train"].get("evals", [])
    accuracies = [f"{e['val/accuracy']:.3f}" for e in evals if "val/accuracy" in e]
    return f"{trial['name']} (held-out {' -> '.join(accuracies) or 'n/a'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trials", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--window", type=int, default=1, help="moving-average window (steps)")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path in args.trials:
        trial = json.loads(path.read_text())
        steps = trial["train"].get("steps", [])
        xs = [s["step"] for s in steps if "score/mean" in s]
        ys = [s["score/mean"] for s in steps if "score/mean" in s]
        w = max(1, args.window)
        smooth = [sum(ys[max(0, i - w + 1): i + 1]) / len(ys[max(0, i - w + 1): i + 1]) for i in range(len(ys))]
        ax.plot(xs, smooth, marker="." if len(xs) < 40 else None, label=label(trial))
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean training reward" + (f" ({args.window}-step mean)" if args.window > 1 else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
