"""PNG plots of environment runs, over environment steps.

    plot_env_run("runs/CartPole-v1-ppo-20260101-120000")      # -> <run>/plots/*.png
    plot_return_curves({"seed 0": run0, "seed 1": run1}, "curve.png", threshold=475)

A run draws its own plots when `train` returns (with the "jsonl" logger): episode return
(per record and the rolling window mean), the algorithm's losses, and throughput. The
x-axis is environment steps (`env/steps` of each record), not iterations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hybridflow.trainer.run_dir import read_metrics

# (file stem, title, y label, metric keys drawn as one line each when logged)
ENV_PLOTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("episode_return", "Episode return", "return", ("episode/return_mean", "episode/return_mean_window")),
    ("episode_length", "Episode length", "steps", ("episode/length_mean",)),
    ("ppo_losses", "PPO losses", "loss", ("ppo/pg_loss", "ppo/vf_loss", "ppo/entropy", "ppo/approx_kl")),
    ("sac_losses", "SAC losses", "loss / value", ("sac/critic_loss", "sac/actor_loss", "sac/alpha")),
    ("throughput", "Throughput", "environment steps / s", ("env/steps_per_s",)),
    ("policy_lag", "Policy lag (async sampling)", "policy versions", ("policy/lag_mean", "policy/lag_max")),
)


def plot_env_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Plots of <run_dir>/metrics.jsonl into out_dir (default <run_dir>/plots); the files written."""
    run_dir = Path(run_dir)
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("phase") == "rl"]
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    written = []
    for stem, title, ylabel, keys in ENV_PLOTS:
        series = {key: _series(records, key) for key in keys}
        series = {key: points for key, points in series.items() if points}
        if series:
            written.append(_draw(series, out / f"{stem}.png", title, ylabel))
    return written


def plot_return_curves(curves: Mapping[str, Sequence[tuple[int, float]]], path: str | Path, title: str,
                       threshold: float | None = None) -> Path:
    """One line per labelled (env steps, return) curve, e.g. one per seed; a dashed threshold."""
    return _draw({label: list(points) for label, points in curves.items()}, Path(path), title,
                 "episode return (rolling mean)", threshold)


def _series(records: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(r["env/steps"], float(r[key])) for r in records if isinstance(r.get(key), (int, float))]


def _draw(series: Mapping[str, list[tuple[int, float]]], path: Path, title: str, ylabel: str,
          threshold: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    many = len(series) > 6  # e.g. systems x seeds: the legend goes beside the axes, not over the curves
    fig, ax = plt.subplots(figsize=(9 if many else 6, 4), dpi=100)
    try:
        for label, points in series.items():
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, label=label)
        if threshold is not None:
            ax.axhline(threshold, linestyle="--", color="grey", label=f"threshold {threshold:g}")
        ax.set(title=title, xlabel="environment steps", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if many:
            ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.01, 0.5))
        else:
            ax.legend()
        fig.savefig(path, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
