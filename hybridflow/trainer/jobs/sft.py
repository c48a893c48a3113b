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
from hybridflow.controller import RoleSpec, WorkerGroup
from hybridflow.data import ResumableLoader, SFTDataset
from hybridflow.protocol import DataProto
from hybridflow.trainer.jobs.builtin import teacher_sft_records
from hybridflow.trainer.lm.evaluate import evaluate
from hybridflow.trainer.observe.display import RunDisplay
from hybridflow.trainer.run.lifecycle import SFT_MODEL_DIR
from hybridflow.trainer.run.setup import RunContext, build_groups, endless, sft_actor_config
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
        metrics = actor.update_actor(as_sft_update(next(batches))).meta_info["metrics"]
        return {"sft/loss": metrics["actor/pg_loss"], "sft/grad_norm": metrics["actor/grad_norm"],
                "sft/lr": metrics["actor/lr"]}

    try:
        before = _held_out_accuracy(ctx, actor, 0)
        record = train_steps("sft", cfg.sft.steps, update, partial(_held_out_accuracy, ctx, actor, log=False),
                             cfg.sft.test_freq, ctx.log, ctx.display)
        after = _held_out_accuracy(ctx, actor, cfg.sft.steps)
        model_dir = Path(actor.export_hf(str(ctx.run_dir / SFT_MODEL_DIR))[0])
        write_model_presets(model_dir, cfg, f"run {ctx.run_dir} after {cfg.sft.steps} SFT steps")
    except BaseException:
        shutdown_role_groups(groups)
        raise
    if not keep_actor:
        shutdown_role_groups(groups)
    return SFTResult(model_dir, before, after, record["sft/loss"], actor if keep_actor else None)


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


def run_sft_job(cfg) -> SFTResult:
    """`hybridflow sft`: a run that only fine-tunes (run dir, metrics, <run>/sft_model)."""
    ctx = RunContext.open(cfg)
    try:
        result = run_sft(ctx)
        if result.accuracy_before is not None:
            ctx.display.message(
                f"[bold]held-out accuracy (greedy): {result.accuracy_before:.1%} before SFT -> "
                f"{result.accuracy_after:.1%} after SFT[/bold]"
            )
        ctx.display.message(f"fine-tuned model saved to [bold]{result.model_dir}[/bold]; train from it with "
                            f"`hybridflow train model.path={result.model_dir} sft.steps=0`")
        return result
    finally:
        ctx.close()
