"""The language-model task kind's part of the one lifecycle (trainer/task.py: `Task`).

    with RLTrainer("examples/grpo_arithmetic.yaml") as trainer:
        result = trainer.train(steps=5)          # SFT warm start (sft.steps > 0) first, once
    print(result.accuracy_before, result.accuracy_after, result.run_dir)
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow.config.model_presets import write_model_presets
from hybridflow.config.sections.trainer import ValidationSection
from hybridflow.controller import FETCHED, WorkerError, WorkerGroup
from hybridflow.protocol import DataProto
from hybridflow.trainer.jobs.sft import run_sft
from hybridflow.trainer.lm.curriculum import difficulty, train_loader
from hybridflow.trainer.lm.evaluate import evaluate, evaluate_responses
from hybridflow.trainer.modes.async_trainer import AsyncRunner
from hybridflow.trainer.observe.metrics import BatchSummary, flop_model, mfu_note, throughput_metrics
from hybridflow.trainer.observe.plots import plot_run
from hybridflow.trainer.observe.signal import SignalWatch
from hybridflow.trainer.programs.algorithms import build_algo_state, step_program
from hybridflow.trainer.programs.phases import Roles, Step
from hybridflow.trainer.run.checkpointing import logged_accuracy, role_checkpoint_path
from hybridflow.trainer.run.elastic import restart_config
from hybridflow.trainer.run.lifecycle import (
    MODEL_KEY,
    ResumePoint,
    check_steps_left,
    model_record,
    policy_start_path,
    resume_point,
)
from hybridflow.trainer.run.preflight import check_lengths_fit
from hybridflow.trainer.run.setup import (
    RunContext,
    build_cost_manager,
    build_groups,
    endless,
    rank_cpus,
    rl_roles,
    train_prompts,
)
from hybridflow.trainer.task import TASK_PARTS, Task
from hybridflow.workers import shutdown_role_groups


@dataclass
class TrainResult:
    """What a `train` call achieved (accuracies are greedy held-out; None without val data)."""

    run_dir: Path
    steps: int
    accuracy_before: float | None
    accuracy_after: float | None
    last_metrics: dict[str, float]
    stopped: str | None = None  # why the run stopped before its steps were done (observe/signal.py), None if it did not


class LanguageModelPart:
    """Data, reward and tokenizer (RunContext); the algorithm's roles; one RL step a step."""

    unit, phase = "step", "rl"

    def __init__(self) -> None:
        self.async_runner: AsyncRunner | None = None  # trainer.mode one_step_off / async
        self.sft_result = None
        self.signal: SignalWatch | None = None

    def resume_point(self, resume: Any, config: Any) -> ResumePoint:
        return resume_point(resume, config)

    def open(self, cfg: Any, resume_from: Any) -> RunContext:
        ctx = RunContext.open(cfg, resume_from=resume_from)
        self.signal = SignalWatch(ctx.cfg.trainer.max_no_signal_steps, ctx.display.message)
        return ctx

    def restart_config(self, cfg: Any, lost_node: str | None) -> Any:
        return restart_config(cfg, lost_node)

    # ------------------------------------------------------------------ set-up

    def start(self, task: Task) -> None:
        cfg, ctx = task.config, task.ctx
        ctx.ray.use()  # Ray up with room for the ranks (another trainer may have restarted it)
        # before any worker starts: lengths are checked now (read already when counting trainer.total_epochs)
        data = ctx.train_data if ctx.train_data is not None else train_prompts(cfg, ctx.tokenizer)
        check_lengths_fit(cfg, max(map(len, data.input_ids)), "the longest training prompt")
        sft_actor = None
        if cfg.sft.steps > 0 and task.resumed_from is None:  # a resumed run warm-started before its checkpoint
            self.sft_result = run_sft(ctx, keep_actor=True)
            sft_actor, self.sft_result.actor = self.sft_result.actor, None
            ctx.display.message(f"SFT warm start: {cfg.sft.steps} steps, loss {self.sft_result.final_loss:.3f}")
        task.groups, policy_path = self._role_groups(task, sft_actor)
        if ctx.cost is None:
            ctx.cost = build_cost_manager(cfg, ctx.tokenizer)  # closed with the context
        g = task.groups
        task.roles = Roles(actor=g["actor"], critic=g.get("critic"), reward=ctx.reward,
                           reward_model=g.get("reward_model"), cost_critic=g.get("cost_critic"),
                           cost_model=g.get("cost_model"), cost_fn=ctx.cost)
        self.loader = train_loader(cfg, data, difficulty(cfg, data, task.run_dir,
                                                         functools.partial(_pass_marks, task), ctx.display.message))
        self.batches = endless(self.loader)
        task.state = build_algo_state(cfg)
        self.flop_model = flop_model(task.groups)  # each rank measures its own device's peak
        if cfg.trainer.mode != "sync":  # a generation-only pool beside the actor (modes/async_trainer.py)
            self.async_runner, task.groups["rollout"] = AsyncRunner.start(
                cfg, task.roles, policy_path, self.batches, task.state, rank_cpus(cfg.resources, ctx.layout))
        note = mfu_note(self.flop_model.peak_flops, cfg.resources.use_gpu, cfg.actor.peak_flops_per_device is not None)
        if note is not None:
            ctx.display.message(note)

    def _role_groups(self, task: Task, sft_actor: WorkerGroup | None) -> tuple[dict[str, WorkerGroup], Path]:
        """The RL roles' worker groups and the model the policy starts from. An actor alone
        is built again in the SFT warm start's processes (no new workers); otherwise those
        are stopped and every role starts."""
        sft = {"actor": sft_actor} if sft_actor is not None else {}
        try:
            policy_path = policy_start_path(task.config, task.run_dir)
            roles = rl_roles(task.config, policy_path)
        except BaseException:
            shutdown_role_groups(sft)
            raise
        if sft and list(roles) == ["actor"]:
            sft_actor.rebuild(*roles["actor"].args)
            return sft, policy_path  # closed with task.groups from here on
        shutdown_role_groups(sft)
        return build_groups(task.config, task.ctx.layout, roles), policy_path

    def release(self, task: Task) -> None:
        self.async_runner = None

    # ------------------------------------------------------------------ the loop

    def steps_left(self, task: Task) -> int:
        return check_steps_left(task.global_step, task.config.trainer.total_steps)

    def begin(self, task: Task, steps: int) -> int:
        """The held-out accuracy before (right after a resume: the run's own step-0 evaluation
        from metrics.jsonl, not evaluated again); the global step to reach."""
        if task.just_resumed():
            self.before = logged_accuracy(task.run_dir, step=0)
        else:
            self.before = self._held_out_accuracy(task) if task.config.trainer.val_before_train else None
        self.steps = steps
        return task.global_step + steps

    def progress(self, task: Task) -> int:
        return task.global_step

    def show(self, task: Task, end: int) -> None:
        task.ctx.display.start(task.config.algorithm.name.upper(), end, done=end - self.steps)  # the run's own steps

    def step(self, task: Task) -> Step:
        cfg = task.config
        start, fetched = time.perf_counter(), dataclasses.replace(FETCHED)
        if self.async_runner is not None:
            step = self.async_runner.step(task.global_step, task.status.phase)
        else:
            step = Step(task.global_step, next(self.batches), more_prompts=lambda: next(self.batches),
                        balance_dp=cfg.trainer.balance_batch, concurrent=cfg.trainer.concurrent_phases,
                        on_phase=task.status.phase)
            step_program(cfg.algorithm.spec)(step, task.roles, cfg, task.state)
        step.metrics["timing_s/step"] = time.perf_counter() - start
        # What the controller fetched from the workers during the step (controller/futures.py).
        step.metrics["controller/fetched_tensor_bytes"] = float(FETCHED.tensor_bytes - fetched.tensor_bytes)
        step.metrics["controller/fetched_values"] = float(FETCHED.values - fetched.values)
        return step

    def record(self, task: Task, step: Step, before: int, end: int) -> dict[str, float]:
        metrics = self._step_metrics(task, step)
        task.stopped = self.signal.stop_reason(task.global_step, metrics)
        test_freq = task.config.trainer.test_freq
        if test_freq > 0 and task.global_step % test_freq == 0 and task.global_step < end:  # the last: after
            metrics.update(self._val_metrics(task))
        task.ctx.display.step(task.global_step, end, metrics)
        return metrics

    def save_due(self, task: Task, before: int) -> bool:
        freq = task.config.trainer.save_freq
        return freq > 0 and task.global_step % freq == 0

    def root_cause(self, err: WorkerError) -> WorkerError:
        if self.async_runner is not None and not err.died:  # failed anywhere in the loop, e.g. the checkpoint
            return self.async_runner.root_cause(err)
        return err

    def _step_metrics(self, task: Task, step: Step) -> dict[str, float]:
        cfg = task.config
        metrics = dict(step.metrics)
        summary = step.summary if step.summary is not None else BatchSummary.of(step.batch)
        metrics.update(summary.metrics)
        # Every role over the trained batch, each at its own size (metrics.flop_model). Not
        # counted: ReMax's greedy generation and the groups DAPO generated and dropped.
        flops = self.flop_model.step_flops(
            summary.seq_lens, actor_forwards=1 + int(cfg.use_reference), actor_update_epochs=cfg.actor.micro_batch.epochs,
            critic_update_epochs=cfg.critic.micro_batch.epochs,
        )
        metrics.update(throughput_metrics(sum(summary.seq_lens), metrics["timing_s/step"], flops,
                                          self.flop_model.peak_flops))
        return metrics

    def _val_metrics(self, task: Task) -> dict[str, float]:
        """Greedy held-out metrics of the current policy (empty without held-out prompts)."""
        ctx = task.ctx
        if ctx.val_batch is None:
            return {}
        start = time.perf_counter()
        metrics = evaluate(task.roles.actor, ctx.val_batch, ctx.reward, ctx.layout.rollout_groups,
                           task.config.trainer.validation)
        metrics["timing_s/eval"] = time.perf_counter() - start
        return metrics

    def _held_out_accuracy(self, task: Task) -> float | None:
        """Evaluate and log (phase "eval": the loggers print and store it); the accuracy,
        or None without held-out prompts."""
        metrics = self._val_metrics(task)
        if not metrics:
            return None
        task.ctx.log.write("eval", task.global_step, metrics)
        return metrics["val/accuracy"]

    # ------------------------------------------------------------------ checkpoints

    def save(self, task: Task, directory: Path) -> dict[str, Any]:
        trained = self._trained_groups(task)
        for name, group in trained.items():
            group.write_checkpoint(str(directory / name))
        state = {"roles": sorted(trained), "algorithm": task.state.state_dict(), "loader": self.loader.state_dict(),
                 MODEL_KEY: model_record(task.config, task.ctx.model_path), "signal": self.signal.state_dict()}
        if self.async_runner is not None:  # version, seeds' call count, untrained prompts (modes/async_trainer.py)
            state["async"] = self.async_runner.save_state(directory)
        return state

    def load(self, task: Task, checkpoint: Path, state: dict[str, Any]) -> None:
        trained = self._trained_groups(task)
        if sorted(state["roles"]) != sorted(trained):
            raise ValueError(f"checkpoint {str(checkpoint)!r} holds roles {state['roles']}, this run trains "
                             f"{sorted(trained)}; resume with the algorithm the checkpoint was written with")
        for name, group in trained.items():
            group.load_checkpoint(str(role_checkpoint_path(checkpoint, name)))
        self.loader.load_state_dict(state["loader"])
        task.state.load_state_dict(state["algorithm"])
        if "signal" in state:  # adv/no_signal_steps goes on counting as without the stop (older checkpoints: from 0)
            self.signal.load_state_dict(state["signal"])
        if self.async_runner is not None:
            self.async_runner.load_state(state["async"], checkpoint)

    def _trained_groups(self, task: Task) -> dict[str, WorkerGroup]:
        # The roles RL trains; frozen scorers (reward_model, cost_model) are loaded from
        # their paths again on resume.
        trained = task.config.algorithm.spec.trained_roles
        return {name: group for name, group in task.groups.items() if name in trained}

    # ------------------------------------------------------------------ the end

    def finish(self, task: Task, metrics: dict[str, float]) -> TrainResult:
        after = self._held_out_accuracy(task)
        trainer = task.config.trainer
        if trainer.save_final_model:
            task.roles.actor.export_hf(str(task.run_dir / "final_model"))
            write_model_presets(task.run_dir / "final_model", task.config,
                                f"run {task.run_dir} after RL step {task.global_step}")
        result = TrainResult(task.run_dir, task.global_step, self.before, after, metrics, task.stopped)
        if "jsonl" in trainer.loggers:  # the plots of the run so far, from metrics.jsonl
            plot_run(task.run_dir)
        display = task.ctx.display
        if result.accuracy_before is not None and result.accuracy_after is not None:
            gain = 100 * (result.accuracy_after - result.accuracy_before)
            how = "sampled" if trainer.validation.do_sample else "greedy"
            display.message(
                f"[bold]held-out accuracy ({how}): {result.accuracy_before:.1%} before RL -> "
                f"{result.accuracy_after:.1%} after RL ({gain:+.1f} points)[/bold]"
            )
        saved = [name for name, present in (
            ("config.yaml", True), ("metrics.jsonl", "jsonl" in trainer.loggers), ("plots/", "jsonl" in trainer.loggers),
            ("tensorboard/", "tensorboard" in trainer.loggers), ("final_model/", trainer.save_final_model),
        ) if present]
        display.message(f"run saved to [bold]{result.run_dir}[/bold] ({', '.join(saved)})")
        return result


TASK_PARTS.add("language_model", LanguageModelPart)


def _pass_marks(task: Task, prompts: DataProto, sampling: ValidationSection) -> list[bool]:
    """Whether each response of the task's policy to `prompts` (sampled per `sampling`) is right."""
    _, records = evaluate_responses(task.roles.actor, prompts, task.ctx.reward, task.ctx.layout.rollout_groups,
                                    sampling)
    return [record["correct"] for record in records]
