"""PNG plots of a run's metrics, read from <run>/metrics.jsonl: a language-model run's
over RL steps (reward, KL, entropy, response length, held-out accuracy), an environment
run's over environment steps (episode return and length, the algorithm's losses,
throughput, policy lag), an SFT or reward-model job's over its steps (loss, gradient
norm, held-out accuracy). Each kind of step record (its phase) has its table (RUN_PLOTS).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
# SFT jobs (and an RL run's SFT warm start): phases "sft" and "sft_eval" (jobs/sft.py).
SFT_PLOTS: PlotTable = (
    ("sft_loss", "SFT loss", "response NLL (nats / token)", ("sft/loss",)),
    ("sft_grad_norm", "SFT gradient norm", "gradient norm", ("sft/grad_norm",)),
    ("sft_val_accuracy", "SFT held-out accuracy", "accuracy", ("val/accuracy",)),
)
# Reward-model jobs: phases "rm" and "rm_eval" (jobs/rm.py).
RM_PLOTS: PlotTable = (
    ("rm_loss", "Reward-model loss", "Bradley-Terry loss", ("rm/loss",)),
    ("rm_accuracy", "Pairwise accuracy", "share of pairs ranked right", ("rm/accuracy", "val/accuracy")),
    ("rm_margin", "Reward margin", "r(chosen) - r(rejected)", ("rm/margin", "val/margin")),
)
# Phases on the RL step axis: per-step records, and the evaluations before and after.
RL_PHASES = ("rl", "eval")


@dataclass(frozen=True)
class RunPlots:
    """The plots of one kind of step record: `phases` (the step records' first, then its
    evaluations'), drawn over `x_key` of each record; a run gets them when a record of
    phases[0] carries `x_key`."""

    phases: tuple[str, ...]
    x_key: str
    xlabel: str
    table: PlotTable
    tight: bool  # crop the figure to what it draws (else a fixed 600 x 400 pixels)

    def records(self, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r.get("phase") in self.phases]

    def applies(self, records: Sequence[dict[str, Any]]) -> bool:
        return any(r.get("phase") == self.phases[0] and self.x_key in r for r in records)


ENV_RUN_PLOTS = RunPlots(("rl",), "env/steps", "environment steps", ENV_PLOTS, tight=True)
LM_RUN_PLOTS = RunPlots(RL_PHASES, "step", "RL step", PLOTS, tight=False)
# Environment records also carry "step" (iterations): theirs is the first table that applies.
RUN_PLOTS: tuple[RunPlots, ...] = (
    ENV_RUN_PLOTS,
    RunPlots(("sft", "sft_eval"), "step", "SFT step", SFT_PLOTS, tight=True),
    RunPlots(("rm", "rm_eval"), "step", "reward-model step", RM_PLOTS, tight=True),
)


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
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    if ENV_RUN_PLOTS.applies(records):
        return _plot_run(ENV_RUN_PLOTS, records, out)
    written = [path for plots in RUN_PLOTS[1:] if plots.applies(records) for path in _plot_run(plots, records, out)]
    return written + plot_records(records, out)


def plot_records(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per plot of PLOTS that has data; the files written (sorted by PLOTS)."""
    return _plot_run(LM_RUN_PLOTS, records, out_dir)


def plot_env_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """An environment run's plots (ENV_PLOTS) of <run_dir>/metrics.jsonl into out_dir
    (default <run_dir>/plots); the files written."""
    run_dir = Path(run_dir)
    return _plot_run(ENV_RUN_PLOTS, read_metrics(run_dir / "metrics.jsonl"),
                     Path(out_dir) if out_dir is not None else run_dir / "plots")


def _plot_run(plots: RunPlots, records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    return _plot_table(plots.table, plots.records(records), plots.x_key, out_dir, plots.xlabel, plots.tight)


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
