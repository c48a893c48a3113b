"""One timed training run of TRL's GRPOTrainer or of hybridflow, for bench_vs_trl.py.

bench_vs_trl.py starts this file as a subprocess per run, so every run has its own
process tree (its peak memory is measured from outside) and its own allocator:

    .venv/bin/python benchmarks/rl/vs_trl_runs.py SPEC.json RESULT.json

SPEC.json (written by bench_vs_trl.py) names the system ("trl" or "hybridflow"), the
model directory, the prompt file (verl rows: prompt messages, data_source,
reward_model.ground_truth), prompts per step, samples per prompt, lengths, temperature,
learning rate, dtype, steps and the thread layout. RESULT.json gets one record per
optimizer step: wall-clock end time, the system's own step timer, the phase split, and
prompt/completion token counts (TRL's count: non-pad prompt tokens + completion tokens
up to and including EOS, over all samples of the step).

`compute_score` is the reward both systems call: hybridflow loads this file as
reward.custom_fn_path (its reward worker processes import it, so the module level stays
stdlib-only), TRL calls it through `trl_reward`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """The rule reward of both systems: exact answer for the arithmetic task; the last
    number of the response for GSM8K (a small model almost never writes '####')."""
    from hybridflow.rewards import arithmetic, gsm8k

    if data_source == "arithmetic":
        return arithmetic.compute_score(solution_str, ground_truth)
    if data_source in ("openai/gsm8k", "gsm8k"):
        return gsm8k.compute_score(solution_str, ground_truth, method="flexible")
    raise ValueError(f"no scorer for data_source {data_source!r} in this benchmark")


def trl_reward(prompts: list, completions: list, ground_truth: list, data_source: list, **_: Any) -> list[float]:
    """TRL's reward-function signature around `compute_score` (conversational completions)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [compute_score(d, t, g) for d, t, g in zip(data_source, texts, ground_truth, strict=True)]


def read_rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ----------------------------------------------------------------------------- TRL


