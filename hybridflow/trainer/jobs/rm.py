"""Reward-model training on preference pairs (`hybridflow rm`): the Bradley-Terry loss
-log sigmoid(r_chosen - r_rejected) on a `RewardModelWorker` group built trainable.

    result = run_rm_job(load_rm_config("examples/rm_hh_rlhf.yaml"))
    result.accuracy_before, result.accuracy_after      # held-out pairwise accuracy
    result.model_dir                                   # <run>/reward_model, for reward_model.path in PPO
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridflow.algorithms import bradley_terry_loss, pairwise_accuracy
from hybridflow.config.dtypes import resolved_rm_dtype
from hybridflow.config.rm_schema import resolve_rm_config, rm_worker_config, validate_rm_config
from hybridflow.config.schema import RunConfig
from hybridflow.config.tasks import TASK_KINDS
from hybridflow.controller import RayHold, RoleSpec, WorkerGroup
from hybridflow.data import PairwiseDataset, ResumableLoader, load_tokenizer, split_held_out
from hybridflow.data.rl_dataset import pad_token_id_of
from hybridflow.engines.models import load_hf_config
from hybridflow.trainer.observe.display import RunDisplay
from hybridflow.trainer.observe.loggers import RunLoggers, build_loggers
from hybridflow.trainer.programs.phases import Roles, Step
from hybridflow.trainer.run.checkpointing import SavedRun, logged_accuracy, reopen_run_dir
from hybridflow.trainer.run.elastic import restart_config
from hybridflow.trainer.run.lifecycle import (
    BUILTIN_MODEL_DIR,
    ResumePoint,
    check_steps_left,
    job_resume_point,
    write_builtin_model,
)
from hybridflow.trainer.run.preflight import check_model_dir
from hybridflow.trainer.run.run_dir import create_run_dir
from hybridflow.trainer.run.setup import endless, start_display, start_run_ray
from hybridflow.trainer.task import TASK_PARTS, Task
from hybridflow.workers import PlacementSpec, RewardModelWorker, build_role_groups


@dataclass
class RMResult:
    """What a reward-model run achieved (accuracies on the held-out pairs)."""

    run_dir: Path
    model_dir: Path | None
    steps: int
    accuracy_before: float
    accuracy_after: float
    final_loss: float


def init_reward_model_dir(model_path: str | Path, out_dir: Path, seed: int, trust_remote_code: bool) -> Path:
    """A one-label sequence classifier to train: `model_path` itself if it is one, else the
    causal LM with a new score head (initialised from `seed`) saved with its tokenizer in `out_dir`."""
    import transformers

    config = load_hf_config(model_path, trust_remote_code=trust_remote_code)
    if any(a.endswith("ForSequenceClassification") for a in config.architectures or []):
        return Path(model_path)  # load_model checks num_labels == 1 when the engine loads it
    tokenizer = load_tokenizer(model_path, trust_remote_code=trust_remote_code)
    torch.manual_seed(seed)
    # The score head is missing from a causal-LM checkpoint by design; silence HF's note about it.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            model_path, num_labels=1, dtype="auto", local_files_only=True, trust_remote_code=trust_remote_code
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
    # Hugging Face's own forward finds each sequence's last token through pad_token_id.
    if model.config.pad_token_id is None:
        model.config.pad_token_id = pad_token_id_of(tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def pair_data(cfg: RunConfig, tokenizer: Any) -> tuple[PairwiseDataset, PairwiseDataset]:
    """(training pairs, held-out pairs): val_files, or a seeded val_fraction of the training files."""
    data = cfg.rm.data
    train = PairwiseDataset(data.train_files, tokenizer, data.pairs)
    if data.val_files:
        val = PairwiseDataset(data.val_files, tokenizer, data.pairs)
    else:
        train_pos, val_pos = split_held_out(len(train), data.val_fraction, cfg.seed)
        train, val = train.select(train_pos), train.select(val_pos)
    if data.max_val_pairs is not None and len(val) > data.max_val_pairs:
        val = val.select(range(data.max_val_pairs))
    return train, val


def _stats_line(what: str, ds: PairwiseDataset, cfg: RunConfig) -> str:
    s = ds.stats
    return (f"{what}: {s['kept']} of {s['rows']} pairs kept; longer than max_length={cfg.rm.data.pairs.max_length} "
            f"tokens: {s['filtered_overlong']} filtered, {s['truncated']} truncated")


def score_pairs(group: WorkerGroup, ds: PairwiseDataset, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) scores [N] of every pair of `ds`, scored `batch_size` pairs per call."""
    chosen, rejected = [], []
    for start in range(0, len(ds), batch_size):
        batch = ds.collate([ds[i] for i in range(start, min(start + batch_size, len(ds)))])
        out = group.compute_pair_scores(batch)
        chosen.append(out.batch["chosen_scores"])
        rejected.append(out.batch["rejected_scores"])
    return torch.cat(chosen), torch.cat(rejected)


