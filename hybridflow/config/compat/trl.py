"""TRL's GRPO settings under a `trl:` section: `GRPOConfig`'s names (and GRPOTrainer's model,
reward_funcs, train_dataset), each mapped to hybridflow's with the same meaning and units.

    trl: {num_generations: 8, per_device_train_batch_size: 8, gradient_accumulation_steps: 4,
          beta: 0.04, reward_funcs: [rewards.py:accuracy_reward, rewards.py:format_reward]}

Batch sizes follow TRL's arithmetic (GRPOConfig's __post_init__): a generation batch of
per_device_train_batch_size x ranks x steps_per_generation completions (steps_per_generation:
gradient_accumulation_steps) is data.train_batch_size = that / num_generations prompts; an
optimizer step takes per_device x ranks x gradient_accumulation_steps completions; TRL's
defaults fill the sizes not given. TRL's steps count optimizer steps, ours generations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridflow.config.compat.engine import Ctx, Dialect, Out, Row, conv, only, same, unused
from hybridflow.errors import ConfigError

# TRL's defaults of the sizes its batch arithmetic reads (GRPOConfig, TrainingArguments)
DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_generations": 8,
            "num_iterations": 1, "max_completion_length": 512}
_LOSS_TYPES = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
               "dr_grpo": "seq-mean-token-sum-norm"}
_REPORT_TO = {"wandb": "wandb", "tensorboard": "tensorboard", "none": None}
VLLM = "a setting of TRL's vLLM generation; generation runs on hybridflow's engine (rollout.*)"
LOGGING = "how often TRL prints and what it keeps; every step is logged here (metrics.jsonl, `hybridflow eval --show`)"


def _get(ctx: Ctx, name: str) -> Any:
    return ctx.get(f"trl.{name}", DEFAULTS.get(name))


def _ranks(ctx: Ctx) -> int:
    world = ctx.native.get("resources.world_size")
    if world is None and ctx.native.get("resources.ranks_per_node") is not None:
        world = int(ctx.native["resources.ranks_per_node"]) * int(ctx.native.get("resources.nodes", 1))
    if world is None:
        if ctx.native.get("resources.use_gpu"):
            raise ConfigError("TRL's per-device batch sizes count per rank: set resources.world_size (the GPUs)",
                              "trl.per_device_train_batch_size")
        world = ctx.pin("resources.world_size", 1, "TRL's per-device sizes count per rank: one CPU rank")
    return int(world)


def _steps_per_generation(ctx: Ctx, per_rank: int) -> int:
    accumulation = int(_get(ctx, "gradient_accumulation_steps"))
    steps, generation = ctx.get("trl.steps_per_generation"), ctx.get("trl.generation_batch_size")
    if steps is not None and generation is not None:
        raise ConfigError("give steps_per_generation or generation_batch_size, not both", "trl.generation_batch_size")
    if generation is not None:
        if int(generation) % per_rank:
            raise ConfigError(f"{generation} is not a multiple of per_device_train_batch_size x ranks = {per_rank}",
                              "trl.generation_batch_size")
        steps = int(generation) // per_rank
    steps = accumulation if steps is None else int(steps)
    if steps % accumulation:
        raise ConfigError(f"{steps} generation steps are not whole optimizer steps of gradient_accumulation_steps="
                          f"{accumulation}; make it a multiple", "trl.steps_per_generation")
    return steps


def batches(ctx: Ctx) -> Out:
    """TRL's batch arithmetic as hybridflow's sizes (module docstring)."""
    per_device = int(_get(ctx, "per_device_train_batch_size"))
    per_rank = per_device * _ranks(ctx)
    generation = per_rank * _steps_per_generation(ctx, per_rank)
    group = int(_get(ctx, "num_generations"))
    if generation % group:
        raise ConfigError(f"a generation batch of {generation} completions (per_device_train_batch_size x ranks x "
                          f"steps_per_generation) is not a multiple of num_generations={group}", "trl.num_generations")
    return {"data.train_batch_size": generation // group, "rollout.n": group,
            "actor.micro_batch.mini_batch_size": per_rank * int(_get(ctx, "gradient_accumulation_steps")),
            "actor.micro_batch.micro_batch_size_per_device": per_device}


def _batch_row(name: str) -> Row:
    return conv(f"trl.{name}", ("data.train_batch_size", "rollout.n", "actor.micro_batch.mini_batch_size",
                                "actor.micro_batch.micro_batch_size_per_device"),
                lambda v, ctx: batches(ctx), "TRL's batch arithmetic, its defaults for sizes not given")


def _optimizer_steps(native: str, name: str) -> Callable[[Any, Ctx], Out]:
    """A count of TRL's optimizer steps as RL steps (a generation each, num_iterations passes)."""
    def convert(v: Any, ctx: Ctx) -> Out:
        if v is None or int(v) <= 0:
            return {}
        per_rank = int(_get(ctx, "per_device_train_batch_size")) * _ranks(ctx)
        per_generation = (_steps_per_generation(ctx, per_rank) // int(_get(ctx, "gradient_accumulation_steps"))
                          * int(_get(ctx, "num_iterations")))
        if int(v) % per_generation:
            raise ConfigError(f"{v} optimizer steps are not whole generations of {per_generation} optimizer steps "
                              "each (steps_per_generation / gradient_accumulation_steps x num_iterations)",
                              f"trl.{name}")
        return {native: int(v) // per_generation}
    return convert


def _beta(v: Any, ctx: Ctx) -> Out:
    if not v:
        return {"actor.loss.use_kl_loss": False}
    return {"actor.loss.use_kl_loss": True, "actor.loss.kl_loss_coef": float(v), "actor.loss.kl_loss_type": "k3"}


def _prompt_length(v: Any, ctx: Ctx) -> Out:
    if v is None:
        return {}
    return {"data.prompt.max_prompt_length": int(v), "data.prompt.truncation": "left",
            "data.prompt.filter_overlong_prompts": False}


def _loss_type(v: Any, ctx: Ctx) -> Out:
    if v not in _LOSS_TYPES:
        raise ConfigError(f"{v!r}: the losses here are {sorted(_LOSS_TYPES)}", "trl.loss_type")
    out: Out = {"actor.loss.policy.loss_agg_mode": _LOSS_TYPES[v]}
    if v == "dr_grpo":  # its constant is max_completion_length
        length = ctx.first("trl.max_completion_length", "native:rollout.response_length",
                           default=DEFAULTS["max_completion_length"])
        out["actor.loss.loss_scale_factor"] = float(length)
    return out


def _scale_rewards(v: Any, ctx: Ctx) -> Out:
    scale = {True: True, "group": True, "true": True, False: False, "none": False, "false": False}
    if v not in scale:
        raise ConfigError(f"{v!r}: group (or true) or none (or false); 'batch' scaling is not here",
                          "trl.scale_rewards")
    return {"algorithm.norm_adv_by_std_in_grpo": scale[v]}


def _importance_level(v: Any, ctx: Ctx) -> Out:
    modes = {"token": "vanilla", "sequence": "gspo"}
    if v not in modes:
        raise ConfigError(f"{v!r}: token or sequence", "trl.importance_sampling_level")
    return {"actor.loss.policy.loss_mode": modes[v]}


def _epochs(v: Any, ctx: Ctx) -> Out:
    if ctx.get("trl.max_steps") is not None and int(ctx.get("trl.max_steps")) > 0:
        return {}  # TRL: max_steps > 0 overrides num_train_epochs
    return {"trainer.total_epochs": int(v), "trainer.total_steps": None}


def _report_to(v: Any, ctx: Ctx) -> Out:
    names = [v] if isinstance(v, str) else list(v)
    unknown = [n for n in names if n not in _REPORT_TO and n != "all"]
    if unknown:
        raise ConfigError(f"{unknown}: hybridflow logs to wandb, tensorboard (and always metrics.jsonl)",
                          "trl.report_to")
    chosen = {_REPORT_TO[n] for n in names if n in _REPORT_TO} | ({"wandb", "tensorboard"} if "all" in names else set())
    chosen |= {"console", "jsonl"}
    return {"trainer.loggers": [n for n in ("console", "jsonl", "tensorboard", "wandb") if n in chosen]}


def _betas(v: Any, ctx: Ctx) -> Out:
    return {"actor.optim.betas": [float(ctx.get("trl.adam_beta1", 0.9)), float(ctx.get("trl.adam_beta2", 0.999))]}


def _schedule(v: Any, ctx: Ctx) -> Out:
    if v not in ("constant", "cosine", "constant_with_warmup"):
        raise ConfigError(f"{v!r}: the schedules here are constant (with warmup) and cosine", "trl.lr_scheduler_type")
    return {"actor.optim.lr_schedule": "cosine" if v == "cosine" else "constant", **_total_for_schedule(ctx, v)}


def _total_for_schedule(ctx: Ctx, v: Any) -> Out:
    if v != "cosine" and not ctx.get("trl.warmup_ratio"):
        return {}
    steps = _optimizer_steps("actor.optim.total_steps", "max_steps")(ctx.get("trl.max_steps"), ctx)
    if not steps:
        raise ConfigError("a cosine schedule or a warmup_ratio needs the number of steps up front: set max_steps",
                          "trl.lr_scheduler_type")
    return steps


def _warmup_ratio(v: Any, ctx: Ctx) -> Out:
    return {"actor.optim.warmup_ratio": float(v), **_total_for_schedule(ctx, "constant")} if v else {}


def _top_k(v: Any, ctx: Ctx) -> Out:
    return {"rollout.top_k": -1 if not v else int(v)}


def _bf16(v: Any, ctx: Ctx) -> Out:
    dtype = "bf16" if v else "fp32"
    return {"actor.dtype": dtype, "rollout.dtype": dtype}


def reward_reference(fn: Any) -> tuple[str, str]:
    """(path, name) of a reward function given as the function itself or as "file.py:name" / "module:name"."""
    if callable(fn):
        from hybridflow.rewards.registry import reward_fn_reference

        try:
            return reward_fn_reference(fn)
        except ValueError as err:
            raise ConfigError(str(err), "trl.reward_funcs") from None
    path, sep, name = str(fn).rpartition(":")
    if not sep or not path or not name:
        raise ConfigError(f"{fn!r}: give a function, or 'file.py:name' / 'module:name'", "trl.reward_funcs")
    return path, name


def _reward_funcs(v: Any, ctx: Ctx) -> Out:
    refs = [reward_reference(fn) for fn in (v if isinstance(v, (list, tuple)) else [v])]
    paths = {str(Path(p).resolve()) if p.endswith(".py") else p for p, _ in refs}
    if len(paths) > 1:
        raise ConfigError(f"the reward functions come from {sorted(paths)}; put them in one file or module",
                          "trl.reward_funcs")
    names = [name for _, name in refs]
    return {"reward.custom_fn_path": refs[0][0], "reward.custom_fn_name": names[0] if len(names) == 1 else names}


def _paths(native: str) -> Callable[[Any, Ctx], Out]:
    return lambda v, ctx: {native: [str(Path(str(p)).expanduser()) for p in ([v] if isinstance(v, str) else v)]}


def _rows() -> tuple[Row, ...]:
    return (
        conv("trl.model", "model.path", lambda v, ctx: {"model.path": str(Path(str(v)).expanduser())},
             "GRPOTrainer(model=...): a local model directory"),
        conv("trl.reward_funcs", ("reward.custom_fn_path", "reward.custom_fn_name"), _reward_funcs,
             "GRPOTrainer(reward_funcs=...): called batched, as TRL does"),
        conv("trl.train_dataset", "data.train_files", _paths("data.train_files"),
             "GRPOTrainer(train_dataset=...): files"),
        conv("trl.eval_dataset", "data.val_files", _paths("data.val_files"), "GRPOTrainer(eval_dataset=...): files"),
        same("trl.reward_weights", "reward.custom_fn_weights", why="the weighted sum of the reward functions"),
        *(_batch_row(name) for name in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                        "num_generations", "steps_per_generation", "generation_batch_size")),
        same("trl.num_iterations", "actor.micro_batch.epochs", why="passes over each generation batch (mu)"),
        same("trl.max_completion_length", "rollout.response_length"),
        conv("trl.max_prompt_length", ("data.prompt.max_prompt_length", "data.prompt.truncation",
                                       "data.prompt.filter_overlong_prompts"), _prompt_length,
             "TRL keeps the prompt's last tokens"),
        same("trl.learning_rate", "actor.optim.lr"),
        conv("trl.beta", ("actor.loss.use_kl_loss", "actor.loss.kl_loss_coef", "actor.loss.kl_loss_type"), _beta,
             "TRL's KL term is the k3 estimator, in the loss"),
        conv("trl.epsilon", ("actor.loss.policy.clip_ratio_low", "actor.loss.policy.clip_ratio_high"),
             lambda v, ctx: dict.fromkeys(("actor.loss.policy.clip_ratio_low", "actor.loss.policy.clip_ratio_high"),
                                          float(v))),
        same("trl.epsilon_high", "actor.loss.policy.clip_ratio_high", priority=1),
        conv("trl.loss_type", ("actor.loss.policy.loss_agg_mode", "actor.loss.loss_scale_factor"), _loss_type),
        conv("trl.scale_rewards", "algorithm.norm_adv_by_std_in_grpo", _scale_rewards),
        conv("trl.importance_sampling_level", "actor.loss.policy.loss_mode", _importance_level),
        same("trl.temperature", "rollout.temperature"),
        same("trl.top_p", "rollout.top_p"),
        conv("trl.top_k", "rollout.top_k", _top_k, "0 (or null) is no top-k here -1"),
        conv("trl.max_steps", "trainer.total_steps", _optimizer_steps("trainer.total_steps", "max_steps"),
             "TRL counts optimizer steps, hybridflow generations", priority=1),
        conv("trl.num_train_epochs", ("trainer.total_epochs", "trainer.total_steps"), _epochs,
             "passes over the prompts; max_steps > 0 overrides it, as in TRL"),
        conv("trl.save_steps", "trainer.save_freq", _optimizer_steps("trainer.save_freq", "save_steps"),
             "TRL counts optimizer steps, hybridflow generations"),
        same("trl.save_total_limit", "trainer.keep_last_checkpoints"),
        same("trl.seed", "seed"),
        same("trl.output_dir", "trainer.output_dir", why="runs go to <output_dir>/<name>-<time>"),
        same("trl.run_name", "name", why="the run directory is <output_dir>/<name>-<time>"),
        same("trl.shuffle_dataset", "data.shuffle"),
        same("trl.gradient_checkpointing", "actor.gradient_checkpointing"),
        conv("trl.bf16", ("actor.dtype", "rollout.dtype"), _bf16),
        same("trl.weight_decay", "actor.optim.weight_decay"),
        conv("trl.adam_beta1", "actor.optim.betas", _betas),
        conv("trl.adam_beta2", "actor.optim.betas", _betas),
        same("trl.adam_epsilon", "actor.optim.eps"),
        same("trl.max_grad_norm", "actor.optim.grad_clip"),
        conv("trl.lr_scheduler_type", ("actor.optim.lr_schedule", "actor.optim.total_steps"), _schedule),
        conv("trl.warmup_ratio", ("actor.optim.warmup_ratio", "actor.optim.total_steps"), _warmup_ratio),
        same("trl.warmup_steps", "actor.optim.warmup_steps"),
        conv("trl.report_to", "trainer.loggers", _report_to, "console and metrics.jsonl always"),
        only("trl.mask_truncated_completions", (False,), "dropping truncated completions from the loss"),
        only("trl.sync_ref_model", (False,), "moving the reference model toward the policy"),
        only("trl.disable_dropout", (False,), "switching the model's dropout off"),
        only("trl.repetition_penalty", (1.0, 1), "a repetition penalty in generation"),
        only("trl.min_p", (None,), "min-p sampling"),
        only("trl.delta", (None,), "two-sided GRPO clipping"),
        only("trl.top_entropy_quantile", (1.0, 1), "training on the highest-entropy tokens only"),
        only("trl.multi_objective_aggregation", ("sum_then_normalize",), "normalising each reward function apart"),
        only("trl.generation_kwargs", (None, {}), "extra generation arguments"),
        only("trl.chat_template_kwargs", (None, {}), "arguments of the chat template"),
        only("trl.model_init_kwargs", (None, {}), "extra from_pretrained arguments"),
        unused("trl.remove_unused_columns", "every data set column reaches the reward functions here"),
        unused("trl.use_vllm", VLLM),
        unused("trl.vllm_*", VLLM),
        unused("trl.logging_steps", LOGGING),
        unused("trl.log_completions", LOGGING),
        unused("trl.num_completions_to_print", LOGGING),
        unused("trl.per_device_eval_batch_size", "held-out prompts go as one batch here"),
        unused("trl.ds3_gather_for_generation", "a DeepSpeed ZeRO-3 knob; the engine here is FSDP2"),
    )


