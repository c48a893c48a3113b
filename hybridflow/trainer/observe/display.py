"""Console output of a run: a rich progress bar with the latest step's key numbers,
or one plain line per step, or nothing (trainer.console = rich | plain | none)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# (metric key, label, format) shown per step, when the step has the metric.
STEP_FIELDS = (
    ("score/mean", "score", "{:.3f}"),
    ("val/accuracy", "val acc", "{:.1%}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("actor/ref_kl", "kl", "{:.4f}"),
    ("actor/pg_clipfrac", "clip", "{:.3f}"),
    ("critic/vf_loss", "vf loss", "{:.4f}"),
    ("actor/loss", "loss", "{:.4f}"),
    ("timing_s/step", "s/step", "{:.2f}"),
)


# The progress bar's line keeps to the few numbers that fit next to it.
BAR_FIELDS = ("score/mean", "val/accuracy", "actor/loss", "timing_s/step")


def summarize(metrics: dict[str, Any], keys: tuple[str, ...] | None = None) -> str:
    return "  ".join(f"{label} {fmt.format(metrics[key])}" for key, label, fmt in STEP_FIELDS
                     if key in metrics and (keys is None or key in keys))


def eval_summary(metrics: dict[str, Any]) -> str:
    """One line for an evaluation record: overall accuracy and score, then per data source."""
    line = (f"held-out accuracy {metrics['val/accuracy']:.1%} (score {metrics['val/score']:.3f}) "
            f"on {int(metrics['val/samples'])} responses")
    if "val/tool_call_rate" in metrics:  # an agent task (evaluate.agent_metrics)
        line += (f", tool-call rate {metrics['val/tool_call_rate']:.1%} "
                 f"({metrics['val/num_tool_calls_mean']:.2f} calls, {metrics['val/num_turns_mean']:.2f} turns each)")
    sources = per_source(metrics)
    if len(sources) > 1:
        line += "; " + ", ".join(f"{name} {values['accuracy']:.1%}" for name, values in sources.items())
    return line


def per_source(metrics: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{data_source: {"accuracy": ..., "score": ..., "samples": ...}} from val/<source>/<name> keys."""
    sources: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if key.startswith("val/") and key.count("/") >= 2:
            source, name = key[len("val/"):].rsplit("/", 1)
            sources.setdefault(source, {})[name] = value
    return dict(sorted(sources.items()))


class RunDisplay:
    """Progress of one phase (SFT or RL) of a run."""

    def __init__(self, mode: str, console: Console | None = None) -> None:
        self.mode = mode
        self.console = console or Console()
        self._progress: Progress | None = None
        self._task = None
        self._last_val: dict[str, Any] = {}  # the latest evaluation stays on the bar until the next

    def message(self, text: str) -> None:
        if self.mode != "none":
            self.console.print(text, soft_wrap=True)

    def start(self, title: str, total: int, done: int = 0) -> None:
        """A phase whose steps run from `done` + 1 to `total` (a resumed run: `done` before it)."""
        if self.mode == "rich":
            self._progress = Progress(
                TextColumn(f"[bold]{title}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"), console=self.console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(title, total=total, completed=done, info="")
        elif self.mode == "plain":
            self.console.print(f"{title}: {total} steps" if done == 0 else f"{title}: steps {done + 1} to {total}")

    def step(self, step: int, total: int, metrics: dict[str, Any]) -> None:
        if self._progress is not None:
            self._last_val.update({k: v for k, v in metrics.items() if k.startswith("val/")})
            shown = {**metrics, **self._last_val}
            self._progress.update(self._task, completed=step, info=summarize(shown, BAR_FIELDS))
        elif self.mode == "plain":
            self.console.print(f"step {step}/{total}  {summarize(metrics)}", highlight=False, soft_wrap=True)

    def stop(self) -> None:
        self._last_val = {}
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
