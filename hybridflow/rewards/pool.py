"""A process pool that scores samples with a per-sample timeout and survives bad functions."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout  # the builtin from Python 3.11
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from hybridflow.rewards._worker import WorkerLimits, check_function, init_worker, score_chunk

logger = logging.getLogger(__name__)

Outcome = tuple[str, Any]  # ("ok", value) | ("error", message) | ("timeout", message)


class ScoringPool:
    """Scores lists of keyword-argument dicts with `fn` in `num_workers` processes."""

    def __init__(
        self,
        fn: Callable[..., Any],
        num_workers: int,
        timeout_s: float,
        kill_grace_s: float = 2.0,
        mp_context: str = "forkserver",
        limits: WorkerLimits = WorkerLimits(),
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 for a pool, got {num_workers} (use in-process mode for 0)")
        if timeout_s <= 0 or kill_grace_s < 0:
            raise ValueError(f"timeout_s must be > 0 and kill_grace_s >= 0, got {timeout_s}, {kill_grace_s}")
        if mp_context not in ("forkserver", "spawn"):
            raise ValueError(
                f"mp_context must be 'forkserver' or 'spawn', got {mp_context!r}; 'fork' is unsafe in a "
                "process that runs threads (torch, Ray)"
            )
        _check_picklable(fn)
        self.fn = fn
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.kill_grace_s = kill_grace_s
        self.limits = limits
        self._ctx = multiprocessing.get_context(mp_context)
        self._executor: ProcessPoolExecutor | None = None
        self._starts: Any = None
        self._pids: set[int] = set()
        self.restarts = 0  # pools replaced after a kill or a crash, over the pool's life

    # ------------------------------------------------------------------ lifecycle

    def _ensure_executor(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # A fresh queue per pool: a killed worker may have died holding the old one's lock.
            self._starts = self._ctx.SimpleQueue()
            self._executor = ProcessPoolExecutor(
                max_workers=self.num_workers,
                mp_context=self._ctx,
                initializer=init_worker,
                initargs=(self.fn, self._starts, self.limits, os.getpid()),
            )
        return self._executor

    def _discard_executor(self, kill: bool) -> None:
        """Shut the pool down; with `kill`, SIGKILL every worker first (some may be hung)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if kill:
            # The pids the workers announced, and every process the executor started: a
            # worker stuck before it announced itself (in its initializer) would otherwise
            # keep shutdown() waiting forever. `_processes` is CPython's pid -> Process map.
            for pid in self._pids | set(getattr(executor, "_processes", None) or {}):
                _kill(pid)
        self._pids.clear()
        executor.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Stop the worker processes. The pool restarts on the next `run` if used again.

        Between runs no sample is in flight (hung ones were killed), so a graceful
        shutdown cannot block. Workers in a PID namespace of their own (allow_subprocess) are
        killed instead: there, a worker's pid is not the one the executor knows it by.
        """
        self._discard_executor(kill=self.limits.allow_subprocess)

    def check_function(self, timeout_s: float) -> str | None:
        """Import the function in a worker, confined like the samples; what is wrong with it
        (_worker.py `check_function`), or None."""
        executor = self._ensure_executor()
        try:
            return executor.submit(check_function).result(timeout=timeout_s)
        except FutureTimeout:
            self._discard_executor(kill=True)
            return f"importing the reward function took longer than {timeout_s:.0f} s in a reward worker"
        except BrokenProcessPool:
            self._discard_executor(kill=True)
            return ("the reward worker process died while importing the reward function (a crash in native code, "
                    "exit at import, or past reward.manager.memory_limit_mb)")

    # ------------------------------------------------------------------ scoring

    def run(self, tasks: Sequence[dict[str, Any]], give_up_after: int | None = None) -> tuple[list[Outcome], int]:
        """Outcomes of fn(**task) in task order, and how many pools had to be replaced.
        give_up_after: see the module docstring (None: score every sample)."""
        try:
            return first_samples_first(self._run_all, tasks, give_up_after)
        except BaseException:
            # Whatever went wrong, no worker may stay busy (or hung) behind us: a later
            # close() would otherwise wait for it forever.
            self._discard_executor(kill=True)
            raise

    def _run_all(self, tasks: Sequence[dict[str, Any]]) -> tuple[list[Outcome], int]:
        results: list[Outcome | None] = [None] * len(tasks)
        suspects: set[int] = set()  # samples in flight when a worker died on its own
        pending = set(range(len(tasks)))
        restarts_here = idle_breaks = 0
        while pending:
            if idle_breaks >= 3 or restarts_here >= MAX_RESTARTS_PER_RUN:
                # Safety nets: pools that keep breaking without scoring, killing or even
                # starting a sample must not loop forever; and a function that hangs or
                # kills its worker on every sample must not cost a pool restart (and a
                # timeout) per sample: after MAX_RESTARTS_PER_RUN the rest are given up.
                for i in pending:
                    results[i] = ("error", f"reward worker processes kept dying or hanging ({restarts_here} "
                                           "replaced in this batch); sample given up")
                break
            # A suspect runs alone: if the pool breaks again, it is the culprit, and the
            # innocent samples that happened to share the pool with it are not blamed.
            batch = [min(suspects & pending)] if suspects & pending else sorted(pending)
            before = (len(pending), len(suspects))
            broke = self._run_round(tasks, batch, pending, results, suspects)
            if broke:
                self._discard_executor(kill=True)
                self.restarts += 1
                restarts_here += 1
                idle_breaks = idle_breaks + 1 if (len(pending), len(suspects)) == before else 0
        return [r if r is not None else ("error", "no result") for r in results], restarts_here

    def _run_round(self, tasks, batch: list[int], pending: set[int], results: list, suspects: set[int]) -> bool:
        """Run `batch`; return True when the pool broke and must be replaced."""
        executor = self._ensure_executor()
        futures: dict[Future, list[int]] = {}
        try:
            for chunk in _chunks(batch, self.num_workers * CHUNKS_PER_WORKER):
                futures[executor.submit(score_chunk, [(i, tasks[i]) for i in chunk], self.timeout_s)] = chunk
        except BrokenProcessPool:
            # A worker died while we were still submitting (an early sample crashed it).
            # The futures already submitted report the break below; with none, the round
            # is simply over and the pool is replaced.
            if not futures:
                return True
        started: dict[int, tuple[int, float]] = {}  # task -> (pid, when the parent heard of it)
        tick = min(0.05, self.timeout_s / 4)
        waiting = set(futures)
        while waiting:
            done, waiting = wait(waiting, timeout=tick, return_when=FIRST_COMPLETED)
            broken = self._collect(done, futures, pending, results)
            self._drain_starts(started)
            if broken:
                if not started and not any(f.done() and not _failed(f) for f in futures):
                    self._discard_executor(kill=True)
                    raise RuntimeError(
                        "reward worker processes die before scoring anything (see their error output "
                        "above). Common causes: a script that creates the RewardManager without an "
                        "`if __name__ == '__main__':` guard (workers re-import the main module), or a "
                        "reward function that cannot be unpickled in a fresh process"
                    )
                self._blame(batch, started, pending, results, suspects)
                return True
            if self._kill_hung(started, pending, results):
                return True
        return False

    def _collect(self, done, futures: dict[Future, list[int]], pending: set[int], results: list) -> bool:
        broken = False
        for future in done:
            chunk = futures[future]
            try:
                outcomes = future.result()
            except BrokenProcessPool:
                broken = True
                continue
            except Exception as err:  # noqa: BLE001 - e.g. a result that cannot be pickled
                outcomes = [("error", f"{type(err).__name__}: {err}")] * len(chunk)
            for i, outcome in zip(chunk, outcomes):
                results[i] = outcome
                pending.discard(i)
        return broken

    def _drain_starts(self, started: dict[int, tuple[int, float]]) -> None:
        now = time.monotonic()
        while not self._starts.empty():
            task_id, pid = self._starts.get()
            self._pids.add(pid)
            started[task_id] = (pid, now)

    def _kill_hung(self, started: dict[int, tuple[int, float]], pending: set[int], results: list) -> bool:
        limit = self.timeout_s + self.kill_grace_s
        now = time.monotonic()
        # A worker runs its chunk in order: only its latest announced sample is running
        # (the earlier ones finished; their results come back with the chunk).
        running = {pid: (i, since) for i, (pid, since) in started.items()}  # announcement order
        hung = [i for i, since in running.values() if i in pending and now - since > limit]
        for i in hung:
            pid = started[i][0]
            logger.warning("reward sample %d still running after %.1f s: killing worker pid %d", i, limit, pid)
            _kill(pid)
            results[i] = ("timeout", f"reward function ran longer than {limit:.1f} s; its worker process was killed")
            pending.discard(i)
        return bool(hung)

    def _blame(self, batch: list[int], started, pending: set[int], results: list, suspects: set[int]) -> None:
        # A worker died on its own (segfault, os._exit). Alone in the pool, the sample is
        # the cause; otherwise every sample that was running becomes a suspect.
        running = [i for i in started if i in pending]
        if len(batch) == 1 and batch[0] in pending:
            results[batch[0]] = ("error", "the reward worker process died while scoring this sample")
            pending.discard(batch[0])
            return
        suspects.update(running)


def first_samples_first(run: Callable[[Sequence[dict[str, Any]]], tuple[list[Outcome], int]],
                        tasks: Sequence[dict[str, Any]], give_up_after: int | None) -> tuple[list[Outcome], int]:
    """`run(tasks)`; with `give_up_after=N`, `run` on the first N tasks and, unless every one
    of them failed, on the rest (module docstring). The pool and the in-process mode alike."""
    if give_up_after is None or len(tasks) <= give_up_after:
        return run(tasks)
    first, restarts = run(tasks[:give_up_after])
    if not any(status == "ok" for status, _ in first):
        return first + [("error", f"{NOT_SCORED}: the first {give_up_after} samples all failed")] * (
            len(tasks) - give_up_after), restarts
    rest, more = run(tasks[give_up_after:])
    return first + rest, restarts + more


NOT_SCORED = "not scored"  # the start of the error of a sample given up by `give_up_after`
MAX_RESTARTS_PER_RUN = 8  # pool replacements in one `run` before the remaining samples are given up
CHUNKS_PER_WORKER = 4  # several per worker, so one slow sample does not hold up a whole share


def _chunks(batch: list[int], count: int) -> list[list[int]]:
    """`batch` cut into at most `count` contiguous chunks of near-equal size."""
    size = -(-len(batch) // max(1, count))
    return [batch[k : k + size] for k in range(0, len(batch), size)]


def _check_picklable(fn: Callable[..., Any]) -> None:
    # Worker processes receive the function by pickle (functions travel by module and
    # name), so a lambda or a function defined inside another one cannot be sent.
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as err:
        raise ValueError(
            f"the reward function {fn!r} cannot be sent to worker processes ({err}); define it at module "
            "level in an importable module, load it from a file with load_reward_fn(path, name), or set "
            "num_workers=0 to score in-process"
        ) from err


def _failed(future: Future) -> bool:
    return future.cancelled() or future.exception() is not None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