TRL = Dialect("TRL", _rows(), own_tops=("trl",), detects=lambda tree: "trl" in tree,
              extra=lambda ctx: _trl_data(ctx))


_BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
               "steps_per_generation", "generation_batch_size")
_NATIVE_BATCH = ("data.train_batch_size", "rollout.n", "actor.micro_batch.mini_batch_size",
                 "actor.micro_batch.micro_batch_size_per_device")


def _trl_data(ctx: Ctx) -> Out:
    """TRL's conventions where its keys say nothing: a plain-text prompt goes to the model as
    written and a list of messages through the chat template; rows need no data_source
    column; the batch sizes are TRL's defaults' (unless hybridflow's own are given)."""
    ctx.pin("data.prompt.apply_chat_template", "conversational",
            "TRL: chat messages get the chat template, plain text is used as written")
    ctx.pin("data.prompt.default_data_source", "dataset", "TRL data sets have no data_source column")
    ctx.pin("sft.steps", 0, "GRPOTrainer runs no supervised warm start")
    if not any(ctx.get(f"trl.{k}") is not None for k in _BATCH_KEYS) and not any(
            k in ctx.native for k in _NATIVE_BATCH):
        for native, value in batches(ctx).items():
            ctx.pin(native, value, "TRL's default batch sizes")
    return {}
