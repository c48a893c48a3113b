"""Runs environment code so that a bad environment ends its trajectory, never the run.

    runner = EnvRunner(timeout_s=10)
    future = runner.reset(env, row)        # concurrent.futures.Future -> list[Message] | EnvFailure
    future = runner.step(env, turn_text)   # -> StepResult | EnvFailure
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
from dataclasses import dataclass
from typing import Any

from hybridflow.envs.agent.base import AgentEnv, Message, StepResult


class BadResult(TypeError):
    """An environment returned something of the wrong type or shape."""


@dataclass(frozen=True)
class EnvFailure:
    kind: str  # "error", "timeout", "bad_result"
    message: str


def check_messages(value: Any, what: str) -> list[Message]:
    if not isinstance(value, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        raise BadResult(f"{what} must return a list of {{'role': str, 'content': str}} dicts, got {value!r:.200}")
    return value


def check_step(value: Any) -> StepResult:
    if not isinstance(value, StepResult):
        raise BadResult(f"step must return a StepResult, got {type(value).__name__}")
    check_messages(value.observation, "step (observation)")
    if not isinstance(value.done, bool):
        raise BadResult(f"StepResult.done must be a bool, got {value.done!r}")
    if not isinstance(value.reward, (int, float)) or not math.isfinite(value.reward):
        raise BadResult(f"StepResult.reward must be a finite number, got {value.reward!r}")
    if not isinstance(value.info, dict):
        raise BadResult(f"StepResult.info must be a dict, got {type(value.info).__name__}")
    return value


class EnvRunner:
    """A background event loop that runs environment calls with a time limit."""

    def __init__(self, timeout_s: float, max_threads: int = 256) -> None:
        self.timeout_s = timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(max_threads, thread_name_prefix="agent-env")
        self._loop = asyncio.new_event_loop()
        self._loop.set_default_executor(self._pool)
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-env-loop", daemon=True)
        self._thread.start()

    def reset(self, env: AgentEnv, row: dict[str, Any]) -> concurrent.futures.Future:
        async def call():
            return check_messages(await asyncio.to_thread(env.reset, row), "reset")
        return self._submit(call)

    def step(self, env: AgentEnv, turn: str) -> concurrent.futures.Future:
        async def call():
            return check_step(await env.astep(turn))
        return self._submit(call)

    def _submit(self, call) -> concurrent.futures.Future:
        async def guarded():
            try:
                return await asyncio.wait_for(call(), self.timeout_s)
            except asyncio.TimeoutError:
                return EnvFailure("timeout", f"no answer within {self.timeout_s} s")
            except BadResult as err:
                return EnvFailure("bad_result", str(err))
            except Exception as err:  # the environment's own bug: recorded, the run goes on
                return EnvFailure("error", f"{type(err).__name__}: {err}")
        return asyncio.run_coroutine_threadsafe(guarded(), self._loop)

    def close_envs(self, envs: list[AgentEnv]) -> list[EnvFailure | None]:
        """Call every env.close() at once (each bounded by the timeout, so all of them by
        about one timeout); a failure is returned in its env's place, not raised."""
        futures = [self._submit(lambda env=env: asyncio.to_thread(env.close)) for env in envs]
        results = [future.result() for future in futures]
        return [r if isinstance(r, EnvFailure) else None for r in results]

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
