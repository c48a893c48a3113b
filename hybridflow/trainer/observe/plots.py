"""PNG plots of a run's metrics, read from <run>/metrics.jsonl: a language-model run's
over RL steps (reward, KL, entropy, response length, held-out accuracy), an environment
run's over environment steps (episode return and length, the algorithm's losses,
throughput, policy lag).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hybridflow.trainer.run.run_dir import read_metrics

# (file stem, title, y label, metric keys drawn as one line each when logged)
PlotTable = tuple[tuple[str, str, str, tuple[str, ...]], ...]
PLOTS: PlotTable = (
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
# Environment runs: the x-axis is environment steps (`env/steps` of each record), not iterations.
ENV_PLOTS: PlotTable = (
    ("episode_return", "Episode return", "return", ("episode/return_mean", "episode/return_mean_window")),
    ("episode_length", "Episode length", "steps", ("episode/length_mean",)),
    ("ppo_losses", "PPO losses", "loss", ("ppo/pg_loss", "ppo/vf_loss", "ppo/entropy", "ppo/approx_kl")),
    ("sac_losses", "SAC losses", "loss / value", ("sac/critic_loss", "sac/actor_loss", "sac/alpha")),
    ("throughput", "Throughput", "environment steps / s", ("env/steps_per_s",)),
    ("policy_lag", "Policy lag (async sampling)", "policy versions", ("policy/lag_mean", "policy/lag_max")),
)
# Phases on the RL step axis: per-step records, and the evaluations before and after.
RL_PHASES = ("rl", "eval")


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Plots of <run_dir>/metrics.jsonl into out_dir (default <run_dir>/plots); the files
    written. An environment run's records (they count `env/steps`) get its plots (plot_env_run)."""
    run_dir = Path(run_dir)
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        raise FileNotFoundError(
            f"{str(metrics_file)!r} does not exist: give the directory of a run (the one holding config.yaml "
            "and metrics.jsonl), logged with the 'jsonl' logger (trainer.loggers)"
        )
    records = read_metrics(metrics_file)
    if any("env/steps" in record for record in records):
        return plot_env_run(run_dir, out_dir)
    return plot_records(records, Path(out_dir) if out_dir is not None else run_dir / "plots")


def plot_records(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per plot of PLOTS that has data; the files written (sorted by PLOTS)."""
    rl = [r for r in records if r.get("phase") in RL_PHASES]
    return _plot_table(PLOTS, rl, "step", out_dir, "RL step", tight=False)  # fixed 600 x 400 pixels


def plot_env_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """An environment run's plots (ENV_PLOTS) of <run_dir>/metrics.jsonl into out_dir
    (default <run_dir>/plots); the files written."""
    run_dir = Path(run_dir)
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("phase") == "rl"]
    return _plot_table(ENV_PLOTS, records, "env/steps", Path(out_dir) if out_dir is not None else run_dir / "plots",
                       "environment steps", tight=True)


def plot_return_curves(curves: Mapping[str, Sequence[tuple[int, float]]], path: str | Path, title: str,
                       threshold: float | None = None) -> Path:
    """One line per labelled (env steps, return) curve, e.g. one per seed; a dashed threshold."""
    return _draw({label: list(points) for label, points in curves.items()}, Path(path), title,
                 "environment steps", "episode return (rolling mean)", True, threshold)


def _plot_table(table: PlotTable, records: Sequence[dict[str, Any]], x_key: str, out_dir: Path, xlabel: str,
                tight: bool) -> list[Path]:
    written = []
    for stem, title, ylabel, keys in table:
        series = {key: points for key in keys if (points := _series(records, x_key, key))}
        if series:
            written.append(_draw(series, out_dir / f"{stem}.png", title, xlabel, ylabel, tight))
    return written


def _series(records: Sequence[dict[str, Any]], x_key: str, key: str) -> list[tuple[int, float]]:
    """(x, value) of every record with a finite value of `key` (null = non-finite)."""
    return [(r[x_key], float(r[key])) for r in records if isinstance(r.get(key), (int, float))]


def _draw(series: Mapping[str, list[tuple[int, float]]], path: Path, title: str, xlabel: str, ylabel: str,
          tight: bool, threshold: float | None = None) -> Path:
    """One PNG of `series` (label -> (x, y) points); `tight` crops the figure to what it draws."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    path.parent.mkdir(parents=True, exist_ok=True)
    many = len(series) > 6  # e.g. systems x seeds: the legend goes beside the axes, not over the curves
    fig, ax = plt.subplots(figsize=(9 if many else 6, 4), dpi=100)
    try:
        for label, points in series.items():
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=label)
        if threshold is not None:
            ax.axhline(threshold, linestyle="--", color="grey", label=f"threshold {threshold:g}")
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(alpha=0.3)
        if many:
            ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.01, 0.5))
        else:
            ax.legend()
        fig.savefig(path, bbox_inches="tight" if tight else None)
    finally:
        plt.close(fig)
    return path
