"""`RLTrainer`: the RL loop on the controller.

    from hybridflow import RLTrainer
    from hybridflow.config.schema import load_run_config

    trainer = RLTrainer(load_run_config("examples/grpo_arithmetic.yaml", ["trainer.total_steps=5"]))
    result = trainer.train(steps=5)          # SFT warm start (sft.steps > 0) first, once
    print(result.accuracy_before, result.accuracy_after, result.run_dir)
    trainer.close()

`train` runs `steps` iterations of the configured algorithm (algorithms.py) over batches
of prompts, then evaluates greedily on the held-out prompts and exports the policy. Each
step's metrics go to <run>/metrics.jsonl and the console.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridflow.config.schema import RunConfig, load_run_config
from hybridflow.controller import WorkerGroup
from hybridflow.data import ResumableLoader
from hybridflow.engines.models import load_hf_config
from hybridflow.engines.precision import resolve_dtype
from hybridflow.engines.train.flops import matmul_parameter_count, peak_flops
from hybridflow.trainer.algorithms import ALGORITHMS, build_algo_state
from hybridflow.trainer.evaluate import evaluate
from hybridflow.trainer.metrics import FlopModel, data_metrics, throughput_metrics
from hybridflow.trainer.phases import Roles, Step
from hybridflow.trainer.setup import RunContext, build_groups, endless, rl_roles, train_prompts
from hybridflow.trainer.sft import run_sft
from hybridflow.workers import shutdown_role_groups


@dataclass
class TrainResult:
    """What a `train` call achieved (accuracies are greedy held-out; None without val data)."""

    run_dir: Path
    steps: int
    accuracy_before: float | None
    accuracy_after: float | None
    last_metrics: dict[str, float]


class RLTrainer:
    """Validates the config and creates the run directory at construction; starts the
    workers on the first `train` call. Use as a context manager or call `close()`."""

    def __init__(self, config: RunConfig | str | Path) -> None:
        """`config`: a RunConfig, or the path of a YAML run config."""
        if isinstance(config, (str, Path)):
            config = load_run_config(config)
        if not isinstance(config, RunConfig):
            raise TypeError(f"RLTrainer needs a RunConfig (hybridflow.config.schema) or a YAML path, "
                            f"got {type(config).__name__}")
        self.ctx = RunContext.open(config)
        self.config = self.ctx.cfg  # resolved: as saved in <run>/config.yaml
        self.run_dir = self.ctx.run_dir
        self.global_step = 0
        self.groups: dict[str, WorkerGroup] = {}
        self.roles: Roles | None = None
        self.sft_result = None

    def __enter__(self) -> RLTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers, the reward processes and (if this run started it) Ray."""
        shutdown_role_groups(self.groups)
        self.groups = {}
        self.ctx.close()

    # ------------------------------------------------------------------ setup

    def _start(self) -> None:
        cfg, ctx = self.config, self.ctx
        policy_path = ctx.model_path
        if cfg.sft.steps > 0:
            self.sft_result = run_sft(ctx)
            policy_path = str(self.sft_result.model_dir)
            ctx.display.message(f"SFT warm start: {cfg.sft.steps} steps, loss {self.sft_result.final_loss:.3f}")
        self.groups = build_groups(cfg, ctx.layout, rl_roles(cfg, policy_path))
        self.roles = Roles(actor=self.groups["actor"], critic=self.groups.get("critic"), reward=ctx.reward)
        data = train_prompts(cfg, ctx.tokenizer)
        loader = ResumableLoader(data, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed,
                                 collate_fn=data.collate)
        self.batches = endless(loader)
        self.state = build_algo_state(cfg)
        self.flop_model = _flop_model(cfg, policy_path)

    # ------------------------------------------------------------------ loop

    def train(self, steps: int | None = None) -> TrainResult:
        """Run `steps` RL steps (default trainer.total_steps), evaluating before and after."""
        cfg, ctx = self.config, self.ctx
        steps = cfg.trainer.total_steps if steps is None else steps
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if self.roles is None:
            self._start()
        before = self._held_out_accuracy()
        algorithm = ALGORITHMS[cfg.algorithm.name]
        ctx.display.start(cfg.algorithm.name.upper(), steps)
        metrics: dict[str, float] = {}
        for done in range(1, steps + 1):
            self.global_step += 1
            step = Step(self.global_step, next(self.batches), more_prompts=lambda: next(self.batches))
            start = time.perf_counter()
            algorithm(step, self.roles, cfg, self.state)
            step.metrics["timing_s/step"] = time.perf_counter() - start
            metrics = self._step_metrics(step)
            if self._due(cfg.trainer.test_freq) and done < steps:  # the last step is evaluated below
                metrics.update(self._val_metrics())
            if self._due(cfg.trainer.save_freq):
                self.save_checkpoint()
            ctx.log.write("rl", self.global_step, metrics)
            ctx.display.step(done, steps, metrics)
        ctx.display.stop()
        after = self._held_out_accuracy()
        if cfg.trainer.save_final_model:
            self.roles.actor.export_hf(str(self.run_dir / "final_model"))
        result = TrainResult(self.run_dir, self.global_step, before, after, metrics)
        self._report(result)
        return result

    def _step_metrics(self, step: Step) -> dict[str, float]:
        cfg = self.config
        metrics = dict(step.metrics)
        metrics.update(data_metrics(step.batch))
        ppo = cfg.use_critic
        flops = self.flop_model.step_flops(
            step.batch, forwards=1 + int(cfg.use_reference), critic_forwards=int(ppo),
            actor_update_epochs=cfg.actor.micro_batch.epochs, critic_update_epochs=cfg.critic.micro_batch.epochs * ppo,
        )
        metrics.update(throughput_metrics(step.batch, metrics["timing_s/step"], self.ctx.layout.world_size, flops,
                                          self.flop_model))
        return metrics

    def _due(self, freq: int) -> bool:
        return freq > 0 and self.global_step % freq == 0

    def _val_metrics(self) -> dict[str, float]:
        """Greedy held-out metrics of the current policy (empty without held-out prompts)."""
        ctx = self.ctx
        if ctx.val_batch is None:
            return {}
        start = time.perf_counter()
        metrics = evaluate(self.roles.actor, ctx.val_batch, ctx.reward, ctx.layout.rollout_groups)
        metrics["timing_s/eval"] = time.perf_counter() - start
        return metrics

    def _held_out_accuracy(self) -> float | None:
        """Evaluate, log (phase "eval") and print; the accuracy, or None without held-out prompts."""
        metrics = self._val_metrics()
        if not metrics:
            return None
        self.ctx.log.write("eval", self.global_step, metrics)
        self.ctx.display.message(
            f"step {self.global_step}: held-out accuracy (greedy) {metrics['val/accuracy']:.1%} "
            f"on {int(metrics['val/samples'])} prompts"
        )
        return metrics["val/accuracy"]

    def save_checkpoint(self) -> Path:
        """Actor (and critic) checkpoints plus the loop's own state under <run>/checkpoints."""
        root = self.run_dir / "checkpoints"
        for name, group in self.groups.items():
            group.save_checkpoint(str(root / name))
        state = {"global_step": self.global_step, "algorithm": self.state.state_dict()}
        (root / "trainer_state.json").write_text(json.dumps(state))
        return root

    def _report(self, result: TrainResult) -> None:
        display = self.ctx.display
        if result.accuracy_before is not None and result.accuracy_after is not None:
            gain = 100 * (result.accuracy_after - result.accuracy_before)
            display.message(
                f"[bold]held-out accuracy (greedy): {result.accuracy_before:.1%} before RL -> "
                f"{result.accuracy_after:.1%} after RL ({gain:+.1f} points)[/bold]"
            )
        display.message(f"run saved to [bold]{result.run_dir}[/bold] (config.yaml, metrics.jsonl"
                        f"{', final_model/' if self.config.trainer.save_final_model else ''})")


def _flop_model(cfg: RunConfig, model_path: str) -> FlopModel:
    """Parameter counts from the model config (no weights loaded) and one rank's peak."""
    from transformers import AutoModelForCausalLM

    hf = load_hf_config(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    actor_params = matmul_parameter_count(model)
    critic_params = actor_params - model.lm_head.weight.numel() + hf.hidden_size  # scalar value head
    peak = cfg.actor.peak_flops_per_device
    if peak is None:
        device = "cuda" if cfg.resources.use_gpu else "cpu"
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a CPU rank computes on one thread (one slot = one CPU)
        try:
            peak = peak_flops(resolve_dtype(cfg.actor.dtype, device))
        finally:
            torch.set_num_threads(threads)
    return FlopModel(actor_params, critic_params, hf.num_hidden_layers, hf.hidden_size, peak)
