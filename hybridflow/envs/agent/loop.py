"""The multi-turn rollout: model turns and environment answers, on the rollout engine's turn engine.

    loop = AgentLoop(engine, tokenizer, AgentConfig(enable=True, default_env="tools"), response_length=256)
    out = loop.run(prompts, SamplingParams(temperature=1.0, n=4, seed=0))
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from hybridflow.engines.rollout.batch_io import stop_ids_for, unpad_prompts
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.turns import TurnEngine, TurnOutput
from hybridflow.envs.agent.base import AgentEnv, SingleTurn, resolve_agent_env
from hybridflow.envs.agent.config import AgentConfig
from hybridflow.envs.agent.guard import EnvFailure, EnvRunner
from hybridflow.envs.agent.lockstep import STOPS, Lockstep, Note
from hybridflow.envs.agent.render import ChatRenderer, RenderError, assistant_message
from hybridflow.protocol import DataProto

Futures = dict[concurrent.futures.Future, int]


@dataclass
class Trajectory:
    key: int
    row: int
    single_turn: bool
    env: AgentEnv | None = None  # on the generation group's rank 0 only
    prompt: list[int] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)  # rank 0 only (rendering)
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)  # (response index, reward)
    final_turn_start: int = 0
    num_turns: int = 0
    num_tool_calls: int = 0
    num_malformed_calls: int = 0
    stop: str | None = None
    error: str | None = None
    last_turn: list[int] = field(default_factory=list)


class AgentLoop:
    def __init__(self, engine, tokenizer, config: AgentConfig, response_length: int, pad_id: int) -> None:
        self.engine, self.config, self.response_length, self.pad_id = engine, config, response_length, pad_id
        self.renderer = ChatRenderer(tokenizer)
        if engine.tp_size > 1 and engine.tp_group is None:
            raise ValueError(f"the {type(engine).__name__} rollout backend runs t_g={engine.tp_size} but returns no "
                             "tp_group: multi-turn rollouts keep the group in lockstep over it (interface.py)")
        self.sync = Lockstep(engine.tp_group)
        self.runner: EnvRunner | None = None
        self.stats: dict[str, float] = {}

    # ----------------------------------------------------------------- public
    def run(self, prompts: DataProto, params: SamplingParams) -> DataProto:
        self.runner = EnvRunner(self.config.env_timeout_s) if self.sync.leader else None
        self.stats = {"env_wait_s": 0.0}
        try:
            trajs = self._start(prompts, params)
            # native: continues from the KV cache; hf: regenerates from the prefix (engine.turn_engine)
            turns = self.engine.turn_engine(min(len(trajs), self.engine.config.max_num_seqs))
            self._stop_ids = stop_ids_for(params, turns.eos_token_ids)
            by_key = {t.key: t for t in trajs}
            for t in trajs:
                if t.stop is None:
                    turn = replace(params, n=1, max_new_tokens=self._turn_budget(t))
                    turns.open(t.key, t.prompt, turn, row=t.row, sample=t.key)
            start = time.perf_counter()
            if self.config.mode == "async":
                self._run_async(turns, by_key)
            else:
                self._run_sync(turns, by_key)
            self.stats["loop_s"] = time.perf_counter() - start
            self.stats.update({f"engine_{k}": float(v) for k, v in turns.stats.items()})
            for note in self.sync.share(lambda: (self._close_envs(trajs), False))[0]:
                by_key[note.key].error = note.error
            if self.sync.size > 1:
                self.stats.update({k: float(v) for k, v in self.sync.stats.items()})
            return self._pack(prompts, trajs)
        finally:
            if self.runner is not None:
                self.runner.close()

    # ----------------------------------------------------------------- set-up
    def _make_env(self, extra: Any) -> AgentEnv:
        extra = extra if isinstance(extra, dict) else {}
        name = extra.get("env") or self.config.default_env
        if name is None:
            return SingleTurn()
        kwargs = extra.get("env_kwargs") if extra.get("env") else self.config.env_kwargs
        return resolve_agent_env(name, "extra_info.env")(**(kwargs or {}))

    def _start(self, prompts: DataProto, params: SamplingParams) -> list[Trajectory]:
        """Trajectories with rendered prompts: environments made and reset on rank 0, shared as notes."""
        made: list[Trajectory] = []
        notes, _ = self.sync.share(lambda: self._reset_envs(prompts, params, made))
        trajs = made or [Trajectory(n.key, n.key // params.n, n.single_turn, prompt=n.tokens, stop=n.stop,
                                    error=n.error) for n in notes]
        too_long = [t for t in trajs if t.stop is None and len(t.prompt) + self.response_length > self.engine.max_len]
        if too_long:
            raise ValueError(f"{len(too_long)} prompts + rollout.response_length={self.response_length} exceed the "
                             f"engine's max_model_len={self.engine.max_len}; lower rollout.response_length or "
                             "data.prompt.max_prompt_length, or raise rollout.max_model_len")
        return trajs

    def _reset_envs(self, prompts: DataProto, params: SamplingParams, trajs: list[Trajectory]):
        """Rank 0: build and reset each trajectory's environment (into `trajs`); one note each."""
        ids = unpad_prompts(prompts)
        nt = prompts.non_tensor_batch
        resets = []
        for i in range(len(prompts)):
            row = {k: nt[k][i] for k in nt}
            for _ in range(params.n):
                key = len(trajs)
                try:
                    env = self._make_env(row.get("extra_info"))
                except Exception as err:  # a user env whose constructor fails ends only its trajectory
                    trajs.append(Trajectory(key, i, True, prompt=ids[i], stop="env_error", error=f"init: {err}"))
                    continue
                t = Trajectory(key, i, isinstance(env, SingleTurn), env, prompt=ids[i])
                trajs.append(t)
                if not t.single_turn:
                    resets.append((t, self.runner.reset(env, row)))
        for t, future in resets:
            result = future.result()
            if isinstance(result, EnvFailure):
                t.stop, t.error = f"env_{result.kind}", result.message
                continue
            t.messages = self.renderer.with_tools(list(result), t.env.tools)
            t.prompt = self.renderer.prompt(t.messages, t.env.tools)
        return [Note(t.key, t.stop, t.error, tokens=t.prompt, single_turn=t.single_turn) for t in trajs], False

    # ----------------------------------------------------------------- modes
    def _run_async(self, turns: TurnEngine, by_key: dict[int, Trajectory]) -> None:
        waiting: Futures = {}
        to_step: list[Trajectory] = []
        while True:
            # rank 0 steps the environments of the turns that just ended and gathers the
            # answers that arrived (blocking for one when nothing can be decoded meanwhile)
            notes, pending = self.sync.share(lambda: self._answers(by_key, waiting, to_step, block=not turns.busy))
            to_step = []
            for note in notes:
                self._apply(turns, by_key[note.key], note)
            if turns.busy:
                to_step = [by_key[out.key] for out in turns.step() if self._after_turn(turns, by_key[out.key], out)]
            elif not pending:
                return

    def _answers(self, by_key: dict[int, Trajectory], waiting: Futures, to_step: list[Trajectory],
                 block: bool) -> tuple[list[Note], bool]:
        """Rank 0, async mode: submit the new env steps, return the answers that are in and
        whether others are still pending."""
        for t in to_step:
            waiting[self._step_env(t)] = t.key
        if block and waiting and not any(f.done() for f in waiting):
            t0 = time.perf_counter()
            concurrent.futures.wait(waiting, return_when=concurrent.futures.FIRST_COMPLETED)
            self.stats["env_wait_s"] += time.perf_counter() - t0
        done = [f for f in waiting if f.done()]
        notes = [self._resolve(by_key[waiting.pop(f)], f.result()) for f in done]
        return notes, bool(waiting)

    def _run_sync(self, turns: TurnEngine, by_key: dict[int, Trajectory]) -> None:
        while turns.busy:
            outs: list[TurnOutput] = []
            while turns.busy:
                outs += turns.step()
            outs.sort(key=lambda o: o.key)
            stepping = [by_key[o.key] for o in outs if self._after_turn(turns, by_key[o.key], o)]
            notes, _ = self.sync.share(lambda: (self._step_all(stepping), False))
            for note in notes:
                self._apply(turns, by_key[note.key], note)

    def _step_all(self, stepping: list[Trajectory]) -> list[Note]:
        """Rank 0, sync mode: step every environment together, wait for all, one note each."""
        futures = [(t, self._step_env(t)) for t in stepping]
        t0 = time.perf_counter()
        concurrent.futures.wait([f for _, f in futures])
        self.stats["env_wait_s"] += time.perf_counter() - t0
        return [self._resolve(t, f.result()) for t, f in futures]

    # ----------------------------------------------------------------- one turn
    def _after_turn(self, turns: TurnEngine, t: Trajectory, out: TurnOutput) -> bool:
        """Record the model's turn (every rank); True when its environment must answer."""
        t.final_turn_start = len(t.tokens)
        t.tokens += out.tokens
        t.mask += [1] * len(out.tokens)
        t.log_probs += out.log_probs
        t.num_turns += 1
        t.last_turn = out.tokens
        if out.finish_reason == "length":
            full = len(t.tokens) >= self.response_length
            self._end(turns, t, "max_total_tokens" if full else "turn_length")
            return False
        if t.single_turn:
            self._end(turns, t, "done")
            return False
        return True

    def _step_env(self, t: Trajectory) -> concurrent.futures.Future:
        """Rank 0: hand the model's turn to the trajectory's environment."""
        text = self.renderer.turn_text(t.last_turn, self._stop_ids)
        t.messages.append(assistant_message(text))
        return self.runner.step(t.env, text)

    def _resolve(self, t: Trajectory, result) -> Note:
        """Rank 0: turn the environment's answer into a note (end, or the observation's tokens)."""
        if isinstance(result, EnvFailure):
            return Note(t.key, f"env_{result.kind}", result.message)
        note = Note(t.key, reward=float(result.reward), tool_calls=int(result.info.get("tool_calls", 0)),
                    malformed=int(result.info.get("tool_malformed", 0)))
        if result.done:
            note.stop = "done"
        elif t.num_turns >= self.config.max_turns:
            note.stop = "max_turns"
        else:
            try:
                obs = self.renderer.observation(t.messages, t.last_turn, result.observation, t.env.tools)
            except RenderError as err:
                note.stop, note.error = "render_error", str(err)
                return note
            if len(obs) > self.config.max_obs_tokens:
                note.stop = "max_obs_tokens"
            elif len(t.tokens) + len(obs) >= self.response_length:
                note.stop = "max_total_tokens"
            else:
                t.messages += result.observation
                note.tokens = obs
        return note

    def _apply(self, turns: TurnEngine, t: Trajectory, note: Note) -> None:
        """Every rank: apply rank 0's decision: end the trajectory, or append the observation and resume."""
        if note.reward:
            t.turn_rewards.append((len(t.tokens) - 1, note.reward))
        t.num_tool_calls += note.tool_calls
        t.num_malformed_calls += note.malformed
        if note.stop is not None:
            t.error = note.error if note.error is not None else t.error
            self._end(turns, t, note.stop)
            return
        t.tokens += note.tokens
        t.mask += [0] * len(note.tokens)
        t.log_probs += [0.0] * len(note.tokens)
        turns.extend(t.key, note.tokens, max_new_tokens=self._turn_budget(t))

    def _turn_budget(self, t: Trajectory) -> int:
        left = self.response_length - len(t.tokens)
        return left if self.config.max_turn_tokens is None else min(left, self.config.max_turn_tokens)

    def _end(self, turns: TurnEngine, t: Trajectory, reason: str) -> None:
        t.stop = reason
        turns.close(t.key)

    def _close_envs(self, trajs: list[Trajectory]) -> list[Note]:
        """Rank 0: close every environment; a note for each whose close failed (its error)."""
        opened = [t for t in trajs if t.env is not None]
        notes = []
        for t, failure in zip(opened, self.runner.close_envs([t.env for t in opened])):
            if failure is not None and t.error is None:
                notes.append(Note(t.key, error=f"close: {failure.message}"))
        return notes

    # ----------------------------------------------------------------- output
    def _pack(self, prompts: DataProto, trajs: list[Trajectory]) -> DataProto:
        n, width = len(trajs), self.response_length
        plen = max(len(t.prompt) for t in trajs)
        prompt_ids = torch.full((n, plen), self.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros(n, plen, dtype=torch.long)
        responses = torch.full((n, width), self.pad_id, dtype=torch.long)
        response_mask = torch.zeros(n, width, dtype=torch.long)
        attn = torch.zeros(n, width, dtype=torch.long)
        log_probs = torch.zeros(n, width, dtype=torch.float32)
        env_rewards = torch.zeros(n, width, dtype=torch.float32)
        for i, t in enumerate(trajs):
            prompt_ids[i, plen - len(t.prompt):] = torch.tensor(t.prompt)
            prompt_mask[i, plen - len(t.prompt):] = 1
            k = len(t.tokens)
            if k:
                responses[i, :k] = torch.tensor(t.tokens)
                response_mask[i, :k] = torch.tensor(t.mask)
                attn[i, :k] = 1
                log_probs[i, :k] = torch.tensor(t.log_probs)
            for pos, reward in t.turn_rewards:
                env_rewards[i, pos] += reward
        prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        response_pos = prompt_pos[:, -1:] + torch.arange(1, width + 1)
        rows = np.array([t.row for t in trajs])
        non_tensors = {k: v[rows] for k, v in prompts.non_tensor_batch.items()}
        score_override = [self.config.error_score if t.stop in ("env_error", "env_timeout", "env_bad_result")
                          else math.nan for t in trajs]
        extra = {"final_turn_start": [t.final_turn_start for t in trajs], "score_override": score_override,
                 "agent_stop": [t.stop for t in trajs], "agent_error": [t.error for t in trajs],
                 "num_turns": [t.num_turns for t in trajs], "num_tool_calls": [t.num_tool_calls for t in trajs],
                 "num_malformed_calls": [t.num_malformed_calls for t in trajs],
                 "finish_reason": ["stop" if t.stop == "done" else "length" for t in trajs]}
        for key, values in extra.items():
            arr = np.empty(n, dtype=object)
            arr[:] = values
            non_tensors[key] = arr
        meta = dict(prompts.meta_info)
        meta["metrics"] = {**meta.get("metrics", {}), **self._metrics(trajs)}
        return DataProto.from_dict(
            tensors={"prompts": prompt_ids, "responses": responses, "response_mask": response_mask,
                     "input_ids": torch.cat([prompt_ids, responses], 1),
                     "attention_mask": torch.cat([prompt_mask, attn], 1),
                     "position_ids": torch.cat([prompt_pos, response_pos], 1),
                     "rollout_log_probs": log_probs, "env_rewards": env_rewards},
            non_tensors=non_tensors, meta_info=meta)

    def _metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        agents = [t for t in trajs if not t.single_turn] or trajs
        out = {"agent/turns_mean": float(np.mean([t.num_turns for t in agents])),
               "agent/tool_calls_mean": float(np.mean([t.num_tool_calls for t in agents])),
               "agent/tool_call_rate": float(np.mean([t.num_tool_calls > 0 for t in agents])),
               "agent/env_errors": float(sum(t.error is not None for t in trajs)),
               "agent/model_tokens_mean": float(np.mean([sum(t.mask) for t in trajs])),
               "agent/obs_tokens_mean": float(np.mean([len(t.mask) - sum(t.mask) for t in trajs]))}
        for reason in STOPS:
            out[f"agent/stop_{reason}"] = float(sum(t.stop == reason for t in trajs))
        out.update(self.runtime_metrics())
        return out

    def runtime_metrics(self) -> dict[str, float]:
        """Where the loop's time went (env waits, engine calls, lockstep exchanges), as
        `agent_loop/<stat>`: per rank, so the worker reports the slowest rank's. The
        per-trajectory means above are recomputed from the records by the reward manager."""
        return {f"agent_loop/{k}": float(v) for k, v in self.stats.items()}