def total_steps(cfg: RunConfig, train_pairs: int) -> int:
    rm = cfg.rm
    if rm.total_steps is not None:
        return rm.total_steps
    per_epoch = train_pairs // rm.data.batch_size
    if per_epoch < 1:
        raise ValueError(f"{train_pairs} training pairs are fewer than rm.data.batch_size={rm.data.batch_size}; "
                         "lower rm.data.batch_size or give more pairs")
    return rm.epochs * per_epoch


def _write_scores(path: Path, ds: PairwiseDataset, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(len(ds)):
            handle.write(json.dumps({"index": ds[i]["index"], "chosen_score": float(chosen[i]),
                                     "rejected_score": float(rejected[i])}) + "\n")


RM_EXPORTS = ("reward_model", "held_out_scores.jsonl")  # what a run writes at its end (a resume sets them aside)


@dataclass
class RMContext:
    """A reward-model run's directory, loggers, console and hold on Ray (the `ctx` of its Task)."""

    cfg: RunConfig
    run_dir: Path
    log: RunLoggers
    display: RunDisplay
    ray: RayHold

    @classmethod
    def open(cls, cfg: RunConfig, resume_from: Path | SavedRun | None = None, ray: RayHold | None = None) -> RMContext:
        world = validate_rm_config(cfg)
        threads = cfg.resources.resolved_threads_per_rank(world)
        _, dtype_line = resolved_rm_dtype(cfg, threads)  # what "auto" became, said at the start
        omp_auto = cfg.resources.omp_wait_policy == "auto"
        cfg = resolve_rm_config(cfg)
        if cfg.model.path is not None:  # before the run directory: refused in one line
            check_model_dir(cfg.model.path, "model.path", tokenizer=True,
                            trust_remote_code=cfg.model.trust_remote_code)
        run_dir = create_run_dir(cfg) if resume_from is None else reopen_run_dir(cfg, resume_from, (), RM_EXPORTS)
        display = start_display(cfg.trainer.display_mode(), run_dir, dtype_line, cfg.resources, omp_auto)
        log = build_loggers(cfg, run_dir, display)
        return cls(cfg, run_dir, log, display, start_run_ray(cfg.resources, world * threads, ray))

    def reopen(self, checkpoint: Path, cfg: RunConfig) -> RMContext:
        self.close(keep_ray=True)
        return RMContext.open(cfg, checkpoint, self.ray)

    def close(self, keep_ray: bool = False) -> None:
        self.display.stop()
        self.log.close()
        if not keep_ray:
            self.ray.close()


# What a resumed `hybridflow rm` may change: the name, trainer.* and resources.* (as an RL run),
# and how long and how often (rm.total_steps, epochs, eval_freq, save_model: trainer.* keys before).
RM_RESUMABLE_CHANGES = ("name", "trainer.", "resources.", "rm.total_steps", "rm.epochs", "rm.eval_freq",
                        "rm.save_model")


class RewardModelPart:
    """One Bradley-Terry update a step; held-out pairwise accuracy before, every
    rm.eval_freq steps and after; the export to <run>/reward_model."""

    unit, phase, checkpoint_kind = "step", "rm", "rm"

    def resume_point(self, resume: Any, config: Any) -> ResumePoint:
        return job_resume_point(TASK_KINDS["reward_model"], self.checkpoint_kind, resume, config, RM_RESUMABLE_CHANGES)

    def open(self, cfg: RunConfig, resume_from: SavedRun | None) -> RMContext:
        return RMContext.open(cfg, resume_from)

    def restart_config(self, cfg: RunConfig, lost_node: str | None) -> RunConfig:
        return restart_config(cfg, lost_node, validate_rm_config)

    def start(self, task: Task) -> None:
        cfg, ctx, run_dir = task.config, task.ctx, task.run_dir
        ctx.ray.use()
        base = cfg.model.path
        if base is None:
            base = str(write_builtin_model(cfg.model.builtin, run_dir / BUILTIN_MODEL_DIR, cfg.seed))
        init_dir = run_dir / "init_reward_model"
        trust = cfg.model.trust_remote_code
        self.model_path = init_dir if (init_dir / "config.json").is_file() else init_reward_model_dir(
            base, init_dir, cfg.seed, trust)
        tokenizer = load_tokenizer(self.model_path, trust_remote_code=trust)
        self.train_pairs, self.val = pair_data(cfg, tokenizer)
        if task.resumed_from is None:  # said once, at the run's first start
            ctx.display.message(_stats_line("train pairs", self.train_pairs, cfg))
            if cfg.rm.data.val_files:
                ctx.display.message(_stats_line("held-out pairs", self.val, cfg))
            ctx.display.message(f"{len(self.train_pairs)} pairs for training, {len(self.val)} held out")
        self.total = total_steps(cfg, len(self.train_pairs))
        world = cfg.resources.resolved_world_size()
        threads = cfg.resources.resolved_threads_per_rank(world)
        role = RoleSpec(RewardModelWorker, (rm_worker_config(cfg, str(self.model_path)),), {"trainable": True})
        task.groups = build_role_groups({"rm": role}, PlacementSpec.colocated(
            cfg.resources.process_on_nodes(), use_gpu=cfg.resources.use_gpu, cpus_per_slot=threads))
        group = task.groups["rm"]
        group.call_timeout_s = cfg.trainer.call_timeout_s
        group.init_model()
        task.roles = Roles(reward_model=group)
        self.loader = ResumableLoader(self.train_pairs, cfg.rm.data.batch_size, shuffle=cfg.rm.data.shuffle,
                                      seed=cfg.seed, collate_fn=self.train_pairs.collate)
        self.batches = endless(self.loader)

    def release(self, task: Task) -> None:
        pass

    def steps_left(self, task: Task) -> int:
        task.setup()  # the number of steps depends on the pairs
        return check_steps_left(task.global_step, self.total, "rm.total_steps")

    def begin(self, task: Task, steps: int) -> int:
        """The held-out accuracy before (right after a resume: the run's own step-0 record)."""
        logged = logged_accuracy(task.run_dir, 0, "rm_eval") if task.just_resumed() else None
        self.before = logged if logged is not None else self._evaluate(task, task.global_step)[0]["val/accuracy"]
        self.steps = steps
        return task.global_step + steps

    def progress(self, task: Task) -> int:
        return task.global_step

    def show(self, task: Task, end: int) -> None:
        task.ctx.display.start("RM", self.steps)

    def step(self, task: Task) -> Step:
        step = Step(task.global_step, next(self.batches), on_phase=task.status.phase)
        task.status.phase("update_reward_model")  # what `hybridflow monitor` shows and profiles
        start = time.perf_counter()
        step.metrics.update(task.roles.reward_model.update_reward_model(step.batch).meta_info["metrics"])
        step.metrics["timing_s/step"] = time.perf_counter() - start
        return step

    def record(self, task: Task, step: Step, before: int, end: int) -> dict[str, float]:
        record, freq = dict(step.metrics), task.config.rm.eval_freq
        if freq and task.global_step % freq == 0 and task.global_step < end:
            record["val/accuracy"] = self._evaluate(task, task.global_step)[0]["val/accuracy"]
        task.ctx.display.step(self.steps - (end - task.global_step), self.steps,
                              {"actor/loss": record["rm/loss"], **record})
        return record

    def save_due(self, task: Task, before: int) -> bool:
        freq = task.config.trainer.save_freq
        return freq > 0 and task.global_step % freq == 0

    def save(self, task: Task, directory: Path) -> dict[str, Any]:
        task.roles.reward_model.write_checkpoint(str(directory / "rm"))
        return {"roles": ["rm"], "loader": self.loader.state_dict()}

    def load(self, task: Task, checkpoint: Path, state: dict[str, Any]) -> None:
        task.roles.reward_model.load_checkpoint(str(checkpoint / "rm"))
        self.loader.load_state_dict(state["loader"])

    def _evaluate(self, task: Task, step: int) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
        chosen, rejected = score_pairs(task.roles.reward_model, self.val, task.config.rm.data.eval_batch_size)
        loss, bt = bradley_terry_loss(chosen, rejected)
        metrics = {"val/accuracy": pairwise_accuracy(chosen, rejected), "val/loss": float(loss),
                   "val/margin": float(bt["margin"]), "val/pairs": float(len(chosen))}
        task.ctx.log.write("rm_eval", step, metrics)
        return metrics, chosen, rejected

    def finish(self, task: Task, record: dict[str, float]) -> RMResult:
        run_dir, display, steps = task.run_dir, task.ctx.display, task.global_step
        after, chosen, rejected = self._evaluate(task, steps)
        _write_scores(run_dir / "held_out_scores.jsonl", self.val, chosen, rejected)
        display.message(f"[bold]held-out pairwise accuracy: {self.before:.1%} before -> "
                        f"{after['val/accuracy']:.1%} after {steps} steps[/bold] ({len(self.val)} pairs)")
        model_dir = None
        if task.config.rm.save_model:
            model_dir = Path(task.roles.reward_model.export_hf(str(run_dir / "reward_model"))[0])
            display.message(f"reward model saved to [bold]{model_dir}[/bold]; score PPO rollouts with it: "
                            f"reward_model.path={model_dir}")
        return RMResult(run_dir, model_dir, steps, self.before, after["val/accuracy"],
                        record["rm/loss"])


TASK_PARTS.add("reward_model", RewardModelPart)


def run_rm_job(cfg: RunConfig, resume: Any = None) -> RMResult:
    """Train the reward model of `cfg` (a reward-model run's config, rm_schema.py) to the end;
    `resume` continues a stopped run (Task: a run or checkpoint directory, a SavedRun, True)."""
    task = Task(TASK_KINDS["reward_model"], cfg, resume=resume)
    try:
        return task.train()
    finally:
        task.close()
