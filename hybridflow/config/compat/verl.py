"""verl's config keys (`verl/trainer/config/ppo_trainer.yaml`, its example scripts' overrides and
the DAPO recipe's), each mapped to hybridflow's with the same meaning and units, or named as
having no meaning here. docs/migrating.md is the table for people; tests/config/data/verl holds
verl's own files the tests run.

Units that differ: verl's ppo_mini_batch_size counts prompts (ours: sequences, x rollout.n);
save_freq / test_freq -1 is our 0; default_local_dir holds global_step_N itself (ours:
run_dir/checkpoints/global_step_N).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridflow.config.compat.engine import Ctx, Dialect, Out, Row, conv, fixed, only, same, unused
from hybridflow.config.compat.interpolate import resolve_references
from hybridflow.errors import ConfigError

ARR, ACTOR, ROLLOUT, REF, MODEL = ("actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.rollout",
                                   "actor_rollout_ref.ref", "actor_rollout_ref.model")

# adv_estimator -> the algorithm.name whose program runs it (the others: grpo's program, the critic-free one)
_ALGORITHM_OF = {"gae": "ppo", "grpo": "grpo", "rloo": "rloo", "remax": "remax",
                 "reinforce_plus_plus": "reinforce_plus_plus",
                 "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline"}
_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32"}
_LOGGERS = {"console": "console", "wandb": "wandb", "tensorboard": "tensorboard", "file": "jsonl"}
_UNSET = (None, -1)

# Why keys have no meaning here (the notice groups keys by these).
VLLM = "a setting of the vLLM / SGLang server; generation runs on hybridflow's engine (rollout.*)"
FSDP = "an FSDP1 / torch.compile / kernel knob; the engine here is FSDP2 with its own settings (actor.*)"
PROFILE = "profiler settings; hybridflow's timings are the timing_s/* metrics"
SP = "sequence parallelism (Ulysses); hybridflow splits by data and tensor parallelism"
CKPT = "what verl checkpoints; a hybridflow checkpoint always holds everything to resume"
DERIVED = "derived from another key by verl itself (an interpolation)"
MULTI_TURN = "verl's multi-turn tool loop (off here); hybridflow's is rollout.agent.* (docs/agents.md)"
NOT_HERE = "a feature hybridflow does not have"
DATA_IO = "how verl's data loader reads files; hybridflow reads parquet / jsonl with data.*"


def _n(ctx: Ctx) -> int:
    """rollout.n as the run will have it (verl's mini-batches count prompts, each sampled n times)."""
    return int(ctx.first(f"{ROLLOUT}.n", "native:rollout.n")
               or ctx.pin("rollout.n", 1, "verl's default rollout.n, which ppo_mini_batch_size counts in"))


def _world(ctx: Ctx) -> int | None:
    gpus = ctx.get("trainer.n_gpus_per_node")
    if gpus is not None:
        return int(gpus) * int(ctx.get("trainer.nnodes", 1))
    return ctx.native.get("resources.world_size")


def _on_gpu(ctx: Ctx) -> bool:
    device = ctx.get("trainer.device")
    if device is not None:
        return device == "cuda"
    return bool(ctx.native.get("resources.use_gpu", gpus_here()))


def gpus_here() -> bool:
    """Whether this machine has an NVIDIA GPU (the driver's list; torch is not imported for it)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def _per_prompt(native: str) -> Any:
    def convert(v: Any, ctx: Ctx) -> Out:
        return {} if v is None else {native: int(v) * _n(ctx)}
    return convert


def _global_micro(native: str, key: str) -> Any:
    """verl's deprecated global micro-batch: per device = it / the ranks."""
    def convert(v: Any, ctx: Ctx) -> Out:
        if v is None:
            return {}
        world = _world(ctx)
        if world is None or int(v) % world:
            raise ConfigError(f"{v} counts sequences over all GPUs ({world or 'unknown'} here); give "
                              f"{key}_per_gpu instead", key)
        return {native: int(v) // world}
    return convert


def _path(native: str) -> Any:
    return lambda v, ctx: {} if v is None else {native: str(Path(str(v)).expanduser())}


def _paths(native: str) -> Any:
    def convert(v: Any, ctx: Ctx) -> Out:
        items = [v] if isinstance(v, str) else list(v)
        return {native: [str(Path(str(p)).expanduser()) for p in items]}
    return convert


def _dtype(native: str) -> Any:
    def convert(v: Any, ctx: Ctx) -> Out:
        if v not in _DTYPES:
            raise ConfigError(f"{v!r}: hybridflow computes in bfloat16 or float32", native)
        return {native: _DTYPES[v]}
    return convert


def _gpu_only(native: str) -> Any:
    """An offload switch: hybridflow's on GPUs; on CPU it has no meaning (all is in CPU memory)."""
    return lambda v, ctx: {native: bool(v)} if _on_gpu(ctx) else {}


def _estimator(v: Any, ctx: Ctx) -> Out:
    if "algorithm.name" in ctx.native:  # a hybridflow config naming its program: the estimator is its own
        return {"algorithm.adv_estimator": v}
    return {"algorithm.name": _ALGORITHM_OF.get(v, "grpo"), "algorithm.adv_estimator": v}


def _never_minus_one(native: str) -> Any:
    return lambda v, ctx: {native: 0 if int(v) < 0 else int(v)}


def _loggers(v: Any, ctx: Ctx) -> Out:
    names = [v] if isinstance(v, str) else list(v)
    unknown = [n for n in names if n not in _LOGGERS]
    if unknown:
        raise ConfigError(f"{unknown}: hybridflow logs to {sorted(_LOGGERS)} (file: metrics.jsonl)", "trainer.logger")
    chosen = [_LOGGERS[n] for n in names]
    return {"trainer.loggers": [n for n in ("console", "jsonl", "tensorboard", "wandb") if n in chosen or n == "jsonl"]}


def _resume(v: Any, ctx: Ctx) -> Out:
    if v == "disable":
        return {"trainer.resume": "never"}
    if v == "auto":
        return {"trainer.resume": "auto"}
    if v == "resume_path":
        path = ctx.get("trainer.resume_from_path")
        if path is None:
            raise ConfigError("resume_path needs trainer.resume_from_path", "trainer.resume_mode")
        return {"trainer.resume": str(Path(str(path)).expanduser())}
    raise ConfigError(f"{v!r}: one of auto, disable, resume_path", "trainer.resume_mode")


def _resume_path(v: Any, ctx: Ctx) -> Out:
    return _resume("resume_path", ctx) if ctx.get("trainer.resume_mode") == "resume_path" else {}


def _total_epochs(v: Any, ctx: Ctx) -> Out:
    steps = {} if ctx.get("trainer.total_training_steps") is not None else {"trainer.total_steps": None}
    return {"trainer.total_epochs": int(v), **steps}


def _warmup_steps(native: str) -> Any:
    return lambda v, ctx: {} if v is None or int(v) < 0 else {native: int(v)}


def _with_total_steps(native: str, key: str) -> Any:
    """A setting that needs the number of trainer steps up front (warmup ratio, cosine decay)."""
    section = native.rsplit(".", 1)[0]

    def convert(v: Any, ctx: Ctx) -> Out:
        if v in (None, 0, 0.0, "constant"):
            return {native: v} if v == "constant" else {}
        steps = ctx.get("trainer.total_training_steps")
        if steps is None:
            raise ConfigError(f"{v} needs the number of steps before the run starts here: set "
                              "trainer.total_training_steps", key)
        return {native: v, f"{section}.total_steps": int(steps)}
    return convert


def _schedule(native: str, key: str) -> Any:
    inner = _with_total_steps(native, key)
    return lambda v, ctx: {} if v is None else inner(v, ctx)


def _truncation(v: Any, ctx: Ctx) -> Out:
    if v not in ("error", "left", "right"):
        raise ConfigError(f"{v!r}: hybridflow truncates prompts with error, left or right", "data.truncation")
    return {"data.prompt.truncation": v}


def _max_samples(native: str) -> Any:
    return lambda v, ctx: {} if v in _UNSET else {native: int(v)}


def _target_modules(v: Any, ctx: Ctx) -> Out:
    return {} if v == "all-linear" else {"actor.lora.target_modules": list(v)}


def _reward_model_path(v: Any, ctx: Ctx) -> Out:
    return _path("reward_model.path")(v, ctx) if ctx.get("reward_model.enable") else {}


def _rm_enable(v: Any, ctx: Ctx) -> Out:
    if v and ctx.get("reward_model.model.path") is None:
        raise ConfigError("true needs reward_model.model.path, the reward model's directory", "reward_model.enable")
    return {}


def _same_tokenizer(v: Any, ctx: Ctx) -> Out:
    if v is not None and str(v) != str(ctx.get(f"{MODEL}.path")):
        raise ConfigError("a reward model here reads the policy's token ids: its tokenizer must be the policy's",
                          "reward_model.model.input_tokenizer")
    return {}


def _filter_metric(v: Any, ctx: Ctx) -> Out:
    metric = {"acc": "score", "score": "score", "seq_reward": "shaped_score", "seq_final_reward": "shaped_score"}
    if v not in metric or (v == "seq_final_reward" and ctx.first("native:algorithm.use_kl_in_reward")):
        raise ConfigError(f"{v!r}: groups are told apart here by acc / score (the rule score) or seq_reward (with "
                          "the overlong penalty)", "algorithm.filter_groups.metric")
    return {"algorithm.dapo.filter_groups.metric": metric[v]}


def _gen_batches(v: Any, ctx: Ctx) -> Out:
    if int(v) < 1:
        raise ConfigError(f"{v} (no limit): hybridflow's dynamic sampling has a limit; give the number of "
                          "generation batches a step may take", "algorithm.filter_groups.max_num_gen_batches")
    return {"algorithm.dapo.filter_groups.max_extra_rounds": int(v) - 1}


def _dapo(ctx: Ctx) -> Out:
    """DAPO's keys name the dapo program (verl's recipe runs its own trainer for them)."""
    overlong = any(ctx.get(f"{where}.overlong_buffer{cfg}.enable") for where in
                   ("reward_model", "custom_reward_function") for cfg in ("", "_cfg"))
    overlong = overlong or ctx.get("reward_model.reward_kwargs.overlong_buffer_cfg.enable")
    filtered = ctx.get("algorithm.filter_groups.enable")
    if not (overlong or filtered) or "algorithm.name" in ctx.native:
        return {}
    return {"algorithm.name": "dapo"}


def _overlong_len(v: Any, ctx: Ctx) -> Out:
    return {"algorithm.dapo.overlong_buffer.len": int(v)} if int(v) > 0 else {}


def _max_resp_len(v: Any, ctx: Ctx) -> Out:
    length = ctx.get("data.max_response_length", ctx.get(f"{ROLLOUT}.response_length"))
    if length is not None and int(v) != int(length):
        raise ConfigError(f"{v} differs from data.max_response_length={length}; the overlong buffer here counts "
                          "back from the response length", "reward_model.reward_kwargs.max_resp_len")
    return {}


def _token_level_loss(v: Any, ctx: Ctx) -> Out:
    if not v:
        raise ConfigError("false: give actor_rollout_ref.actor.loss_agg_mode instead (this old key's true is "
                          "token-mean)", f"{ACTOR}.use_token_level_loss")
    return {"actor.loss.policy.loss_agg_mode": "token-mean"}


def _uses_critic(ctx: Ctx) -> bool:
    return ctx.get("algorithm.adv_estimator") == "gae" or ctx.native.get("algorithm.name") in ("ppo", "safe_rlhf")


def _both(*natives: str) -> Any:
    return lambda v, ctx: {} if v is None else dict.fromkeys(natives, v)


def _engine_rows(verl: str, ours: str) -> tuple[Row, ...]:
    """The FSDP and optimizer keys of a trained role (actor or critic)."""
    fsdp = f"{verl}.fsdp_config" if ours == "actor" else f"{verl}.model.fsdp_config"
    return (
        fixed(f"{verl}.optim.optimizer", ("AdamW", "adamw"), "AdamW"),
        unused(f"{verl}.optim.optimizer_impl", "where verl imports AdamW from; hybridflow's is torch's"),
        same(f"{verl}.optim.lr", f"{ours}.optim.lr"),
        conv(f"{verl}.optim.lr_warmup_steps_ratio", (f"{ours}.optim.warmup_ratio", f"{ours}.optim.total_steps"),
             _with_total_steps(f"{ours}.optim.warmup_ratio", f"{verl}.optim.lr_warmup_steps_ratio")),
        unused(f"{verl}.optim.total_training_steps", "verl fills it in at run time (trainer steps)"),
        same(f"{verl}.optim.weight_decay", f"{ours}.optim.weight_decay"),
        conv(f"{verl}.optim.lr_warmup_steps", f"{ours}.optim.warmup_steps", _warmup_steps(f"{ours}.optim.warmup_steps"),
             priority=1),
        conv(f"{verl}.optim.betas", f"{ours}.optim.betas", lambda v, ctx: {f"{ours}.optim.betas": list(v)}),
        same(f"{verl}.optim.clip_grad", f"{ours}.optim.grad_clip"),
        same(f"{verl}.optim.min_lr_ratio", f"{ours}.optim.min_lr_ratio"),
        fixed(f"{verl}.optim.num_cycles", (0.5,), "a half-cycle cosine (0.5)"),
        conv(f"{verl}.optim.lr_scheduler_type", (f"{ours}.optim.lr_schedule", f"{ours}.optim.total_steps"),
             _schedule(f"{ours}.optim.lr_schedule", f"{verl}.optim.lr_scheduler_type"), priority=1),
        conv(f"{verl}.optim.warmup_style", (f"{ours}.optim.lr_schedule", f"{ours}.optim.total_steps"),
             _schedule(f"{ours}.optim.lr_schedule", f"{verl}.optim.warmup_style")),
        only(f"{verl}.optim.override_optimizer_config", (None, {}), "extra optimizer arguments"),
        conv(f"{fsdp}.param_offload", f"{ours}.param_offload", _gpu_only(f"{ours}.param_offload"),
             "no meaning on CPU: everything already lives in CPU memory"),
        conv(f"{fsdp}.optimizer_offload", f"{ours}.optimizer_offload", _gpu_only(f"{ours}.optimizer_offload"),
             "no meaning on CPU: everything already lives in CPU memory"),
        conv(f"{fsdp}.dtype", f"{ours}.dtype", _dtype(f"{ours}.dtype")),
        fixed(f"{fsdp}.model_dtype", ("fp32", "float32"), "fp32 master weights"),
        fixed(f"{fsdp}.strategy", ("fsdp", "fsdp2"), "an FSDP2 training engine"),
        unused(f"{fsdp}.ulysses_sequence_parallel_size", SP),
        unused(f"{fsdp}.*", FSDP),
    )


ROWS: tuple[Row, ...] = (
    # ---------------------------------------------------------------- the policy model
    conv(f"{MODEL}.path", "model.path", _path("model.path")),
    same(f"{MODEL}.enable_gradient_checkpointing", "actor.gradient_checkpointing"),
    same(f"{MODEL}.use_remove_padding", "actor.pack_sequences", priority=1,
         why="same results without padding: sequence packing"),
    same(f"{MODEL}.lora_rank", "actor.lora.rank"),
    same(f"{MODEL}.lora_alpha", "actor.lora.alpha"),
    conv(f"{MODEL}.target_modules", "actor.lora.target_modules", _target_modules),
    only(f"{MODEL}.exclude_modules", (None,), "LoRA module exclusion"),
    only(f"{MODEL}.lora_adapter_path", (None,), "starting from a saved LoRA adapter"),
    only(f"{MODEL}.hf_config_path", (None,), "a model config apart from the weights"),
    only(f"{MODEL}.tokenizer_path", (None,), "a tokenizer apart from the model directory"),
    only(f"{MODEL}.trust_remote_code", (False,), "models with their own Python code"),
    only(f"{MODEL}.custom_chat_template", (None,), "a chat template apart from the tokenizer's"),
    only(f"{MODEL}.external_lib", (None,), "importing a library that registers model classes"),
    only(f"{MODEL}.override_config.*", ({},), "changing the model's config.json at load (edit config.json)"),
    unused(f"{MODEL}.enable_activation_offload", "an activation-memory knob of verl's FSDP1 engine"),
    unused(f"{MODEL}.use_shm", DATA_IO),
    unused(f"{MODEL}.use_liger", FSDP),
    unused(f"{MODEL}.use_fused_kernels", FSDP),
    unused(f"{MODEL}.fused_kernel_options.*", FSDP),
    unused(f"{MODEL}.tiled_mlp.*", FSDP),
    only(f"{MODEL}.mtp.enable", (False,), "multi-token prediction"),
    unused(f"{MODEL}.mtp.*", "multi-token prediction settings (mtp.enable is false)"),
    fixed(f"{ARR}.hybrid_engine", (True,), "the actor generating in its own processes (the hybrid engine)"),
    unused(f"{ARR}.nccl_timeout", "a collective's timeout; hybridflow bounds whole calls: trainer.call_timeout_s"),
    # ---------------------------------------------------------------- the actor
    *_engine_rows(ACTOR, "actor"),
    unused(f"{ACTOR}.rollout_n", DERIVED),
    fixed(f"{ACTOR}.strategy", ("fsdp", "fsdp2", "dp"), "an FSDP2 training engine"),
    conv(f"{ACTOR}.ppo_mini_batch_size", "actor.micro_batch.mini_batch_size",
         _per_prompt("actor.micro_batch.mini_batch_size"), "prompts x rollout.n: hybridflow counts sequences"),
    conv(f"{ACTOR}.ppo_micro_batch_size", "actor.micro_batch.micro_batch_size_per_device",
         _global_micro("actor.micro_batch.micro_batch_size_per_device", f"{ACTOR}.ppo_micro_batch_size")),
    same(f"{ACTOR}.ppo_micro_batch_size_per_gpu", "actor.micro_batch.micro_batch_size_per_device", priority=1),
    same(f"{ACTOR}.use_dynamic_bsz", "actor.micro_batch.use_dynamic_bsz", priority=1),
    same(f"{ACTOR}.ppo_max_token_len_per_gpu", "actor.micro_batch.max_tokens_per_device"),
    conv(f"{ACTOR}.clip_ratio", ("actor.loss.policy.clip_ratio_low", "actor.loss.policy.clip_ratio_high"),
         _both("actor.loss.policy.clip_ratio_low", "actor.loss.policy.clip_ratio_high")),
    same(f"{ACTOR}.clip_ratio_low", "actor.loss.policy.clip_ratio_low", priority=1),
    same(f"{ACTOR}.clip_ratio_high", "actor.loss.policy.clip_ratio_high", priority=1),
    same(f"{ACTOR}.clip_ratio_c", "actor.loss.policy.clip_ratio_c"),
    same(f"{ACTOR}.loss_agg_mode", "actor.loss.policy.loss_agg_mode", priority=1),
    conv(f"{ACTOR}.use_token_level_loss", "actor.loss.policy.loss_agg_mode", _token_level_loss),
    same(f"{ACTOR}.loss_scale_factor", "actor.loss.loss_scale_factor"),
    same(f"{ACTOR}.policy_loss.loss_mode", "actor.loss.policy.loss_mode"),
    unused(f"{ACTOR}.policy_loss.*", "settings of verl's clip_cov / kl_cov / geo_mean losses, not in hybridflow"),
    unused(f"{ACTOR}.tau_pos", "a setting of verl's sapo loss, not in hybridflow"),
    unused(f"{ACTOR}.tau_neg", "a setting of verl's sapo loss, not in hybridflow"),
    same(f"{ACTOR}.entropy_coeff", "actor.loss.entropy_coeff"),
    unused(f"{ACTOR}.calculate_entropy", "the entropy is always computed here (actor/entropy)"),
    same(f"{ACTOR}.use_kl_loss", "actor.loss.use_kl_loss"),
    same(f"{ACTOR}.kl_loss_coef", "actor.loss.kl_loss_coef"),
    same(f"{ACTOR}.kl_loss_type", "actor.loss.kl_loss_type"),
    same(f"{ACTOR}.ppo_epochs", "actor.micro_batch.epochs"),
    same(f"{ACTOR}.shuffle", "actor.micro_batch.shuffle"),
    unused(f"{ACTOR}.data_loader_seed", "the update's shuffling is seeded from seed here"),
    unused(f"{ACTOR}.checkpoint.*", CKPT),
    same(f"{ACTOR}.grad_clip", "actor.optim.grad_clip", priority=1),
    only(f"{ACTOR}.freeze_vision_tower", (False,), "vision towers"),
    only(f"{ACTOR}.use_prefix_grouper", (False,), "verl's shared-prefix grouping"),
    only(f"{ACTOR}.router_replay.mode", ("disabled",), "mixture-of-experts router replay"),
    unused(f"{ACTOR}.router_replay.*", "router replay files (router_replay.mode is disabled)"),
    unused(f"{ACTOR}.ulysses_sequence_parallel_size", SP),
    unused(f"{ACTOR}.use_torch_compile", FSDP),
    unused(f"{ACTOR}.use_fused_kernels", FSDP),
    unused(f"{ACTOR}.entropy_from_logits_with_chunking", FSDP),
    unused(f"{ACTOR}.entropy_checkpointing", FSDP),
    unused(f"{ACTOR}.calculate_sum_pi_squared", FSDP),
    unused(f"{ACTOR}.sum_pi_squared_checkpointing", FSDP),
    same(f"{ACTOR}.use_remove_padding", "actor.pack_sequences"),
    unused(f"{ACTOR}.profiler.*", PROFILE),
    # ---------------------------------------------------------------- the reference policy
    unused(f"{REF}.rollout_n", DERIVED),
    unused(f"{REF}.strategy", DERIVED),
    unused(f"{REF}.use_torch_compile", FSDP),
    conv(f"{REF}.log_prob_micro_batch_size", "actor.micro_batch.forward_micro_batch_size_per_device",
         _global_micro("actor.micro_batch.forward_micro_batch_size_per_device", f"{REF}.log_prob_micro_batch_size")),
    same(f"{REF}.log_prob_micro_batch_size_per_gpu", "actor.micro_batch.forward_micro_batch_size_per_device",
         why="the reference scores with the actor's forward micro-batches here"),
    same(f"{REF}.log_prob_use_dynamic_bsz", "actor.micro_batch.use_dynamic_bsz"),
    same(f"{REF}.log_prob_max_token_len_per_gpu", "actor.micro_batch.forward_max_tokens_per_device"),
    unused(f"{REF}.fsdp_config.*", "the reference is built with the actor's engine settings here (actor.*)"),
    only(f"{REF}.router_replay.mode", ("disabled",), "mixture-of-experts router replay"),
    unused(f"{REF}.router_replay.*", "router replay files (router_replay.mode is disabled)"),
    unused(f"{REF}.ulysses_sequence_parallel_size", SP),
    unused(f"{REF}.entropy_from_logits_with_chunking", FSDP),
    unused(f"{REF}.entropy_checkpointing", FSDP),
    unused(f"{REF}.profiler.*", PROFILE),
    # ---------------------------------------------------------------- generation
    conv(f"{ROLLOUT}.name", "rollout.name", lambda v, ctx: {"rollout.name": "hf"} if v == "hf" else {},
         "vLLM / SGLang: generation runs on hybridflow's own engine (rollout.name=native); its vllm / sglang "
         "adapters are rollout.name=vllm|sglang"),
    unused(f"{ROLLOUT}.mode", "verl's engine server mode; generation here is one call per step"),
    same(f"{ROLLOUT}.temperature", "rollout.temperature"),
    same(f"{ROLLOUT}.top_k", "rollout.top_k"),
    same(f"{ROLLOUT}.top_p", "rollout.top_p"),
    same(f"{ROLLOUT}.do_sample", "rollout.do_sample"),
    same(f"{ROLLOUT}.ignore_eos", "rollout.ignore_eos"),
    same(f"{ROLLOUT}.n", "rollout.n"),
    same(f"{ROLLOUT}.prompt_length", "data.prompt.max_prompt_length", priority=1),
    same(f"{ROLLOUT}.response_length", "rollout.response_length", priority=1),
    conv(f"{ROLLOUT}.dtype", "rollout.dtype", _dtype("rollout.dtype")),
    same(f"{ROLLOUT}.tensor_model_parallel_size", "rollout.tensor_model_parallel_size"),
    same(f"{ROLLOUT}.max_num_batched_tokens", "rollout.prefill_token_budget",
         why="tokens one engine step may take in"),
    same(f"{ROLLOUT}.max_model_len", "rollout.max_model_len"),
    same(f"{ROLLOUT}.max_num_seqs", "rollout.max_num_seqs"),
    conv(f"{ROLLOUT}.log_prob_micro_batch_size", "actor.micro_batch.forward_micro_batch_size_per_device",
         _global_micro("actor.micro_batch.forward_micro_batch_size_per_device", f"{ROLLOUT}.log_prob_micro_batch_size"),
         priority=1),
    same(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", "actor.micro_batch.forward_micro_batch_size_per_device",
         priority=1),
    same(f"{ROLLOUT}.log_prob_use_dynamic_bsz", "actor.micro_batch.use_dynamic_bsz"),
    same(f"{ROLLOUT}.log_prob_max_token_len_per_gpu", "actor.micro_batch.forward_max_tokens_per_device",
         priority=1),
    same(f"{ROLLOUT}.val_kwargs.top_k", "trainer.validation.top_k"),
    same(f"{ROLLOUT}.val_kwargs.top_p", "trainer.validation.top_p"),
    conv(f"{ROLLOUT}.val_kwargs.temperature", "trainer.validation.temperature",
         lambda v, ctx: {"trainer.validation.temperature": float(v)} if v else {},
         "0 is greedy, which is val_kwargs.do_sample=false here"),
    same(f"{ROLLOUT}.val_kwargs.n", "trainer.validation.n"),
    same(f"{ROLLOUT}.val_kwargs.do_sample", "trainer.validation.do_sample"),
    only(f"{ROLLOUT}.multi_turn.enable", (False,), "verl's multi-turn tool loop (hybridflow's is rollout.agent.*)"),
    unused(f"{ROLLOUT}.multi_turn.*", MULTI_TURN),
    only(f"{ROLLOUT}.over_sample_rate", (0, 0.0), "over-sampling and aborting the slowest requests"),
    only(f"{ROLLOUT}.data_parallel_size", (1,), "a data-parallel vLLM server"),
    only(f"{ROLLOUT}.expert_parallel_size", (1,), "expert parallelism"),
    only(f"{ROLLOUT}.pipeline_model_parallel_size", (1,), "pipeline-parallel generation"),
    only(f"{ROLLOUT}.quantization", (None,), "quantised generation"),
    only(f"{ROLLOUT}.quantization_config_file", (None,), "quantised generation"),
    only(f"{ROLLOUT}.enable_rollout_routing_replay", (False,), "mixture-of-experts router replay"),
    only(f"{ROLLOUT}.skip_rollout", (False,), "replaying dumped generations"),
    only(f"{ROLLOUT}.mtp", (None,), "multi-token prediction"),
    only(f"{ROLLOUT}.mtp.enable", (False,), "multi-token prediction"),
    unused(f"{ROLLOUT}.mtp.*", "multi-token prediction settings (mtp.enable is false)"),
    *(unused(f"{ROLLOUT}.{key}", VLLM) for key in (
        "gpu_memory_utilization", "enforce_eager", "cudagraph_capture_sizes", "free_cache_engine",
        "enable_chunked_prefill", "enable_prefix_caching", "logprobs_mode", "scheduling_policy", "load_format",
        "disable_log_stats", "multi_stage_wake_up", "engine_kwargs.*", "agent.*", "checkpoint_engine.*", "trace.*",
        "skip_dump_dir", "skip_tokenizer_init", "prometheus.*", "layered_summon", "calculate_log_probs")),
    unused(f"{ROLLOUT}.profiler.*", PROFILE),
    # ---------------------------------------------------------------- data
    conv("data.train_files", "data.train_files", _paths("data.train_files")),
    conv("data.val_files", "data.val_files", _paths("data.val_files")),
    same("data.train_batch_size", "data.train_batch_size"),
    same("data.max_prompt_length", "data.prompt.max_prompt_length"),
    same("data.max_response_length", "rollout.response_length"),
    same("data.prompt_key", "data.prompt.prompt_key"),
    same("data.filter_overlong_prompts", "data.prompt.filter_overlong_prompts"),
    conv("data.truncation", "data.prompt.truncation", _truncation),
    same("data.shuffle", "data.shuffle"),
    same("data.seed", "seed", why="the data order's seed; here one seed seeds the run"),
    conv("data.train_max_samples", "data.prompt.max_samples", _max_samples("data.prompt.max_samples")),
    conv("data.val_max_samples", "data.max_val_samples", _max_samples("data.max_val_samples")),
    fixed("data.reward_fn_key", ("data_source",), "data_source as the column that picks the scorer"),
    only("data.tokenizer", (None,), "a tokenizer apart from the model's"),
    only("data.tool_config_path", (None,), "verl's multi-turn tools (hybridflow's are rollout.agent.*)"),
    only("data.validation_shuffle", (False,), "shuffling the held-out prompts"),
    only("data.trust_remote_code", (False,), "tokenizers with their own Python code"),
    only("data.custom_cls.*", (None,), "a data set class of your own"),
    only("data.sampler.*", (None,), "a sampler class of your own (curriculum)"),
    only("data.datagen.*", (None,), "generated data"),
    only("data.apply_chat_template_kwargs.*", ({},), "arguments of the chat template"),
    unused("data.gen_batch_size", "prompts of one DAPO generation round; each round here generates "
                                   "data.train_batch_size prompts (the trained batch is that many groups either way)"),
    unused("data.val_batch_size", "verl no longer reads it (held-out prompts go as one batch)"),
    *(unused(f"data.{key}", DATA_IO) for key in (
        "use_shm", "return_raw_input_ids", "return_raw_chat", "return_full_prompt", "dataloader_num_workers",
        "filter_overlong_prompts_workers", "image_patch_size", "image_key", "video_key", "return_multi_modal_inputs")),
    # ---------------------------------------------------------------- the critic
    *_engine_rows("critic", "critic"),
    conv("critic.model.path", "critic.model_path", _path("critic.model_path")),
    unused("critic.model.tokenizer_path", "the critic reads the policy's tokens here"),
    only("critic.model.override_config.*", ({},), "changing the model's config.json at load (edit config.json)"),
    only("critic.model.external_lib", (None,), "importing a library that registers model classes"),
    only("critic.model.trust_remote_code", (False,), "models with their own Python code"),
    unused("critic.model.use_shm", DATA_IO),
    same("critic.model.enable_gradient_checkpointing", "critic.gradient_checkpointing"),
    unused("critic.model.enable_activation_offload", "an activation-memory knob of verl's FSDP1 engine"),
    same("critic.model.use_remove_padding", "critic.pack_sequences"),
    only("critic.model.lora_rank", (0,), "LoRA on the critic (LoRA adapts the actor only here)"),
    unused("critic.model.lora_alpha", "LoRA on the critic (critic.model.lora_rank is 0)"),
    unused("critic.model.target_modules", "LoRA on the critic (critic.model.lora_rank is 0)"),
    unused("critic.model.tiled_mlp.*", FSDP),
    unused("critic.rollout_n", DERIVED),
    fixed("critic.strategy", ("fsdp", "fsdp2", "dp"), "an FSDP2 training engine"),
    only("critic.enable", (None,), "a critic apart from the algorithm's own (adv_estimator=gae has one)"),
    conv("critic.ppo_mini_batch_size", "critic.micro_batch.mini_batch_size",
         _per_prompt("critic.micro_batch.mini_batch_size"), "prompts x rollout.n: hybridflow counts sequences",
         priority=1),
    conv("critic.ppo_micro_batch_size", "critic.micro_batch.micro_batch_size_per_device",
         _global_micro("critic.micro_batch.micro_batch_size_per_device", "critic.ppo_micro_batch_size")),
    same("critic.ppo_micro_batch_size_per_gpu", "critic.micro_batch.micro_batch_size_per_device", priority=1),
    conv("critic.forward_micro_batch_size", "critic.micro_batch.forward_micro_batch_size_per_device",
         _global_micro("critic.micro_batch.forward_micro_batch_size_per_device", "critic.forward_micro_batch_size")),
    same("critic.forward_micro_batch_size_per_gpu", "critic.micro_batch.forward_micro_batch_size_per_device",
         priority=1),
    same("critic.use_dynamic_bsz", "critic.micro_batch.use_dynamic_bsz", priority=1),
    same("critic.ppo_max_token_len_per_gpu", "critic.micro_batch.max_tokens_per_device"),
    same("critic.forward_max_token_len_per_gpu", "critic.micro_batch.forward_max_tokens_per_device"),
    same("critic.ppo_epochs", "critic.micro_batch.epochs", priority=1),
    same("critic.shuffle", "critic.micro_batch.shuffle", priority=1),
    unused("critic.data_loader_seed", "the update's shuffling is seeded from seed here"),
    same("critic.cliprange_value", "critic.loss.cliprange_value"),
    same("critic.loss_agg_mode", "critic.loss.loss_agg_mode", priority=1),
    unused("critic.checkpoint.*", CKPT),
    unused("critic.ulysses_sequence_parallel_size", SP),
    same("critic.grad_clip", "critic.optim.grad_clip", priority=1),
    unused("critic.profiler.*", PROFILE),
    # ---------------------------------------------------------------- a reward model, the reward function
    conv("reward_model.enable", (), _rm_enable, "read with reward_model.model.path (false: no reward model)"),
    conv("reward_model.model.path", "reward_model.path", _reward_model_path, "read when reward_model.enable"),
    conv("reward_model.model.input_tokenizer", (), _same_tokenizer,
         "the reward model reads the policy's token ids here"),
    same("reward_model.micro_batch_size_per_gpu", "reward_model.micro_batch.forward_micro_batch_size_per_device"),
    conv("reward_model.micro_batch_size", "reward_model.micro_batch.forward_micro_batch_size_per_device",
         _global_micro("reward_model.micro_batch.forward_micro_batch_size_per_device",
                       "reward_model.micro_batch_size")),
    same("reward_model.use_dynamic_bsz", "reward_model.micro_batch.use_dynamic_bsz"),
    same("reward_model.forward_max_token_len_per_gpu", "reward_model.micro_batch.forward_max_tokens_per_device"),
    same("reward_model.model.use_remove_padding", "reward_model.pack_sequences"),
    same("reward_model.num_workers", "reward.manager.num_workers", why="processes that run the reward function"),
    fixed("reward_model.reward_manager", ("naive", "dapo"), "its own reward manager (dapo's overlong penalty is "
          "algorithm.dapo.overlong_buffer)"),
    only("reward_model.enable_resource_pool", (False,), "a GPU pool of the reward model's own"),
    fixed("reward_model.strategy", ("fsdp", "fsdp2"), "an FSDP2 engine"),
    only("reward_model.model.override_config.*", ({},), "changing the model's config.json at load"),
    only("reward_model.model.trust_remote_code", (False,), "models with their own Python code"),
    only("reward_model.max_length", (None,), "cutting the reward model's input"),
    only("reward_model.sandbox_fusion.url", (None,), "verl's remote code sandbox"),
    unused("reward_model.sandbox_fusion.*", "verl's remote code sandbox (its url is null)"),
    only("reward_model.reward_kwargs.*", ({},), "arguments of verl's reward manager class"),
    unused("reward_model.rollout.*", "a generative reward model's server (hybridflow's reward models score)"),
    *(unused(f"reward_model.{key}", "how verl places and runs its reward model / reward loop") for key in (
        "n_gpus_per_node", "nnodes", "model.external_lib", "model.use_shm", "model.use_fused_kernels",
        "model.fsdp_config.*", "reward_loop_source", "reward_loop_module_path", "reward_loop_class_name",
        "launch_reward_fn_async", "use_reward_loop", "ulysses_sequence_parallel_size")),
    unused("reward_model.profiler.*", PROFILE),
    conv("custom_reward_function.path", "reward.custom_fn_path", _path("reward.custom_fn_path")),
    same("custom_reward_function.name", "reward.custom_fn_name"),
    only("custom_reward_function.reward_kwargs.*", ({},), "extra arguments of the reward function"),
    fixed("reward_manager.source", ("register",), "its own reward manager"),
    fixed("reward_manager.name", ("naive", "dapo"), "its own reward manager"),
    only("reward_manager.module.path", (None,), "a reward manager class of your own"),
    unused("reward_manager.module.name", "a reward manager class of your own (its path is null)"),
    # DAPO's overlong shaping, under the three names verl's DAPO recipe has used
    *(row for where in ("reward_model.overlong_buffer", "custom_reward_function.overlong_buffer",
                        "reward_model.reward_kwargs.overlong_buffer_cfg") for row in (
        same(f"{where}.enable", "algorithm.dapo.overlong_buffer.enable"),
        conv(f"{where}.len", "algorithm.dapo.overlong_buffer.len", _overlong_len),
        same(f"{where}.penalty_factor", "algorithm.dapo.overlong_buffer.penalty_factor"),
        unused(f"{where}.log", "the penalty is always logged here (dapo/overlong_penalty_mean)"))),
    conv("reward_model.reward_kwargs.max_resp_len", (), _max_resp_len,
         "the overlong buffer counts back from rollout.response_length"),
    # ---------------------------------------------------------------- the algorithm
    conv("algorithm.adv_estimator", ("algorithm.name", "algorithm.adv_estimator"), _estimator,
         "the program that runs this estimator"),
    same("algorithm.gamma", "algorithm.gamma", priority=1),
    same("algorithm.lam", "algorithm.lam", priority=1),
    same("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo", priority=1),
    same("algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward", priority=1),
    same("algorithm.kl_penalty", "algorithm.kl_penalty", priority=1),
    same("algorithm.kl_ctrl.type", "algorithm.kl_ctrl.type", priority=1),
    same("algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.kl_coef", priority=1),
    same("algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.horizon", priority=1),
    same("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.target_kl", priority=1),
    only("algorithm.use_pf_ppo", (False,), "preference-feedback PPO's reweighting"),
    unused("algorithm.pf_ppo.*", "preference-feedback PPO settings (algorithm.use_pf_ppo is false)"),
    only("algorithm.rollout_correction.rollout_is", (None,), "verl's rollout correction (hybridflow's is "
         "actor.loss.off_policy, docs/algorithms.md)"),
    only("algorithm.rollout_correction.rollout_rs", (None,), "verl's rollout rejection sampling"),
    only("algorithm.rollout_correction.bypass_mode", (False,), "verl's rollout correction bypass"),
    unused("algorithm.rollout_correction.*", "verl's rollout correction settings (rollout_is is null)"),
    same("algorithm.filter_groups.enable", "algorithm.dapo.filter_groups.enable"),
    conv("algorithm.filter_groups.metric", "algorithm.dapo.filter_groups.metric",
         lambda v, ctx: {} if v is None else _filter_metric(v, ctx)),
    conv("algorithm.filter_groups.max_num_gen_batches", "algorithm.dapo.filter_groups.max_extra_rounds",
         _gen_batches, "generation batches in all = 1 + extra rounds"),
    # ---------------------------------------------------------------- the loop
    same("trainer.balance_batch", "trainer.balance_batch", priority=1),
    conv("trainer.total_epochs", ("trainer.total_epochs", "trainer.total_steps"), _total_epochs,
         "passes over the training prompts; the steps are counted once the prompts are read"),
    same("trainer.total_training_steps", "trainer.total_steps", priority=1),
    same("trainer.project_name", "trainer.wandb_project"),
    same("trainer.experiment_name", "name", why="the run directory is <trainer.output_dir>/<name>-<time>"),
    conv("trainer.logger", "trainer.loggers", _loggers, "jsonl: the run's metrics.jsonl, always kept"),
    unused("trainer.log_val_generations", "held-out responses logged to W&B; `hybridflow eval RUN --show N` "
                                          "prints them"),
    only("trainer.rollout_data_dir", (None,), "dumping every generation to files"),
    only("trainer.validation_data_dir", (None,), "dumping the held-out generations to files"),
    same("trainer.nnodes", "resources.nodes"),
    same("trainer.n_gpus_per_node", "resources.ranks_per_node", why="ranks per node: GPUs, or CPU slots"),
    conv("trainer.save_freq", "trainer.save_freq", _never_minus_one("trainer.save_freq"), priority=1),
    conv("trainer.test_freq", "trainer.test_freq", _never_minus_one("trainer.test_freq"), priority=1),
    unused("trainer.esi_redundant_time", "a checkpoint before a cloud instance expires (ESI)"),
    conv("trainer.resume_mode", "trainer.resume", _resume),
    conv("trainer.resume_from_path", "trainer.resume", _resume_path, "read with resume_mode=resume_path"),
    same("trainer.val_before_train", "trainer.val_before_train", priority=1),
    only("trainer.val_only", (False,), "evaluation without training (that is `hybridflow eval`)"),
    only("trainer.critic_warmup", (0,), "training the critic alone for the first steps"),
    only("trainer.default_hdfs_dir", (None,), "copying checkpoints to HDFS"),
    only("trainer.del_local_ckpt_after_load", (False,), "deleting a checkpoint once loaded"),
    conv("trainer.default_local_dir", "trainer.run_dir", _path("trainer.run_dir"),
         "the run directory: checkpoints go to its checkpoints/global_step_N"),
    same("trainer.max_actor_ckpt_to_keep", "trainer.keep_last_checkpoints", why="one checkpoint holds every role"),
    same("trainer.max_critic_ckpt_to_keep", "trainer.keep_last_checkpoints", why="one checkpoint holds every role"),
    conv("trainer.remove_previous_ckpt_in_save", "trainer.keep_last_checkpoints",
         lambda v, ctx: {"trainer.keep_last_checkpoints": 1} if v else {}),
    unused("trainer.ray_wait_register_center_timeout", "how long verl waits for its workers to register"),
    conv("trainer.device", "resources.use_gpu", lambda v, ctx: {"resources.use_gpu": v == "cuda"}
         if v in ("cuda", "cpu") else _no_device(v)),
    unused("trainer.use_legacy_worker_impl", "which of verl's worker classes runs"),
    unused("global_profiler.*", PROFILE),
    only("transfer_queue.enable", (False,), "verl's transfer queue"),
    unused("ray_kwargs.ray_init.num_cpus", "Ray's CPUs; hybridflow sizes Ray from resources.*"),
    only("ray_kwargs.timeline_json_file", (None,), "a Ray timeline dump"),
)


def _no_device(v: Any) -> Out:
    raise ConfigError(f"{v!r}: hybridflow runs on cuda or cpu", "trainer.device")


# verl's critic keys that take the actor's value when not given (critic runs only):
# (the critic's key, the actor's, ours)
_CRITIC_FOLLOWS = (
    ("critic.ppo_mini_batch_size", f"{ACTOR}.ppo_mini_batch_size", "critic.micro_batch.mini_batch_size"),
    ("critic.ppo_epochs", f"{ACTOR}.ppo_epochs", "critic.micro_batch.epochs"),
    ("critic.shuffle", f"{ACTOR}.shuffle", "critic.micro_batch.shuffle"),
    ("critic.use_dynamic_bsz", f"{ACTOR}.use_dynamic_bsz", "critic.micro_batch.use_dynamic_bsz"),
    ("critic.loss_agg_mode", f"{ACTOR}.loss_agg_mode", "critic.loss.loss_agg_mode"),
)


def _extra(ctx: Ctx) -> Out:
    """What verl decides from several keys: the dapo program, the critic taking the actor's
    batch settings, and GPUs when trainer.device is not given."""
    for own, actor_key, native in _CRITIC_FOLLOWS if _uses_critic(ctx) else ():
        value = ctx.get(actor_key)
        if value is not None and ctx.get(own) is None:
            value = int(value) * _n(ctx) if native.endswith("mini_batch_size") else value
            ctx.pin(native, value, f"verl's {own} takes {actor_key} when not given")
    if ctx.get("trainer.device") is None:
        on = _on_gpu(ctx)
        ctx.pin("resources.use_gpu", on, "verl runs on GPUs (trainer.device=cuda): "
                + ("this machine has some" if on else "this machine has none, so the ranks are CPU slots"))
    ctx.pin("sft.steps", 0, "verl runs no supervised warm start")
    ctx.pin("trainer.metric_names", ["hybridflow", "verl"], "verl's metric names are logged too "
            "(critic/score/mean, val-core/<data_source>/..., docs/migrating.md)")
    return _dapo(ctx)


def _resolve(tree: dict[str, Any]) -> dict[str, Any]:
    return resolve_references(tree)


VERL = Dialect("verl", ROWS, own_tops=(ARR, "custom_reward_function", "reward_manager", "global_profiler",
                                       "transfer_queue", "ray_kwargs"),
               resolve=_resolve, extra=_extra)


# ----------------------------------------------------------------------------- metric names

# hybridflow's metric -> verl's name for the same number (trainer.metric_names: [.., verl]);
# names both share (response_length/*, actor/pg_loss, timing_s/gen, ...) need no second copy.
METRICS = {
    **{f"{ours}/{stat}": f"critic/{theirs}/{stat}" for ours, theirs in (
        ("score", "score"), ("reward", "rewards"), ("adv", "advantages"), ("returns", "returns"),
        ("values", "values")) for stat in ("mean", "max", "min")},
    "actor/pg_clipfrac_dual": "actor/pg_clipfrac_lower",
    "timing_s/eval": "timing_s/testing",
}


def verl_metrics(step: int, metrics: dict[str, Any], samples_per_prompt: int) -> dict[str, Any]:
    """verl's names for a record's metrics: the table above, each data source's held-out
    score as val-core/<data_source>/reward/mean@<responses per prompt>, the step as
    training/global_step."""
    out = {theirs: metrics[ours] for ours, theirs in METRICS.items() if ours in metrics}
    for key, value in metrics.items():
        if key.startswith("val/") and key.endswith("/score") and key.count("/") >= 2:
            out[f"val-core/{key[len('val/'):-len('/score')]}/reward/mean@{samples_per_prompt}"] = value
    if out:
        out["training/global_step"] = step
    return out