def run_trl(spec: dict) -> dict:
    """spec["steps"] GRPO steps of TRL's GRPOTrainer; per-step records from a callback and
    timers around its generation, reward, loss and training-step methods."""
    import torch

    torch.set_num_threads(spec["threads"])
    t_import = time.perf_counter()
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import_s = time.perf_counter() - t_import
    rows = read_rows(spec["prompts_file"])
    ds = datasets.Dataset.from_list([
        {"prompt": r["prompt"], "ground_truth": str(r["reward_model"]["ground_truth"]), "data_source": r["data_source"]}
        for r in rows
    ])
    phases: dict[str, float] = {}
    tokens = {"prompt": 0, "completion": 0, "samples": 0}

    def add(name: str, seconds: float) -> None:
        phases[name] = phases.get(name, 0.0) + seconds

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with wall-clock timers around the methods a step is made of."""

        def _generate(self, prompts: list):
            start = time.perf_counter()
            out = super()._generate(prompts)
            add("gen", time.perf_counter() - start)
            prompt_ids, completion_ids = out[0], out[1]
            tokens["prompt"] += sum(len(p) for p in prompt_ids)
            tokens["completion"] += sum(len(c) for c in completion_ids)
            tokens["samples"] += len(completion_ids)
            return out

        def _calculate_rewards(self, *args: Any, **kwargs: Any):
            start = time.perf_counter()
            out = super()._calculate_rewards(*args, **kwargs)
            add("reward", time.perf_counter() - start)
            return out

        def _generate_and_score_completions(self, inputs: Any):
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            add("rollout_total", time.perf_counter() - start)
            return out

        def compute_loss(self, *args: Any, **kwargs: Any):
            start = time.perf_counter()
            out = super().compute_loss(*args, **kwargs)
            add("loss_forward", time.perf_counter() - start)
            return out

        def training_step(self, *args: Any, **kwargs: Any):
            start = time.perf_counter()
            out = super().training_step(*args, **kwargs)
            add("training_step", time.perf_counter() - start)
            marks["after_training_step"] = time.perf_counter()
            return out

    marks: dict[str, float] = {}
    records: list[dict] = []

    class StepRecorder(TrainerCallback):
        """One record per optimizer step; the optimizer phase is clip + step + schedule + zero_grad."""

        def on_step_begin(self, args, state, control, **kwargs):
            marks["begin"] = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            marks["pre_opt"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            p = dict(phases)
            split = {
                "gen": p.get("gen", 0.0),
                "reward": p.get("reward", 0.0),
                "old_log_prob": 0.0,  # TRL computes none at num_iterations=1
                "rollout_other": p.get("rollout_total", 0.0) - p.get("gen", 0.0) - p.get("reward", 0.0),
                "update_forward": p.get("loss_forward", 0.0),
                # training_step = _prepare_inputs (the rollout) + compute_loss + backward
                "update_backward": (p.get("training_step", 0.0) - p.get("rollout_total", 0.0)
                                    - p.get("loss_forward", 0.0)),
                "update_optimizer": now - marks["after_training_step"],
                "clip_grad": marks["pre_opt"] - marks["after_training_step"],
            }
            split["update"] = split["update_forward"] + split["update_backward"] + split["update_optimizer"]
            records.append({
                "step": state.global_step, "end_time": time.time(), "own_step_s": now - marks["begin"],
                "phases": split, "prompt_tokens": tokens["prompt"], "completion_tokens": tokens["completion"],
                "samples": tokens["samples"], "torch_threads": torch.get_num_threads(),
            })
            phases.clear()
            tokens.update(prompt=0, completion=0, samples=0)

        def on_log(self, args, state, control, logs=None, **kwargs):
            # logging_steps=1: the step's mean reward over its samples (TRL's "reward").
            if logs and "reward" in logs and records:
                records[-1]["reward_mean"] = float(logs["reward"])

    batch = spec["prompts_per_step"] * spec["n"]
    accumulation = spec.get("trl_grad_accumulation", 1)
    config = GRPOConfig(
        output_dir=str(Path(spec["work_dir"]) / "trl_out"),
        # one optimizer step = one batch of prompts x n, in `accumulation` backward passes
        per_device_train_batch_size=batch // accumulation,
        gradient_accumulation_steps=accumulation,
        num_generations=spec["n"],
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,  # no KL, no reference model
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",  # token-mean over the batch, as hybridflow's GRPO default
        scale_rewards="group",
        gradient_checkpointing=False,  # GRPOConfig turns it on by default; hybridflow runs without
        bf16=spec["dtype"] == "bf16",
        use_cpu=spec.get("device", "cpu") == "cpu",  # gpu_check.py runs it on a GPU
        shuffle_dataset=False,  # both systems take the prompts in file order
        max_steps=spec["steps"],
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        seed=spec["seed"],
        model_init_kwargs={"dtype": "float32"},  # fp32 master weights (bf16 runs autocast)
    )
    t_build = time.perf_counter()
    trainer = TimedGRPOTrainer(model=spec["model_dir"], reward_funcs=trl_reward, args=config, train_dataset=ds,
                               callbacks=[StepRecorder()])
    build_s = time.perf_counter() - t_build
    trainer.train()
    return {"records": records, "startup": {"import_trl_s": import_s, "build_trainer_s": build_s}}


# ----------------------------------------------------------------------------- hybridflow


def hybridflow_config(spec: dict) -> dict:
    """The run config a user would write for this workload (YAML tree)."""
    ranks, batch = spec["ranks"], spec["prompts_per_step"] * spec["n"]
    per_rank = batch // ranks
    micro = min(per_rank, spec["micro_batch_per_rank"])
    return {
        "name": f"vs-trl-{spec['workload']}",
        "seed": spec["seed"],
        "trainer": {"total_steps": spec["steps"], "test_freq": 0, "save_freq": 0, "val_before_train": False,
                    "save_final_model": False, "loggers": ["jsonl"], "console": "none",
                    "output_dir": str(Path(spec["work_dir"]) / "runs")},
        "resources": {"world_size": ranks, "threads_per_rank": spec["threads_per_rank"], "placement": "colocated",
                      **spec.get("resources_extra", {})},  # e.g. omp_wait_policy (bench_contention.py)
        "model": {"path": spec["model_dir"]},
        "data": {"train_files": [spec["prompts_file"]], "train_batch_size": spec["prompts_per_step"],
                 "shuffle": False, "prompt": {"max_prompt_length": spec["max_prompt_length"]}},
        "sft": {"steps": 0},
        "algorithm": {"name": "grpo"},
        "actor": {
            "dtype": spec["dtype"],
            "pack_sequences": spec["pack_sequences"],
            "optim": {"lr": spec["lr"], "weight_decay": 0.0, "grad_clip": 1.0, "lr_schedule": "constant"},
            "micro_batch": {"mini_batch_size": batch, "micro_batch_size_per_device": micro,
                            "forward_micro_batch_size_per_device": min(per_rank, spec["forward_micro_batch_per_rank"])},
            "loss": {"use_kl_loss": False},
        },
        "rollout": {"n": spec["n"], "seed": spec["seed"], "temperature": spec["temperature"], "top_p": 1.0, "top_k": -1,
                    "response_length": spec["max_new_tokens"], "dtype": spec["dtype"]},
        "reward": {"custom_fn_path": str(Path(__file__).resolve()), "custom_fn_name": "compute_score",
                   "manager": {"num_workers": 1, "timeout_s": 30.0}},
    }


def run_hybridflow(spec: dict) -> dict:
    """spec["steps"] GRPO steps through RLTrainer; per-step records from metrics.jsonl."""
    import yaml

    t_import = time.perf_counter()
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer import RLTrainer

    import_s = time.perf_counter() - t_import
    path = Path(spec["work_dir"]) / "hybridflow.yaml"
    path.write_text(yaml.safe_dump(hybridflow_config(spec)))
    t_build = time.perf_counter()
    trainer = RLTrainer(load_run_config(path))
    try:
        trainer.train(steps=spec["steps"])
    finally:
        trainer.close()
    build_and_train_s = time.perf_counter() - t_build
    batch = spec["prompts_per_step"] * spec["n"]
    records = []
    for line in (Path(trainer.run_dir) / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m["phase"] != "rl":
            continue
        split = {
            "gen": m.get("timing_s/gen", 0.0),
            "generate_in_worker": m.get("timing_s/generate", 0.0),
            "reshard": m.get("timing_s/reshard_to_generation", 0.0) + m.get("timing_s/reshard_to_training", 0.0),
            "reward": m.get("timing_s/reward", 0.0),
            "old_log_prob": m.get("timing_s/old_log_prob", 0.0),
            "adv": m.get("timing_s/adv", 0.0),
            "update": m.get("timing_s/update_actor", 0.0),
            "update_in_worker": m.get("timing_s/update_actor_in_worker", 0.0),
        }
        prompt_mean, response_mean = m["prompt_length/mean"], m["response_length/mean"]
        records.append({
            "step": m["step"], "end_time": m["time"], "own_step_s": m["timing_s/step"], "phases": split,
            "prompt_tokens": prompt_mean * batch, "completion_tokens": response_mean * batch, "samples": batch,
            "reward_mean": m["score/mean"],
        })
    return {"records": records, "startup": {"import_hybridflow_s": import_s, "train_call_total_s": build_and_train_s},
            "config": hybridflow_config(spec)}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    runner = {"trl": run_trl, "hybridflow": run_hybridflow}[spec["system"]]
    start = time.time()
    result = runner(spec)
    result["process_start_time"] = start
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
