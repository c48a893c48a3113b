"""Steps without learning signal: said on the console, counted, and (if asked) a stop.

A step has no learning signal when every group's advantages are 0 (phases.record_signal:
adv/silent_groups == adv/groups), e.g. GRPO when every response to every prompt scored the
same. The actor then skips its optimizer step (actor.loss.skip_no_signal_updates, metric
actor/skipped_no_signal), or, with that off, steps on nothing. `SignalWatch` prints one
line for each such step saying which happened, counts the run of them in the metric
adv/no_signal_steps, and stops the run cleanly (evaluation and export still happen) after
trainer.max_no_signal_steps of them in a row.
"""

from __future__ import annotations

from collections.abc import Callable

from hybridflow.trainer.programs.phases import GROUPS, SILENT_GROUPS

NO_SIGNAL_STEPS = "adv/no_signal_steps"  # steps in a row without learning signal, this one included
LIMIT_KEY = "trainer.max_no_signal_steps"
SKIPPED = "actor/skipped_no_signal"  # engines/train/update.py: share of optimizer steps skipped for no signal
SKIP_KEY = "actor.loss.skip_no_signal_updates"


class SignalWatch:
    """Counts consecutive steps whose every group is silent (module docstring)."""

    def __init__(self, limit: int | None, say: Callable[[str], None]) -> None:
        self.limit = limit
        self.say = say
        self.in_a_row = 0
        self.hinted = False

    def state_dict(self) -> dict[str, int | bool]:
        """What a checkpoint keeps, so a resumed run counts on as an uninterrupted one."""
        return {"in_a_row": self.in_a_row, "hinted": self.hinted}

    def load_state_dict(self, state: dict[str, int | bool]) -> None:
        self.in_a_row, self.hinted = int(state["in_a_row"]), bool(state["hinted"])

    def stop_reason(self, step: int, metrics: dict[str, float]) -> str | None:
        """Record `step`'s signal in `metrics`; the reason to stop now, or None."""
        if SILENT_GROUPS not in metrics:  # a program that made no actor update (custom programs)
            return None
        groups, silent = int(metrics[GROUPS]), int(metrics[SILENT_GROUPS])
        self.in_a_row = self.in_a_row + 1 if silent == groups else 0
        metrics[NO_SIGNAL_STEPS] = float(self.in_a_row)
        if not self.in_a_row:
            return None
        score = metrics.get("score/mean")
        scored = f" (score mean {score:.3f})" if score is not None else ""
        hint = ""
        if self.limit is None and not self.hinted:
            hint = (f"; a reward that tells responses apart, more samples where there were none "
                    f"(algorithm.exploration), a warm start on a few demonstrations (sft.files) or a higher "
                    f"temperature gives signal (docs/learning.md, cold start); {LIMIT_KEY}=N stops a run after N such "
                    "steps in a row")
            self.hinted = True
        self.say(f"step {step}: no learning signal: all {groups} groups scored their responses alike{scored}, "
                 f"so every advantage is 0; {_update_said(metrics)} ({self.in_a_row} in a row){hint}")
        if self.limit is not None and self.in_a_row >= self.limit:
            return (f"stopped after {self.in_a_row} steps in a row without learning signal ({LIMIT_KEY}="
                    f"{self.limit}; null never stops)")
        return None


def _update_said(metrics: dict[str, float]) -> str:
    """What the actor's update did on a step without signal (its skipped_no_signal metric)."""
    if metrics.get(SKIPPED) == 1.0:
        return "the optimizer step was skipped (weights and optimizer state unchanged)"
    if SKIPPED in metrics:  # a share: several mini-batches, not all of them silent (epochs > 1 reshuffle)
        return f"{metrics[SKIPPED]:.0%} of its optimizer steps were skipped"
    return (f"the optimizer still stepped on nothing ({SKIP_KEY}=false): AdamW's momentum and weight decay moved "
            "the weights")
