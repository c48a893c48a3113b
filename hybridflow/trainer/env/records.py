"""Metrics records and console progress of environment runs."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from hybridflow.trainer.observe.display import RunDisplay


class RecordAccumulator:
    """Iteration metrics between two records; JSON-able state for checkpoints."""

    def __init__(self, return_window: int) -> None:
        self.window: deque[float] = deque(maxlen=return_window)
        self.episodes_total = 0
        self._reset(time.perf_counter(), 0)

    def _reset(self, now: float, env_steps: int) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.iterations = 0
        self.since, self.since_steps = now, env_steps

    def add(self, metrics: dict[str, Any]) -> None:
        returns, lengths = metrics.pop("episode_returns", []), metrics.pop("episode_lengths", [])
        self.returns += returns
        self.lengths += lengths
        self.window.extend(returns)
        self.episodes_total += len(returns)
        self.iterations += 1
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.sums[key] = self.sums.get(key, 0.0) + float(value)
                self.counts[key] = self.counts.get(key, 0) + 1

    def window_mean(self, full: bool = False) -> float | None:
        """Mean return over the last return_window episodes (fewer while fewer finished);
        None before the first episode ends, or with `full` before return_window did."""
        if not self.window or (full and len(self.window) < (self.window.maxlen or 1)):
            return None
        return sum(self.window) / len(self.window)

    def flush(self, env_steps: int) -> dict[str, float]:
        """The record of the iterations since the previous flush."""
        now = time.perf_counter()
        out = {key: total if key.startswith("timing_s/") else total / self.counts[key]
               for key, total in self.sums.items()}
        out["env/steps"] = float(env_steps)
        out["env/steps_per_s"] = (env_steps - self.since_steps) / max(now - self.since, 1e-9)
        out["perf/iterations"] = float(self.iterations)
        out["episode/count"] = float(len(self.returns))
        out["episode/total"] = float(self.episodes_total)
        if self.returns:
            out.update({"episode/return_mean": sum(self.returns) / len(self.returns),
                        "episode/return_min": min(self.returns), "episode/return_max": max(self.returns),
                        "episode/length_mean": sum(self.lengths) / len(self.lengths)})
        if self.window:
            out["episode/return_mean_window"] = sum(self.window) / len(self.window)
        self._reset(now, env_steps)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"window": list(self.window), "episodes_total": self.episodes_total, "sums": self.sums,
                "counts": self.counts, "returns": self.returns, "lengths": self.lengths,
                "iterations": self.iterations, "since_steps": self.since_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window.clear()
        self.window.extend(state["window"])
        self.episodes_total = int(state["episodes_total"])
        self.sums, self.counts = dict(state["sums"]), dict(state["counts"])
        self.returns, self.lengths = list(state["returns"]), list(state["lengths"])
        self.iterations, self.since_steps = int(state["iterations"]), int(state["since_steps"])
        self.since = time.perf_counter()


def crossed(before: int, after: int, every: int) -> bool:
    """Did the count pass a multiple of `every` (> 0) going from `before` to `after`?"""
    return every > 0 and after // every > before // every


class EnvDisplay(RunDisplay):
    """A progress bar over environment steps with the latest return (console: rich), one line
    per record (plain), or nothing (none); `message` and `stop` are RunDisplay's."""

    def start(self, title: str, total: int, done: int = 0) -> None:
        if self.mode == "rich":
            self._progress = Progress(TextColumn(f"[bold]{title}[/bold]"), BarColumn(),
                                      TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
                                      TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=self.console)
            self._progress.start()
            self._task = self._progress.add_task(title, total=total, completed=done, info="")
        elif self.mode == "plain":
            self.console.print(f"{title}: to {total:,} environment steps (from {done:,})")

    def record(self, record: dict[str, float]) -> None:
        info = "  ".join(f"{label} {record[key]:{fmt}}" for key, label, fmt in (
            ("episode/return_mean_window", "return", ".1f"), ("env/steps_per_s", "steps/s", ".0f"))
            if key in record and math.isfinite(record[key]))
        if self._progress is not None:
            self._progress.update(self._task, completed=record["env/steps"], info=info)
        elif self.mode == "plain":
            self.console.print(f"steps {record['env/steps']:,.0f}  {info}", highlight=False)
