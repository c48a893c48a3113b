"""Checks shared by the trainer tests (imported as a top-level module, like the other
test directories' helpers)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hybridflow.config.schema import RunConfig, load_run_config
from hybridflow.trainer.run.run_dir import read_metrics

# A 2-layer, 32-wide model and a handful of prompts: seconds per step on 2 CPU ranks.
# The untrained tiny model scores 0 on every built-in prompt, so most of these runs' steps have
# no learning signal; they keep stepping the optimizer on them (skip_no_signal_updates=false, the
# behaviour before the setting existed): their update metrics (actor/pg_loss, grad_norm, ...)
# are what many tests check, and 12 of test_recorded_metrics' 23 pinned runs were recorded so.
# The default (skip) is tested where it is set: test_no_signal.py, test_cold_start.py and
# tests/engines/train/test_no_signal_update.py.
TINY = [
    "trainer.console=none", "trainer.total_steps=2", "trainer.test_freq=0", "trainer.save_final_model=false",
    "resources.world_size=2", "sft.steps=0", "actor.loss.skip_no_signal_updates=false",
    "model.builtin.hidden_size=32", "model.builtin.intermediate_size=64", "model.builtin.num_hidden_layers=2",
    "data.train_batch_size=4", "rollout.n=2", "data.builtin.num_train=64", "data.builtin.num_val=8",
    "actor.micro_batch.mini_batch_size=4", "actor.micro_batch.micro_batch_size_per_device=2",
    "critic.micro_batch.mini_batch_size=4", "critic.micro_batch.micro_batch_size_per_device=2",
    "reward.manager.num_workers=1",
]


def tiny_run_config(output_dir, *overrides: str) -> RunConfig:
    """TINY plus `overrides`, with runs going under `output_dir`."""
    return load_run_config(None, [f"trainer.output_dir={output_dir}", *TINY, *overrides])


def rl_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]


def logged_rl_steps(run_dir: Path) -> list[int]:
    """The steps (an environment run's iterations) a run, maybe still running, has logged so far."""
    return [r["step"] for r in rl_records(run_dir)] if (run_dir / "metrics.jsonl").is_file() else []


def assert_finite(record: dict) -> None:
    """Every metric of a metrics.jsonl record is a finite number (non-finite are written as null)."""
    bad = {k: v for k, v in record.items() if k not in ("phase",) and not (
        isinstance(v, (int, float)) and math.isfinite(v))}
    assert not bad, f"non-finite metrics at step {record['step']}: {bad}"


def counted_reads(monkeypatch, path: Path) -> list[Path]:
    """The reads of `path` from now on (Path.read_text is how every config file is read)."""
    path, reads, read_text = path.resolve(), [], Path.read_text

    def counting(self, *args, **kwargs):
        if self.resolve() == path:
            reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    return reads


def profile_in_background(find_run_dir: Callable[[], Path | None], out: Path) -> Callable[[], dict]:
    """`hybridflow monitor RUN_DIR --profile cpu` in a thread from the moment the run (the
    directory `find_run_dir` gives once it exists) has recorded its workers; the returned
    call waits for the monitor and gives its report.json. (Which workers and phases the
    report holds depends on how much of the run the window saw: a short run may end first.)"""
    from hybridflow.cli.monitor import main as monitor_main
    from hybridflow.trainer.observe.live_status import read_status

    result: dict = {}

    def watch() -> None:
        while (run_dir := find_run_dir()) is None or not (read_status(run_dir) or {}).get("workers"):
            time.sleep(0.05)
        result["rc"] = monitor_main([str(run_dir), "--profile", "cpu", "--duration", "60", "--interval", "0.1",
                                     "--out", str(out)])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()

    def report() -> dict:
        thread.join(timeout=120)
        assert result.get("rc") == 0, result
        return json.loads((out / "report.json").read_text())

    return report
