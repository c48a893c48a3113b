"""Bodies of the multi-process training-engine tests (run on every rank by run_ranks).

Each case builds the engine over the gloo world, and on every rank also a plain,
unsharded single-process reference of the same model on the *global* batch; it
returns the largest differences it saw, and the test asserts on them. fp32 throughout
except where a case says bf16.
"""

from __future__ import annotations

import torch
from hybridflow.engines.train.distributed import full_tensor

from hybridflow.engines.train.lora import hf_name
from train_harness import (
    full_parameters,
    make_rl_batch,
    param_update_error,
    reference_actor_update,
    reference_log_probs,
    reference_model,
    reference_optimizer,
    shard_rows,
)


def attention_for(path: str) -> str:
    """sdpa, or eager for a family whose soft-capped attention needs it (Gemma 2)."""
    from hybridflow.engines.models import EAGER_ATTENTION_FAMILIES, load_hf_config

    return "eager" if load_hf_config(path).model_type in EAGER_ATTENTION_FAMILIES else "sdpa"


def _actor_config(path: str, *, tp: int, mini: int, micro: int, lr: float, dtype: str = "fp32", **kw):
    from hybridflow.engines.train import MicroBatchConfig, OptimConfig, TrainEngineConfig

    return TrainEngineConfig(
        model_path=path,
        attn_implementation=attention_for(path),
        dtype=dtype,
        tp_size=tp,
        optim=OptimConfig(lr=lr, weight_decay=0.01, grad_clip=1.0),
        micro_batch=MicroBatchConfig(mini_batch_size=mini, micro_batch_size_per_device=micro,
                                     forward_micro_batch_size_per_device=3),
        **kw,
    )


def _loss_config():
    from hybridflow.algorithms import PolicyLossConfig
    from hybridflow.engines.train import ActorLossConfig

    return ActorLossConfig(
        policy=PolicyLossConfig(loss_mode="vanilla", clip_ratio_low=0.2, clip_ratio_high=0.28),
        entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl",
    )


def _batch_with_old_log_probs(model, n: int, seed: int, vocab: int = 256) -> dict[str, torch.Tensor]:
    batch = make_rl_batch(n, seed=seed, vocab=vocab)
    with torch.no_grad():
        lp = reference_log_probs(model, batch)
    g = torch.Generator().manual_seed(seed + 100)
    # Off-policy noise so some ratios are clipped and the KL term is non-zero.
    batch["old_log_probs"] = lp + 0.3 * torch.randn(lp.shape, generator=g)
    batch["ref_log_probs"] = lp + 0.1 * torch.randn(lp.shape, generator=g)
    return batch


