"""Reward-model training on preference pairs (`hybridflow rm`): the Bradley-Terry loss
-log sigmoid(r_chosen - r_rejected) on a `RewardModelWorker` group built trainable.

    result = run_rm_job(load_rm_config("examples/rm_hh_rlhf.yaml"))
    result.accuracy_before, result.accuracy_after      # held-out pairwise accuracy
    result.model_dir                                   # <run>/reward_model, for reward_model.path in PPO
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridflow.algorithms import bradley_terry_loss, pairwise_accuracy
from hybridflow.config.dtypes import resolved_rm_dtype
from hybridflow.config.rm_schema import RMConfig, rm_worker_config, validate_rm_config
from hybridflow.controller import RoleSpec, WorkerGroup, omp
from hybridflow.data import PairwiseDataset, ResumableLoader, load_tokenizer, split_held_out
from hybridflow.data.rl_dataset import pad_token_id_of
from hybridflow.engines.models import load_hf_config
from hybridflow.trainer.jobs.sft import train_steps
from hybridflow.trainer.observe.display import RunDisplay
from hybridflow.trainer.run.lifecycle import BUILTIN_MODEL_DIR, write_builtin_model
from hybridflow.trainer.run.run_dir import MetricsLog, create_run_dir
from hybridflow.trainer.run.setup import endless, start_display, start_run_ray
from hybridflow.workers import PlacementSpec, RewardModelWorker, build_role_groups, shutdown_role_groups


@dataclass
class RMResult:
    """What a reward-model run achieved (accuracies on the held-out pairs)."""

    run_dir: Path
    model_dir: Path | None
    steps: int
    accuracy_before: float
    accuracy_after: float
    final_loss: float


def init_reward_model_dir(model_path: str | Path, out_dir: Path, seed: int) -> Path:
    """A one-label sequence classifier to train: `model_path` itself if it is one, else the
    causal LM with a new score head (initialised from `seed`) saved with its tokenizer in `out_dir`."""
    import transformers

    config = load_hf_config(model_path)
    if any(a.endswith("ForSequenceClassification") for a in config.architectures or []):
        return Path(model_path)  # load_model checks num_labels == 1 when the engine loads it
    tokenizer = load_tokenizer(model_path)
    torch.manual_seed(seed)
    # The score head is missing from a causal-LM checkpoint by design; silence HF's note about it.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            model_path, num_labels=1, dtype="auto", local_files_only=True
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
    # Hugging Face's own forward finds each sequence's last token through pad_token_id.
    if model.config.pad_token_id is None:
        model.config.pad_token_id = pad_token_id_of(tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def pair_data(cfg: RMConfig, tokenizer: Any) -> tuple[PairwiseDataset, PairwiseDataset]:
    """(training pairs, held-out pairs): val_files, or a seeded val_fraction of the training files."""
    data = cfg.data
    train = PairwiseDataset(data.train_files, tokenizer, data.pairs)
    if data.val_files:
        val = PairwiseDataset(data.val_files, tokenizer, data.pairs)
    else:
        train_pos, val_pos = split_held_out(len(train), data.val_fraction, cfg.seed)
        train, val = train.select(train_pos), train.select(val_pos)
    if data.max_val_pairs is not None and len(val) > data.max_val_pairs:
        val = val.select(range(data.max_val_pairs))
    return train, val


def _stats_line(what: str, ds: PairwiseDataset, cfg: RMConfig) -> str:
    s = ds.stats
    return (f"{what}: {s['kept']} of {s['rows']} pairs kept; longer than max_length={cfg.data.pairs.max_length} "
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


def total_steps(cfg: RMConfig, train_pairs: int) -> int:
    if cfg.trainer.total_steps is not None:
        return cfg.trainer.total_steps
    per_epoch = train_pairs // cfg.data.batch_size
    if per_epoch < 1:
        raise ValueError(f"{train_pairs} training pairs are fewer than data.batch_size={cfg.data.batch_size}; "
                         "lower data.batch_size or give more pairs")
    return cfg.trainer.epochs * per_epoch


def _write_scores(path: Path, ds: PairwiseDataset, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(len(ds)):
            handle.write(json.dumps({"index": ds[i]["index"], "chosen_score": float(chosen[i]),
                                     "rejected_score": float(rejected[i])}) + "\n")


def run_rm_job(cfg: RMConfig) -> RMResult:
    """Validate, set up the run directory, train, evaluate before and after, export."""
    world = validate_rm_config(cfg)
    # engine.dtype auto resolved here (as `hybridflow train` does), so config.yaml says what ran
    cfg, dtype_line = resolved_rm_dtype(cfg, cfg.resources.resolved_threads_per_rank(world))
    omp_auto = cfg.resources.omp_wait_policy == "auto"
    cfg = dataclasses.replace(cfg, resources=dataclasses.replace(
        cfg.resources, omp_wait_policy=omp.resolve(cfg.resources.omp_wait_policy)))
    run_dir = create_run_dir(cfg)
    display = start_display(cfg.trainer.console, run_dir, dtype_line, cfg.resources, omp_auto)
    log = MetricsLog(run_dir / "metrics.jsonl")
    ray_hold = None
    groups: dict[str, WorkerGroup] = {}
    try:
        base = cfg.model.path
        if base is None:
            base = str(write_builtin_model(cfg.model.builtin, run_dir / BUILTIN_MODEL_DIR, cfg.seed))
        model_path = init_reward_model_dir(base, run_dir / "init_reward_model", cfg.seed)
        tokenizer = load_tokenizer(model_path)
        train, val = pair_data(cfg, tokenizer)
        display.message(_stats_line("train pairs", train, cfg))
        if cfg.data.val_files:
            display.message(_stats_line("held-out pairs", val, cfg))
        display.message(f"{len(train)} pairs for training, {len(val)} held out")
        steps = total_steps(cfg, len(train))
        threads = cfg.resources.resolved_threads_per_rank(world)
        ray_hold = start_run_ray(cfg.resources, world * threads)
        ray_hold.use()
        role = RoleSpec(RewardModelWorker, (rm_worker_config(cfg, str(model_path)),), {"trainable": True})
        groups = build_role_groups({"rm": role}, PlacementSpec.colocated(cfg.resources.process_on_nodes(),
                                                                         use_gpu=cfg.resources.use_gpu,
                                                                         cpus_per_slot=threads))
        group = groups["rm"]
        group.init_model()
        return _train(cfg, group, train, val, steps, run_dir, log, display)
    finally:
        display.stop()
        shutdown_role_groups(groups)
        log.close()
        if ray_hold is not None:
            ray_hold.close()


def _evaluate(cfg: RMConfig, group: WorkerGroup, val: PairwiseDataset, step: int,
              log: MetricsLog) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
    chosen, rejected = score_pairs(group, val, cfg.data.eval_batch_size)
    loss, bt = bradley_terry_loss(chosen, rejected)
    metrics = {"val/accuracy": pairwise_accuracy(chosen, rejected), "val/loss": float(loss),
               "val/margin": float(bt["margin"]), "val/pairs": float(len(chosen))}
    log.write("rm_eval", step, metrics)
    return metrics, chosen, rejected


def _train(cfg: RMConfig, group: WorkerGroup, train: PairwiseDataset, val: PairwiseDataset, steps: int,
           run_dir: Path, log: MetricsLog, display: RunDisplay) -> RMResult:
    before, _, _ = _evaluate(cfg, group, val, 0, log)
    batches = endless(ResumableLoader(train, cfg.data.batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed,
                                      collate_fn=train.collate))
    record = train_steps("rm", steps, lambda: dict(group.update_reward_model(next(batches)).meta_info["metrics"]),
                         lambda step: _evaluate(cfg, group, val, step, log)[0]["val/accuracy"],
                         cfg.trainer.eval_freq, log, display)
    after, chosen, rejected = _evaluate(cfg, group, val, steps, log)
    _write_scores(run_dir / "held_out_scores.jsonl", val, chosen, rejected)
    display.message(f"[bold]held-out pairwise accuracy: {before['val/accuracy']:.1%} before -> "
                    f"{after['val/accuracy']:.1%} after {steps} steps[/bold] ({len(val)} pairs)")
    model_dir = None
    if cfg.trainer.save_model:
        model_dir = Path(group.export_hf(str(run_dir / "reward_model"))[0])
        display.message(f"reward model saved to [bold]{model_dir}[/bold]; score PPO rollouts with it: "
                        f"reward_model.path={model_dir}")
    return RMResult(run_dir, model_dir, steps, before["val/accuracy"], after["val/accuracy"], record["rm/loss"])
