"""PNG plots of a run's metrics over RL steps: reward, KL, entropy, response length and
held-out accuracy, read from <run>/metrics.jsonl.

    hybridflow plot runs/arithmetic-grpo-20260101-120000      # -> <run>/plots/*.png
    paths = plot_run(run_dir)                                 # the same from Python

A training run draws them itself when it ends (with the "jsonl" logger). A plot whose
metrics the run never logged (e.g. KL without a reference policy) is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridflow.trainer.run_dir import read_metrics

# (file stem, title, y label, metric keys drawn as one line each when logged)
PLOTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("reward", "Reward", "score (mean over responses)", ("score/mean",)),
    ("kl", "KL divergence", "KL", ("actor/ppo_kl", "actor/ref_kl", "kl/penalty")),
    ("entropy", "Policy entropy", "entropy (nats / token)", ("actor/entropy",)),
    ("response_length", "Response length", "tokens", ("response_length/mean",)),
    ("val_accuracy", "Held-out accuracy", "accuracy", ("val/accuracy",)),
    # multi-turn rollouts (rollout.agent): drawn only when logged
    ("agent_tool_use", "Tool use", "share of episodes / calls per episode",
     ("agent/tool_call_rate", "agent/num_tool_calls_mean")),
    ("agent_turns", "Turns per episode", "model turns", ("agent/num_turns_mean",)),
)
# Phases on the RL step axis: per-step records, and the evaluations before and after.
RL_PHASES = ("rl", "eval")


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Plots of <run_dir>/metrics.jsonl into out_dir (default <run_dir>/plots); the files written."""
    run_dir = Path(run_dir)
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        raise FileNotFoundError(
            f"{str(metrics_file)!r} does not exist: give the directory of a run (the one holding config.yaml "
            "and metrics.jsonl), logged with the 'jsonl' logger (trainer.loggers)"
        )
    return plot_records(read_metrics(metrics_file), Path(out_dir) if out_dir is not None else run_dir / "plots")


def plot_records(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per plot of PLOTS that has data; the files written (sorted by PLOTS)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rl = [r for r in records if r.get("phase") in RL_PHASES]
    written = []
    for stem, title, ylabel, keys in PLOTS:
        series = {key: _series(rl, key) for key in keys}
        series = {key: points for key, points in series.items() if points}
        if not series:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        try:
            for key, points in series.items():
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=key)
            ax.set(title=title, xlabel="RL step", ylabel=ylabel)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
            ax.grid(alpha=0.3)
            ax.legend()
            path = out_dir / f"{stem}.png"
            fig.savefig(path)
        finally:
            plt.close(fig)
        written.append(path)
    return written


def _series(records: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) of every record with a finite value of `key` (null = non-finite)."""
    return [(r["step"], float(r[key])) for r in records if isinstance(r.get(key), (int, float))]