def actor_matches_reference(rank: int, world: int, path: str, tp: int, steps: int, dynamic: bool = False,
                            lora_rank: int = 0) -> dict:
    """Log-probs, gradients, losses and parameters of ActorEngine vs a plain model.

    dynamic: micro-batches by a token budget, with sequence packing (ranks then cut
    different numbers of micro-batches locally and must agree on one count).
    lora_rank > 0: LoRA adapters on every attention and MLP projection; the reference is
    the same peft model built from the same seed (B starts at 0, so A first moves in the
    second step: use steps >= 2).
    """
    from hybridflow.algorithms import compute_aggregation_scale, torch_all_reduce_sum
    from hybridflow.engines.train import ActorEngine
    from hybridflow.engines.train.forward import causal_lm_log_probs

    dp = world // tp
    n, mini, micro, lr = 4 * dp, 2 * dp, 1, 1e-3
    extra = {"pack_sequences": True} if dynamic else {}
    if lora_rank:
        from hybridflow.engines.train import LoraConfig

        from hybridflow.engines.models import MOE_FAMILIES, load_hf_config

        # MoE: attention only (LoRA on fused experts is refused, test_model_families.py)
        moe = load_hf_config(path).model_type in MOE_FAMILIES
        targets = {"target_modules": ("q_proj", "k_proj", "v_proj", "o_proj")} if moe else {}
        extra["lora"] = LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank, **targets)
    config = _actor_config(path, tp=tp, mini=mini, micro=micro, lr=lr, **extra)
    if dynamic:
        config.micro_batch.use_dynamic_bsz = True
        config.micro_batch.max_tokens_per_device = 12
        config.micro_batch.forward_max_tokens_per_device = 20
    engine = ActorEngine(config, _loss_config())
    dp_rank = engine.dp_rank
    ref = reference_model(path, config)
    ref_opt = reference_optimizer(ref, lr=lr, weight_decay=0.01)
    out: dict = {}

    batch = _batch_with_old_log_probs(ref, n, seed=1)
    local = shard_rows(batch, dp, dp_rank)
    mask = batch["response_mask"].bool()
    lp, _ = engine.compute_log_prob(local)
    ref_lp = reference_log_probs(ref, batch).detach()
    out["log_prob"] = float((lp - ref_lp.chunk(dp)[dp_rank])[mask.chunk(dp)[dp_rank]].abs().max())

    # Gradient of the token-mean policy loss over the whole batch, engine vs reference.
    agg = compute_aggregation_scale([local["response_mask"]], dp_size=dp,
                                    all_reduce_sum=torch_all_reduce_sum(engine.dp_group))
    engine.model.train()
    elp, _ = causal_lm_log_probs(engine.model, local, temperature=1.0, chunk_size=7,
                                 pack_sequences=False, with_entropy=False)
    from hybridflow.algorithms import agg_loss
    (agg_loss(elp * local["advantages"], local["response_mask"], "token-mean", agg)).backward()
    rlp = reference_log_probs(ref, batch)
    agg_loss(rlp * batch["advantages"], batch["response_mask"], "token-mean").backward()
    _grad_error_then_updates(engine, ref, ref_opt, out, n=n, mini=mini, steps=steps)
    if lora_rank:
        # What generation receives: W + (alpha / r) B A merged per parameter on the engine's
        # (dp, tp) layout, vs the single-process peft model merged the plain way.
        from hybridflow.engines.train.lora import merged_hf_state_dict
        from hybridflow.workers.generation_weights import generation_named_parameters

        merged = {n: full_tensor(t) for n, t in generation_named_parameters(engine)()}
        expected = merged_hf_state_dict(ref.state_dict(), config.lora)
        assert set(merged) == set(expected), sorted(set(merged) ^ set(expected))
        out["merged"] = max(float((merged[k] - expected[k]).abs().max()) for k in expected)
    return out


def bf16_actor_smoke(rank: int, world: int, path: str) -> dict:
    """bf16 compute: log-probs near fp32, loss finite, parameters (fp32 masters) change."""
    from hybridflow.engines.models import load_model
    from hybridflow.engines.train import ActorEngine

    engine = ActorEngine(_actor_config(path, tp=1, mini=2 * world, micro=1, lr=1e-3, dtype="bf16"), _loss_config())
    ref = load_model(path)
    batch = _batch_with_old_log_probs(ref, 4 * world, seed=3)
    local = shard_rows(batch, world, rank)
    lp, _ = engine.compute_log_prob(local)
    ref_lp = reference_log_probs(ref, batch).detach().chunk(world)[rank]
    before = full_parameters(engine)
    metrics = engine.update_policy(local)
    after = full_parameters(engine)
    # Unequal batch sizes across ranks must fail on every rank, not hang FSDP.
    mismatch = ""
    try:
        engine.compute_log_prob(local if rank == 0 else make_rl_batch(8, seed=4))
    except ValueError as err:
        mismatch = str(err)
    return {
        "mismatch": mismatch,
        "log_prob": float((lp - ref_lp)[local["response_mask"].bool()].abs().max()),
        "loss": metrics["actor/loss"],
        "dtype": str(next(iter(after.values())).dtype),
        "changed": max(float((after[k] - before[k]).abs().max()) for k in before),
        "mfu": metrics["perf/mfu"],
    }


def _flat_params(engine) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in full_parameters(engine).items()}


