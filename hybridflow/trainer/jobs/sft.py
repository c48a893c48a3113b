"""Supervised fine-tuning on prompt/response pairs (`hybridflow sft`, and the warm start
before RL when sft.steps > 0).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from hybridflow.config.model_presets import write_model_presets
from hybridflow.config.tasks import TASK_KINDS
from hybridflow.controller import CallTimeoutError, RoleSpec, WorkerError, WorkerGroup
from hybridflow.data import ResumableLoader, SFTDataset
from hybridflow.protocol import DataProto
from hybridflow.trainer.jobs.builtin import teacher_sft_records
from hybridflow.trainer.lm.evaluate import evaluate
from hybridflow.trainer.observe.display import RunDisplay
from hybridflow.trainer.programs.phases import Roles, Step
from hybridflow.trainer.run.elastic import restart_config
from hybridflow.trainer.run.checkpointing import logged_accuracy
from hybridflow.trainer.run.lifecycle import (
    RESUMABLE_CHANGES,
    SFT_MODEL_DIR,
    ResumePoint,
    check_steps_left,
    job_resume_point,
)
from hybridflow.trainer.run.setup import RunContext, build_groups, endless, sft_actor_config
from hybridflow.trainer.task import TASK_PARTS, Task
from hybridflow.workers import ActorRolloutRefWorker, shutdown_role_groups


@dataclass
class SFTResult:
    model_dir: Path
    accuracy_before: float | None
    accuracy_after: float | None
    final_loss: float
    actor: WorkerGroup | None = None  # the SFT actor's group when run_sft(keep_actor=True)


def sft_pairs(ctx: RunContext) -> SFTDataset:
    cfg = ctx.cfg
    if cfg.sft.files:
        return SFTDataset(cfg.sft.files, ctx.tokenizer, cfg.sft.data)
    # (sft.files empty with data.train_files set is refused by validate_run_config: _check_sft)
    rows = teacher_sft_records(cfg.data.builtin.task, cfg.sft.num_builtin_pairs, cfg.sft.builtin_carry_drop_rate,
                               cfg.seed)
    return SFTDataset(None, ctx.tokenizer, cfg.sft.data, rows=rows)


def as_sft_update(batch: DataProto) -> DataProto:
    """An SFT batch as a policy-gradient batch whose loss is the response NLL (module docstring)."""
    mask = batch.batch["response_mask"]
    tensors = {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")}
    tensors["advantages"] = mask.to(torch.float32)
    tensors["old_log_probs"] = torch.zeros(mask.shape, dtype=torch.float32)
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def run_sft(ctx: RunContext, keep_actor: bool = False) -> SFTResult:
    """ctx.cfg.sft.steps optimizer steps from ctx.model_path; exports <run>/sft_model.

    `keep_actor`: leave the actor's workers running and return their group (the RL warm
    start rebuilds the RL actor in them instead of starting new processes); the caller
    then shuts it down."""
    cfg = ctx.cfg
    if cfg.sft.steps < 1:
        raise ValueError("sft.steps must be >= 1 to run supervised fine-tuning")
    data = sft_pairs(ctx)
    batches = endless(ResumableLoader(data, cfg.sft.batch_size, seed=cfg.seed, collate_fn=data.collate))
    roles = {"actor": RoleSpec(ActorRolloutRefWorker, (sft_actor_config(cfg, ctx.model_path),))}
    groups = build_groups(cfg, ctx.layout, roles)
    actor = groups["actor"]

    def update() -> dict[str, float]:
        return _sft_metrics(actor.update_actor(as_sft_update(next(batches))))

    try:
        before = _held_out_accuracy(ctx, actor, 0)
        record = train_steps("sft", cfg.sft.steps, update, partial(_held_out_accuracy, ctx, actor, log=False),
                             cfg.sft.test_freq, ctx.log, ctx.display)
        after = _held_out_accuracy(ctx, actor, cfg.sft.steps)
        model_dir = Path(actor.export_hf(str(ctx.run_dir / SFT_MODEL_DIR))[0])
        write_model_presets(model_dir, cfg, f"run {ctx.run_dir} after {cfg.sft.steps} SFT steps")
    except BaseException as err:
        shutdown_role_groups(groups)
        if isinstance(err, WorkerError) and (err.died or isinstance(err, CallTimeoutError)):
            raise _not_restarted(err) from err
        raise
    if not keep_actor:
        shutdown_role_groups(groups)
    return SFTResult(model_dir, before, after, record["sft/loss"], actor if keep_actor else None)


def _not_restarted(err: WorkerError) -> WorkerError:
    """A lost or hung rank of the warm start in one line with what to do: it saves nothing before
    its last step, so there is no checkpoint to resume from and it is not restarted (`hybridflow
    sft`, SFTPart, checkpoints and restarts)."""
    how = "died (its process or node was lost)" if err.died else "did not finish within trainer.call_timeout_s"
    return WorkerError(f"{err.role} rank {err.rank} (node {err.node}, pid {err.pid}) {how} in {err.method} during "
                       "the SFT warm start, which saves nothing before its last step: run the same command again "
                       f"once node {err.node} is back, or on fewer nodes (resources.nodes)", role=err.role, rank=err.rank,
                       node=err.node, pid=err.pid, method=err.method, died=err.died,
                       remote_traceback=err.remote_traceback)


def _sft_metrics(out: DataProto) -> dict[str, float]:
    metrics = out.meta_info["metrics"]
    return {"sft/loss": metrics["actor/pg_loss"], "sft/grad_norm": metrics["actor/grad_norm"],
            "sft/lr": metrics["actor/lr"]}


def train_steps(phase: str, steps: int, update: Callable[[], dict[str, float]],
                accuracy_at: Callable[[int], float | None], eval_freq: int, log: Any,
                display: RunDisplay) -> dict[str, float]:
    """The training loop of SFT and of the reward model (`phase` "sft" or "rm"): `steps` calls of
    `update` (its metrics, timed), logged and shown; every `eval_freq` steps but the last (0: never)
    with the held-out accuracy `accuracy_at(step)` (None: no held-out data). Returns the last record."""
    display.start(phase.upper(), steps)
    record: dict[str, float] = {}
    for step in range(1, steps + 1):
        start = time.perf_counter()
        record = update()
        record["timing_s/step"] = time.perf_counter() - start
        if eval_freq and step % eval_freq == 0 and step < steps:
            accuracy = accuracy_at(step)
            if accuracy is not None:
                record["val/accuracy"] = accuracy
        log.write(phase, step, record)
        display.step(step, steps, {"actor/loss": record[f"{phase}/loss"], **record})
    display.stop()
    return record


def _held_out_accuracy(ctx: RunContext, actor: WorkerGroup, step: int, log: bool = True) -> float | None:
    """Greedy held-out accuracy (None without held-out prompts); logged as phase "sft_eval"."""
    if ctx.val_batch is None:
        return None
    metrics = evaluate(actor, ctx.val_batch, ctx.reward, ctx.layout.rollout_groups)
    if log:
        ctx.log.write("sft_eval", step, metrics)
    return metrics["val/accuracy"]


# What a resumed `hybridflow sft` may change: what an RL run may (lifecycle.py), and how many
# fine-tuning steps there are and how often it evaluates (its trainer.total_steps and test_freq).
SFT_RESUMABLE_CHANGES = (*RESUMABLE_CHANGES, "sft.steps", "sft.test_freq")


class SFTPart:
    """`hybridflow sft` as a part of the one lifecycle (trainer/task.py): one fine-tuning step a
    step (`update_actor` on an SFT batch), held-out accuracy before, every sft.test_freq steps
    and after, the export to <run>/sft_model; checkpoints every trainer.save_freq steps, from
    which a failed worker restarts (trainer.max_restarts) and `hybridflow sft --resume` continues."""

    unit, phase, checkpoint_kind = "step", "sft", "sft"

    def resume_point(self, resume: Any, config: Any) -> ResumePoint:
        return job_resume_point(TASK_KINDS["language_model"], self.checkpoint_kind, resume, config,
                                SFT_RESUMABLE_CHANGES)

    def open(self, cfg: Any, resume_from: Any) -> RunContext:
        # Its own "sft" steps are cut too, and an earlier attempt's <run>/sft_model set aside.
        return RunContext.open(cfg, resume_from=resume_from, keep_phases=(), exports=(SFT_MODEL_DIR,))

    def restart_config(self, cfg: Any, lost_node: str | None) -> Any:
        return restart_config(cfg, lost_node)

    def start(self, task: Task) -> None:
        cfg, ctx = task.config, task.ctx
        ctx.ray.use()
        data = sft_pairs(ctx)
        self.loader = ResumableLoader(data, cfg.sft.batch_size, seed=cfg.seed, collate_fn=data.collate)
        self.batches = endless(self.loader)
        roles = {"actor": RoleSpec(ActorRolloutRefWorker, (sft_actor_config(cfg, ctx.model_path),))}
        task.groups = build_groups(cfg, ctx.layout, roles)
        task.roles = Roles(actor=task.groups["actor"])

    def release(self, task: Task) -> None:
        pass

    def steps_left(self, task: Task) -> int:
        return check_steps_left(task.global_step, task.config.sft.steps, "sft.steps")

    def begin(self, task: Task, steps: int) -> int:
        """The held-out accuracy before (right after a resume: the run's own step-0 record)."""
        self.before = (logged_accuracy(task.run_dir, 0, "sft_eval") if task.just_resumed()
                       else _held_out_accuracy(task.ctx, task.roles.actor, task.global_step))
        self.steps = steps
        return task.global_step + steps

    def progress(self, task: Task) -> int:
        return task.global_step

    def show(self, task: Task, end: int) -> None:
        task.ctx.display.start("SFT", self.steps)

    def step(self, task: Task) -> Step:
        step = Step(task.global_step, as_sft_update(next(self.batches)), on_phase=task.status.phase)
        task.status.phase("update_actor")  # what `hybridflow monitor` shows and profiles
        start = time.perf_counter()
        step.metrics.update(_sft_metrics(task.roles.actor.update_actor(step.batch)))
        step.metrics["timing_s/step"] = time.perf_counter() - start
        return step

    def record(self, task: Task, step: Step, before: int, end: int) -> dict[str, float]:
        record, freq = dict(step.metrics), task.config.sft.test_freq
        if freq and task.global_step % freq == 0 and task.global_step < end:
            accuracy = _held_out_accuracy(task.ctx, task.roles.actor, task.global_step, log=False)
            if accuracy is not None:
                record["val/accuracy"] = accuracy
        task.ctx.display.step(self.steps - (end - task.global_step), self.steps,
                              {"actor/loss": record["sft/loss"], **record})
        return record

    def save_due(self, task: Task, before: int) -> bool:
        freq = task.config.trainer.save_freq
        return freq > 0 and task.global_step % freq == 0

    def save(self, task: Task, directory: Path) -> dict[str, Any]:
        task.roles.actor.write_checkpoint(str(directory / "actor"))
        return {"roles": ["actor"], "loader": self.loader.state_dict()}

    def load(self, task: Task, checkpoint: Path, state: dict[str, Any]) -> None:
        task.roles.actor.load_checkpoint(str(checkpoint / "actor"))
        self.loader.load_state_dict(state["loader"])

    def finish(self, task: Task, record: dict[str, float]) -> SFTResult:
        ctx, cfg, actor = task.ctx, task.config, task.roles.actor
        after = _held_out_accuracy(ctx, actor, task.global_step)
        model_dir = Path(actor.export_hf(str(task.run_dir / SFT_MODEL_DIR))[0])
        write_model_presets(model_dir, cfg, f"run {task.run_dir} after {task.global_step} SFT steps")
        if self.before is not None:
            ctx.display.message(f"[bold]held-out accuracy (greedy): {self.before:.1%} before SFT -> "
                                f"{after:.1%} after SFT[/bold]")
        ctx.display.message(f"fine-tuned model saved to [bold]{model_dir}[/bold]; train from it with "
                            f"`hybridflow train model.path={model_dir} sft.steps=0`")
        return SFTResult(model_dir, self.before, after, record["sft/loss"])


TASK_PARTS.add("sft", SFTPart)


def run_sft_job(cfg: Any, resume: Any = None) -> SFTResult:
    """`hybridflow sft`: a run that only fine-tunes (run dir, metrics, <run>/sft_model);
    `resume` continues a stopped one (Task: a run or checkpoint directory, a SavedRun, True)."""
    task = Task(TASK_KINDS["language_model"], cfg, resume=resume, part="sft")
    try:
        return task.train()
    finally:
        task.close()