def checkpoint_resume_and_export(rank: int, world: int, path: str, root: str, export_dir: str) -> dict:
    """Save after step 1; (a) continue to step 2, (b) a fresh engine loads and does step 2.

    Shuffled multi-epoch updates and a warmup schedule make the RNG and the scheduler
    part of what must be restored. Then export to HF format and compare log-probs.
    """
    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, OptimConfig, TrainEngineConfig
    from hybridflow.engines.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from hybridflow.engines.train.export import export_hf

    config = TrainEngineConfig(
        model_path=path, dtype="fp32",
        optim=OptimConfig(lr=1e-3, warmup_steps=3),
        micro_batch=MicroBatchConfig(mini_batch_size=2 * world, micro_batch_size_per_device=1,
                                     epochs=2, shuffle=True),
    )
    batches = [make_rl_batch(4 * world, seed=20 + i) for i in range(2)]
    for b in batches:
        b["old_log_probs"] = torch.full(b["old_log_probs"].shape, -5.0)
    local = [shard_rows(b, world, rank) for b in batches]

    first = ActorEngine(config, _loss_config())
    first.update_policy(local[0])
    saved = save_checkpoint(first, root)
    continued = first.update_policy(local[1])
    expected = _flat_params(first)

    resumed = ActorEngine(config, _loss_config())
    loaded = load_checkpoint(resumed, root)
    step_after_load = resumed.global_step
    again = resumed.update_policy(local[1])
    got = _flat_params(resumed)

    export_hf(resumed, export_dir)
    lp, _ = resumed.compute_log_prob(local[0])
    out = {
        "saved": str(saved), "loaded": str(loaded), "latest": str(latest_checkpoint(root)),
        "step_after_load": step_after_load,
        "param_diff": max(float((got[k] - expected[k]).abs().max()) for k in expected),
        "loss": (continued["actor/loss"], again["actor/loss"]),
        "lr": (continued["actor/lr"], again["actor/lr"]),
        "moved": max(float((got[k] - v.float()).abs().max()) for k, v in _initial(path).items()),
    }
    if rank == 0:
        import transformers

        exported = transformers.AutoModelForCausalLM.from_pretrained(export_dir)
        with torch.no_grad():
            ref_lp = reference_log_probs(exported, batches[0]).chunk(world)[0]
        out["export_log_prob"] = float((lp - ref_lp)[local[0]["response_mask"].bool()].abs().max())
        tok = transformers.AutoTokenizer.from_pretrained(export_dir)
        out["tokenizer_ids"] = tok("hello world")["input_ids"]
    return out


def _initial(path: str) -> dict[str, torch.Tensor]:
    from hybridflow.engines.models import load_model

    return {k: v.detach() for k, v in load_model(path).named_parameters()}


def save_forever(rank: int, world: int, path: str, root: str) -> None:
    """Save checkpoints of increasing steps until killed (for the crash test)."""
    from hybridflow.engines.train import ActorEngine, TrainEngineConfig
    from hybridflow.engines.train.checkpoint import save_checkpoint

    engine = ActorEngine(TrainEngineConfig(model_path=path, dtype="fp32"))
    while True:
        engine.global_step += 1
        save_checkpoint(engine, root, keep_last=2)


def critic_and_reward_match_reference(rank: int, world: int, critic_path: str, rm_path: str, tp: int) -> dict:
    """CriticEngine values + one update, and RewardModelEngine scores, vs plain models."""
    from hybridflow.algorithms import value_loss
    from hybridflow.engines.models import load_model
    from hybridflow.engines.train import (
        CriticEngine, CriticLossConfig, MicroBatchConfig, OptimConfig, RewardModelEngine, TrainEngineConfig,
    )

    dp = world // tp
    n = 4 * dp
    config = TrainEngineConfig(
        model_path=critic_path, dtype="fp32", tp_size=tp, pack_sequences=True,
        optim=OptimConfig(lr=1e-3, grad_clip=1e9),
        micro_batch=MicroBatchConfig(mini_batch_size=n, micro_batch_size_per_device=2),
    )
    engine = CriticEngine(config, CriticLossConfig(cliprange_value=0.2))
    torch.manual_seed(0)  # same value-head init as the engine (config.seed = 0)
    ref = load_model(critic_path, "critic")
    batch = make_rl_batch(n, seed=30)
    local = shard_rows(batch, dp, engine.dp_rank)
    r = batch["responses"].shape[1]
    mask = batch["response_mask"].bool()

    def ref_values():
        return ref(batch["input_ids"], batch["attention_mask"], batch["position_ids"])[:, -r - 1 : -1]

    values = engine.compute_values(local)
    out = {"values": float((values - ref_values().detach().chunk(dp)[engine.dp_rank])
                           [mask.chunk(dp)[engine.dp_rank]].abs().max())}
    batch["values"] = ref_values().detach() + 0.3 * torch.randn(n, r, generator=torch.Generator().manual_seed(2))
    initial = {hf_name(k): v.detach().clone() for k, v in ref.named_parameters()}
    metrics = engine.update_critic(shard_rows(batch, dp, engine.dp_rank))
    opt = reference_optimizer(ref, lr=1e-3, weight_decay=0.01)
    loss, _ = value_loss(ref_values(), batch["values"], batch["returns"], batch["response_mask"], cliprange_value=0.2)
    loss.backward()
    opt.step()
    out["vf_loss"] = (metrics["critic/vf_loss"], loss.item())
    out["param"] = param_update_error(full_parameters(engine), ref, initial)

    rm = RewardModelEngine(TrainEngineConfig(model_path=rm_path, dtype="fp32", tp_size=tp))
    scores = rm.compute_scores(local)
    ref_rm = load_model(rm_path, "reward")
    with torch.no_grad():
        full = ref_rm(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    last = batch["attention_mask"].shape[1] - 1 - batch["attention_mask"].flip(-1).argmax(-1)
    expected = full.gather(1, last[:, None])[:, 0].chunk(dp)[rm.dp_rank]
    out["scores"] = float((scores - expected).abs().max())
    return out


def tied_tp_checkpoint_across_layouts(rank: int, world: int, path: str, root: str, export_dir: str) -> dict:
    """A tied-embedding actor at dp 1 x tp 2 takes a step and saves; an engine at dp 2 x tp 1
    loads that checkpoint (DCP reshards by global name and shape) and both take the same
    next step. Then the tp 2 engine exports to HF format, where lm_head is tied again."""
    from hybridflow.engines.train import ActorEngine
    from hybridflow.engines.train.checkpoint import load_checkpoint, save_checkpoint
    from hybridflow.engines.train.export import export_hf

    def config(tp: int):
        return _actor_config(path, tp=tp, mini=4, micro=1, lr=1e-2)  # one mini-batch: same on both layouts

    batches = [make_rl_batch(4, seed=30 + i) for i in range(2)]
    for b in batches:
        b["old_log_probs"] = torch.full(b["old_log_probs"].shape, -5.0)
    tp_engine = ActorEngine(config(2), _loss_config())
    tp_engine.update_policy(batches[0])  # tp ranks of one dp group see the whole batch
    save_checkpoint(tp_engine, root)
    saved = _flat_params(tp_engine)
    dp_engine = ActorEngine(config(1), _loss_config())
    load_checkpoint(dp_engine, root)
    loaded = _flat_params(dp_engine)
    tp_engine.update_policy(batches[1])
    dp_engine.update_policy(shard_rows(batches[1], world, rank))
    after_tp, after_dp = _flat_params(tp_engine), _flat_params(dp_engine)
    lp, _ = tp_engine.compute_log_prob(batches[0])
    export_hf(tp_engine, export_dir)
    out = {
        "names": sorted(saved),
        "load_diff": max(float((loaded[k] - saved[k]).abs().max()) for k in saved),
        "step_diff": max(float((after_tp[k] - after_dp[k]).abs().max()) for k in after_tp),
        "moved": max(float((after_tp[k] - saved[k]).abs().max()) for k in saved),
    }
    if rank == 0:
        import transformers

        exported = transformers.AutoModelForCausalLM.from_pretrained(export_dir)
        out["export_tied"] = exported.lm_head.weight is exported.model.embed_tokens.weight
        with torch.no_grad():
            ref_lp = reference_log_probs(exported, batches[0])
        out["export_log_prob"] = float((lp - ref_lp)[batches[0]["response_mask"].bool()].abs().max())
    return out


def families_match_reference(rank: int, world: int, runs: list[tuple[str, int, int]]) -> list[dict]:
    """actor_matches_reference for each (model dir, tp, LoRA rank) in `runs`, in one set of
    ranks: one step, two with LoRA (A first moves in the second)."""
    return [actor_matches_reference(rank, world, path, tp, 2 if lora else 1, False, lora) for path, tp, lora in runs]


def _all_stages(engine, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The union of every pipeline stage's `tensors` (HF name -> full tensor), on every rank."""
    import torch.distributed as dist

    if engine.pp_group is None:
        return tensors
    parts = [None] * dist.get_world_size(engine.pp_group)
    dist.all_gather_object(parts, {k: v.cpu() for k, v in tensors.items()}, group=engine.pp_group)
    merged = {}
    for part in parts:
        assert not set(part) & set(merged), sorted(set(part) & set(merged))  # a parameter lives on one stage
        merged.update(part)
    return merged


def pipeline_actor_matches_reference(rank: int, world: int, path: str, pp: int, tp: int, steps: int) -> dict:
    """ActorEngine with pp stages (x dp x tp) vs a plain single-process model on the global batch.

    Log-probs through the pipeline; each stage's gradients of a token-mean policy-gradient
    loss over 4 micro-batches (the schedule's own scaling off, each micro-batch normalised
    by the global token count); then `steps` full PPO updates (2 mini-batches of 4
    micro-batches per rank): losses and all parameters after each AdamW step.
    """
    from hybridflow.algorithms import agg_loss, compute_aggregation_scale, torch_all_reduce_sum
    from hybridflow.engines.train import ActorEngine

    dp = world // (pp * tp)
    n, mini, micro, lr = 8 * dp, 4 * dp, 1, 1e-3
    config = _actor_config(path, tp=tp, mini=mini, micro=micro, lr=lr, pp_size=pp)
    engine = ActorEngine(config, _loss_config())
    ref = reference_model(path, config)
    ref_opt = reference_optimizer(ref, lr=lr, weight_decay=0.01)
    dp_rank = engine.dp_rank
    out: dict = {"stage": engine.pp_rank, "stage_params": sorted(n for n, _ in engine.named_sharded_parameters())}

    batch = _batch_with_old_log_probs(ref, n, seed=1)
    local = shard_rows(batch, dp, dp_rank)
    mask = batch["response_mask"].bool()
    lp, ent = engine.compute_log_prob(local, with_entropy=True)
    ref_lp = reference_log_probs(ref, batch).detach()
    out["log_prob"] = float((lp - ref_lp.chunk(dp)[dp_rank])[mask.chunk(dp)[dp_rank]].abs().max())
    out["entropy_shape"] = tuple(ent.shape)
    # The reference policy: a frozen engine (no optimizer) with the same pipeline layout.
    frozen_lp, _ = ActorEngine(config, trainable=False).compute_log_prob(local)
    out["frozen_log_prob"] = float((frozen_lp - ref_lp.chunk(dp)[dp_rank])[mask.chunk(dp)[dp_rank]].abs().max())

    micro_batches = [shard_rows(local, 4, i) for i in range(4)]
    agg = compute_aggregation_scale([m["response_mask"] for m in micro_batches], dp_size=dp,
                                    all_reduce_sum=torch_all_reduce_sum(engine.dp_group))
    engine.model.train()

    def pg_loss(log_probs, entropy, mb):
        loss = agg_loss(log_probs * mb["advantages"], mb["response_mask"], "token-mean", agg)
        return loss, {"loss": loss.detach()}, {}

    summed, _ = engine.pipeline.train_mini_batch(micro_batches, ["advantages", "response_mask"], pg_loss,
                                                 temperature=1.0, chunk_size=7, with_entropy=False)
    ref_loss = agg_loss(reference_log_probs(ref, batch) * batch["advantages"], batch["response_mask"], "token-mean")
    ref_loss.backward()
    dp_loss = torch.tensor([summed["loss"]], dtype=torch.float64)
    torch.distributed.all_reduce(dp_loss, group=engine.dp_group)  # each dp rank holds its share / dp
    out["pg_loss"] = (float(dp_loss) / dp, float(ref_loss.detach()))
    _grad_error_then_updates(engine, ref, ref_opt, out, n=n, mini=mini, steps=steps)
    return out


def _grad_error_then_updates(engine, ref, ref_opt, out: dict, *, n: int, mini: int, steps: int) -> None:
    """After a backward on both the engine and the reference: the largest gradient difference
    (over this rank's pipeline stage: every parameter without pipelining), then `steps`
    actor updates on fresh batches, each with its losses and the parameter error (all
    stages gathered)."""
    grads = {name: full_tensor(p.grad) for name, p in engine.named_sharded_parameters() if p.requires_grad}
    ref_grads = {hf_name(name): p.grad for name, p in ref.named_parameters() if p.requires_grad}
    expected = ref_grads if engine.pipeline is None else {k: ref_grads[k] for k in grads}
    assert set(grads) == set(expected), sorted(set(grads) ^ set(expected))
    out["grad"] = max(float((grads[k] - expected[k]).abs().max()) for k in expected)
    out["grad_scale"] = max(float(g.abs().max()) for g in ref_grads.values())
    engine.optimizer.zero_grad(set_to_none=True)
    ref_opt.zero_grad(set_to_none=True)

    dp = engine.dp_size
    initial = {hf_name(k): v.detach().clone() for k, v in ref.named_parameters()}
    out["loss"], out["param"] = [], []
    for step in range(steps):
        batch = _batch_with_old_log_probs(ref, n, seed=10 + step)
        metrics = engine.update_policy(shard_rows(batch, dp, engine.dp_rank))
        ref_losses = reference_actor_update(ref, ref_opt, batch, dp=dp, per_rank=mini // dp,
                                            loss_config=engine.loss_config, grad_clip=1.0)
        out["loss"].append((metrics["actor/loss"], sum(ref_losses) / len(ref_losses)))
        out["param"].append(param_update_error(_all_stages(engine, full_parameters(engine)), ref, initial))


def pipeline_checkpoint_across_layouts(rank: int, world: int, path: str, root: str) -> dict:
    """pp 2 <-> dp 2 through DCP: a pp=2 actor takes a step and saves; a dp=2 actor loads it
    (model, AdamW moments, step, schedule) and both take the same next step; then the dp=2
    actor saves and a fresh pp=2 actor loads that and takes the third step with it. The pp=2
    actor also exports to HF format after its first step (every stage's weights, exactly)."""
    import transformers

    from hybridflow.engines.train import ActorEngine
    from hybridflow.engines.train.checkpoint import load_checkpoint, save_checkpoint
    from hybridflow.engines.train.export import export_hf

    def engine(pp: int):
        config = _actor_config(path, tp=1, mini=4, micro=1, lr=1e-2, pp_size=pp)
        config.optim.warmup_steps = 2  # the lr schedule's position is part of what must move
        return ActorEngine(config, _loss_config())

    batches = [make_rl_batch(4, seed=40 + i) for i in range(3)]
    for b in batches:
        b["old_log_probs"] = torch.full(b["old_log_probs"].shape, -5.0)
    dp_shard = [shard_rows(b, world, rank) for b in batches]

    def params(e):
        return _all_stages(e, _flat_params(e))

    pp_engine = engine(2)
    pp_engine.update_policy(batches[0])  # every stage gets the whole batch (dp = 1)
    save_checkpoint(pp_engine, f"{root}/pp")
    saved = params(pp_engine)
    export_hf(pp_engine, f"{root}/export")
    exported = dict(transformers.AutoModelForCausalLM.from_pretrained(f"{root}/export").named_parameters())
    dp_engine = engine(1)
    load_checkpoint(dp_engine, f"{root}/pp")
    out = {"load_diff": max(float((v - saved[k]).abs().max()) for k, v in params(dp_engine).items()),
           "names": sorted(params(dp_engine)) == sorted(saved), "step": dp_engine.global_step,
           "export_names": sorted(exported) == sorted(saved),
           "export_diff": max(float((exported[k].detach() - saved[k]).abs().max()) for k in saved)}
    m_pp = pp_engine.update_policy(batches[1])
    m_dp = dp_engine.update_policy(dp_shard[1])
    after_pp, after_dp = params(pp_engine), params(dp_engine)
    out["step_diff"] = max(float((after_pp[k] - after_dp[k]).abs().max()) for k in after_pp)
    out["moved"] = max(float((after_pp[k] - saved[k]).abs().max()) for k in saved)
    out["lr"] = (m_pp["actor/lr"], m_dp["actor/lr"])

    save_checkpoint(dp_engine, f"{root}/dp")
    back = engine(2)
    load_checkpoint(back, f"{root}/dp")
    out["back_load_diff"] = max(float((v - after_dp[k]).abs().max()) for k, v in params(back).items())
    back.update_policy(batches[2])
    dp_engine.update_policy(dp_shard[2])
    final_back, final_dp = params(back), params(dp_engine)
    out["back_step_diff"] = max(float((final_back[k] - final_dp[k]).abs().max()) for k in final_dp)
    return out


def pipeline_families_match_reference(rank: int, world: int, paths: list[str]) -> list[dict]:
    """pipeline_actor_matches_reference at pp 2 (one decoder layer per stage) for each model
    dir, one step each, in one set of ranks."""
    return [pipeline_actor_matches_reference(rank, world, path, 2, 1, 1) for path in paths]


def pipeline_critic_matches_reference(rank: int, world: int, path: str, pp: int) -> dict:
    """CriticEngine with pp stages (x dp) vs a plain critic: values, then one value-loss update
    of 2 mini-batches x 2 micro-batches per rank (loss, all parameters after the steps)."""
    from hybridflow.algorithms import value_loss
    from hybridflow.engines.models import load_model
    from hybridflow.engines.train import CriticEngine, CriticLossConfig, MicroBatchConfig, OptimConfig, TrainEngineConfig

    dp = world // pp
    n, mini = 8 * dp, 4 * dp
    config = TrainEngineConfig(model_path=path, dtype="fp32", pp_size=pp, optim=OptimConfig(lr=1e-3, grad_clip=1e9),
                               micro_batch=MicroBatchConfig(mini_batch_size=mini, micro_batch_size_per_device=2,
                                                            forward_micro_batch_size_per_device=3))
    engine = CriticEngine(config, CriticLossConfig(cliprange_value=0.2))
    torch.manual_seed(0)  # same value-head init as the engine (config.seed = 0)
    ref = load_model(path, "critic")
    batch = make_rl_batch(n, seed=30)
    r = batch["responses"].shape[1]

    def ref_values(b):
        return ref(b["input_ids"], b["attention_mask"], b["position_ids"])[:, -r - 1 : -1]

    mask = batch["response_mask"].bool().chunk(dp)[engine.dp_rank]
    values = engine.compute_values(shard_rows(batch, dp, engine.dp_rank))
    out = {"values": float((values - ref_values(batch).detach().chunk(dp)[engine.dp_rank])[mask].abs().max())}
    batch["values"] = ref_values(batch).detach() + 0.3 * torch.randn(n, r, generator=torch.Generator().manual_seed(2))
    initial = {hf_name(k): v.detach().clone() for k, v in ref.named_parameters()}
    metrics = engine.update_critic(shard_rows(batch, dp, engine.dp_rank))
    opt = reference_optimizer(ref, lr=1e-3, weight_decay=0.01)
    from train_harness import global_mini_batches

    losses = []
    for m in global_mini_batches(batch, dp, mini // dp):
        loss, _ = value_loss(ref_values(m), m["values"], m["returns"], m["response_mask"], cliprange_value=0.2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["vf_loss"] = (metrics["critic/vf_loss"], sum(losses) / len(losses))
    out["param"] = param_update_error(_all_stages(engine, full_parameters(engine)), ref, initial)
    return out
