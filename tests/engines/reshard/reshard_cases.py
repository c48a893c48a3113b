"""Bodies of the multi-process resharding tests, run on every rank by `run_ranks`.

Each case shards a small Llama over the gloo world, reshards it into the rollout engine
with one or more methods, and returns per-rank facts for the test to assert on: whether
every generation-layout weight equals the slice of the full model, whether greedy
generation equals that of a single-process engine holding the full model, and the
measured bytes next to the closed-form prediction.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
from hybridflow.engines.train.distributed import full_tensor

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def save_perturbed_llama(path: Path, *, seed: int = 0, **sizes) -> Path:
    """A tiny Llama whose norms are not all ones (so a misplaced norm changes outputs)
    and whose logits are sharp (so greedy choices have no near-ties)."""
    import transformers

    from hybridflow.engines.models import make_tiny_config

    config = make_tiny_config("llama", **sizes)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        model.lm_head.weight.mul_(3.0)
    model.save_pretrained(path, safe_serialization=True)
    return Path(path)


def prompts(vocab: int, lengths=(5, 2, 7), seed: int = 1):
    """Left-padded random prompts in a DataProto."""
    from hybridflow.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, width - n:] = 1
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask})


def greedy(engine, vocab: int):
    from hybridflow.engines.rollout import SamplingParams

    return engine.generate(prompts(vocab), SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True))


def reference_engine(hf_config, full: dict[str, torch.Tensor]):
    """A single-process fp32 rollout engine holding the full model."""
    from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig

    engine = NativeRolloutEngine(hf_config, RolloutConfig(dtype=torch.float32))
    engine.load_weights(full.items())
    return engine


def named_generation_weights(rollout) -> dict[str, torch.Tensor]:
    """The rollout engine's weights by HF name (each backend stores them its own way)."""
    from hybridflow.engines.rollout import HFRolloutEngine, NativeRolloutEngine

    if isinstance(rollout, NativeRolloutEngine):
        return rollout.model.weights.views
    if isinstance(rollout, HFRolloutEngine):
        return rollout.views
    raise TypeError(f"no weight table for a {type(rollout).__name__}")


def slices_equal(rollout, full: dict[str, torch.Tensor], dtype: torch.dtype) -> list[str]:
    """Names whose generation-layout weight differs from its slice of the full model."""
    from hybridflow.engines.rollout import shard_for_rank

    views = named_generation_weights(rollout)
    bad = []
    for name, tensor in full.items():
        want = shard_for_rank(tensor, name, rollout.tp_rank, rollout.tp_size).to(dtype)
        if not torch.equal(views[name], want):
            bad.append(name)
    return bad


def compare_generation(rollout, ref, vocab: int) -> dict:
    out, want = greedy(rollout, vocab), greedy(ref, vocab)
    return {
        "tokens_equal": torch.equal(out.batch["responses"], want.batch["responses"]),
        "logprob_diff": float((out.batch["rollout_log_probs"] - want.batch["rollout_log_probs"]).abs().max()),
        "log_probs": out.batch["rollout_log_probs"],
    }


def shard_with_fsdp(model, world: int, aligned: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hybridflow.engines.reshard import aligned_placement_fn

    mesh = init_device_mesh("cpu", (world,))
    fn = aligned_placement_fn({id(p): n for n, p in model.named_parameters()}) if aligned else None
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, shard_placement_fn=fn)
    fully_shard(model, mesh=mesh, shard_placement_fn=fn)


def predicted(model_sizes, stats, train_tp: int, gen_dtype: torch.dtype, pp: int = 1, stage=None) -> dict:
    """The formula's costs (fp32 training) for a rank of pipeline stage sizes `stage` (pp > 1)."""
    from hybridflow.engines.reshard import predicted_costs

    costs = predicted_costs(model_sizes, stats.method, world_size=stats.world_size, train_tp=train_tp,
                            gen_tp=stats.gen_tp, gen_bytes=gen_dtype.itemsize, train_bytes=4, pp_size=pp, stage=stage)
    return {**asdict(costs), "peak_bytes": costs.peak_bytes}


def transition(hybrid, full: dict[str, torch.Tensor], ref, vocab: int, dtype: torch.dtype, predict) -> dict:
    """One training -> generation -> training round trip, checked: generation weights vs the
    full model, greedy generation vs `ref` (fp32 only), bytes, `predict(stats)` beside them,
    and the generation memory released before and after."""
    released_before = hybrid.rollout.weight_storage_bytes()
    stats = hybrid.to_generation()
    res = {"stats": stats.as_dict(), "predicted": predict(stats), "bad_slices": slices_equal(hybrid.rollout, full, dtype),
           "released_before": released_before}
    if dtype == torch.float32:
        gen = compare_generation(hybrid.rollout, ref, vocab)
        res.update(tokens_equal=gen["tokens_equal"], logprob_diff=gen["logprob_diff"])
    hybrid.to_training()
    res["released_after"] = hybrid.rollout.weight_storage_bytes()
    return res


def fsdp_methods(rank: int, world: int, model_dir: str, settings: list[tuple[str, int, str, bool]],
                 backend: str = "native") -> list[dict]:
    """FSDP2 (tp=1) over the world into rollout backend `backend`; settings: (method,
    gen_tp, gen dtype, aligned placement)."""
    import transformers

    from hybridflow.engines.reshard import HybridEngine, ModelSizes
    from hybridflow.engines.rollout import RolloutConfig

    results = []
    for aligned in sorted({s[3] for s in settings}):
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        full = {n: p.detach().clone() for n, p in model.named_parameters()}
        sizes = ModelSizes.from_model(model)
        ref = reference_engine(model.config, full)
        shard_with_fsdp(model, world, aligned)
        for method, gen_tp, dtype_name, want_aligned in settings:
            if want_aligned != aligned:
                continue
            dtype = DTYPES[dtype_name]
            hybrid = HybridEngine.build(model.named_parameters, model.config, RolloutConfig(dtype=dtype),
                                        gen_tp=gen_tp, method=method, backend=backend)
            res = transition(hybrid, full, ref, model.config.vocab_size, dtype,
                             lambda stats: predicted(sizes, stats, 1, dtype))
            results.append({"setting": (method, gen_tp, dtype_name, aligned), **res})
    return results


def hf_backend(rank: int, world: int, model_dir: str, settings: list[tuple[str, int, str, bool]]) -> dict:
    """`fsdp_methods` into the "hf" backend, and the errors for t_g > 1: from the
    HybridEngine's build, and from the engine itself given a two-rank group."""
    import torch.distributed as dist
    import transformers

    from hybridflow.engines.reshard import HybridEngine
    from hybridflow.engines.rollout import HFRolloutEngine, RolloutConfig

    out = {"results": fsdp_methods(rank, world, model_dir, settings, backend="hf")}
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    shard_with_fsdp(model, world, aligned=True)
    try:
        HybridEngine.build(model.named_parameters, model.config, RolloutConfig(dtype=torch.float32),
                           gen_tp=world, method="hybrid", backend="hf")
        out["tp_error"] = None
    except ValueError as err:
        out["tp_error"] = str(err)
    try:
        HFRolloutEngine(model.config, RolloutConfig(), process_group=dist.new_group(list(range(world))))
        out["engine_tp_error"] = None
    except ValueError as err:
        out["engine_tp_error"] = str(err)
    return out


def _rl_batch(n: int, vocab: int, seed: int = 3) -> dict[str, torch.Tensor]:
    """n unpadded sequences of 4 prompt + 4 response tokens with random advantages."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, 8), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(8).expand(n, 8).clone(),
        "responses": ids[:, 4:],
        "response_mask": torch.ones(n, 4, dtype=torch.long),
        "advantages": torch.randn(n, 4, generator=g),
    }


def _full_params(engine) -> dict[str, torch.Tensor]:
    return {n: full_tensor(p).detach().clone() for n, p in engine.named_sharded_parameters()}


def actor_update_reaches_generation(rank: int, world: int, model_dir: str, tp: int) -> dict:
    """ActorEngine over (dp, tp) with aligned FSDP shards: reshard, one optimizer step,
    reshard again; generation must use the new weights. A second engine with FSDP's
    default placement takes the same step, to show the aligned placement trains alike."""
    from hybridflow.engines.models import load_hf_config
    from hybridflow.engines.reshard import HybridEngine, ModelSizes, aligned_shard_dim
    from hybridflow.engines.rollout import RolloutConfig
    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, OptimConfig, TrainEngineConfig

    dp = world // tp
    config = TrainEngineConfig(
        model_path=model_dir, dtype="fp32", tp_size=tp,
        optim=OptimConfig(lr=1e-2, weight_decay=0.0, grad_clip=0.0),
        micro_batch=MicroBatchConfig(mini_batch_size=2 * dp, micro_batch_size_per_device=1),
    )
    hf_config = load_hf_config(model_dir)
    aligned = ActorEngine(config, fsdp_shard_dim=aligned_shard_dim)
    default = ActorEngine(config)
    hybrid = HybridEngine.build(aligned.named_sharded_parameters, hf_config, RolloutConfig(dtype=torch.float32),
                                gen_tp=2, method="hybrid")
    full0 = _full_params(aligned)
    sizes = ModelSizes.from_shapes((n, tuple(t.shape)) for n, t in full0.items())
    out: dict = {"layout": {p.name: (p.dim, p.num_chunks, p.chunks) for p in hybrid.layout.params}}

    stats0 = hybrid.to_generation()
    out["before"] = {"bad_slices": slices_equal(hybrid.rollout, full0, torch.float32),
                     "stats": stats0.as_dict(), "predicted": predicted(sizes, stats0, tp, torch.float32)}
    lp0 = greedy(hybrid.rollout, hf_config.vocab_size).batch["rollout_log_probs"]
    hybrid.to_training()

    batch = {k: v.chunk(dp)[aligned.dp_rank] for k, v in _rl_batch(2 * dp, hf_config.vocab_size).items()}
    batch["old_log_probs"], _ = aligned.compute_log_prob(batch)
    aligned.update_policy(batch)
    default.update_policy(batch)
    full1, full_default = _full_params(aligned), _full_params(default)
    out["placement_param_diff"] = max(float((full1[n] - full_default[n]).abs().max()) for n in full1)
    out["weights_moved"] = max(float((full1[n] - full0[n]).abs().max()) for n in full1)

    stats1 = hybrid.to_generation()
    gen = compare_generation(hybrid.rollout, reference_engine(hf_config, full1), hf_config.vocab_size)
    out["after"] = {"bad_slices": slices_equal(hybrid.rollout, full1, torch.float32), "stats": stats1.as_dict(),
                    "predicted": predicted(sizes, stats1, tp, torch.float32),
                    "tokens_equal": gen["tokens_equal"], "logprob_diff": gen["logprob_diff"]}
    out["generation_moved"] = float((gen["log_probs"] - lp0).abs().max())
    hybrid.to_training()
    return out


def families_into_hf_backend(rank: int, world: int, model_dirs: list[str]) -> list[dict]:
    """For each model: an ActorEngine sharded by FSDP over the world (dp), weights moved into
    the hf rollout backend by the HybridEngine (t_g = 1), one actor step, moved again. The
    backend must hold exactly the training weights (after the step too) and generate what
    transformers' generate does with them."""
    import transformers

    from hybridflow.engines.models import EAGER_ATTENTION_FAMILIES, load_hf_config
    from hybridflow.engines.reshard import HybridEngine, aligned_shard_dim
    from hybridflow.engines.rollout import RolloutConfig
    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, OptimConfig, TrainEngineConfig

    out = []
    for model_dir in model_dirs:
        hf_config = load_hf_config(model_dir)
        attn = "eager" if hf_config.model_type in EAGER_ATTENTION_FAMILIES else "sdpa"
        engine = ActorEngine(TrainEngineConfig(
            model_path=model_dir, dtype="fp32", attn_implementation=attn,
            optim=OptimConfig(lr=1e-2, weight_decay=0.0, grad_clip=0.0),
            micro_batch=MicroBatchConfig(mini_batch_size=2 * world, micro_batch_size_per_device=1)),
            fsdp_shard_dim=aligned_shard_dim)  # as the actor-rollout worker builds it
        hybrid = HybridEngine.build(engine.named_sharded_parameters, hf_config, RolloutConfig(dtype=torch.float32),
                                    gen_tp=1, method="hybrid", backend="hf")
        hybrid.to_generation()
        hybrid.to_training()
        batch = {k: v.chunk(world)[rank] for k, v in _rl_batch(2 * world, hf_config.vocab_size).items()}
        batch["old_log_probs"], _ = engine.compute_log_prob(batch)
        engine.update_policy(batch)
        full = _full_params(engine)
        hybrid.to_generation()
        views = named_generation_weights(hybrid.rollout)
        res = {"family": hf_config.model_type,
               "weight_diff": max(float((views[n].float() - t).abs().max()) for n, t in full.items()),
               "missing": sorted(set(full) - set(views))}
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
        model.load_state_dict(full, strict=False)
        model.tie_weights()
        gen = greedy(hybrid.rollout, hf_config.vocab_size)
        batch = prompts(hf_config.vocab_size).batch
        ids, mask = batch["input_ids"], batch["attention_mask"]
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen.batch["responses"].shape[1],
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        res["tokens_equal"] = bool(torch.equal(gen.batch["responses"], ref[:, ids.shape[1]:]))
        hybrid.to_training()
        out.append(res)
    return out


def stage_sizes(names, full: dict[str, torch.Tensor]):
    """ModelSizes of the parameters `names` (one pipeline stage's) cut from the full model."""
    from hybridflow.engines.reshard import ModelSizes

    return ModelSizes.from_shapes((n, tuple(full[n].shape)) for n in names)


def actor_engine_methods(rank: int, world: int, model_dir: str, pp: int, tp: int,
                         settings: list[tuple[str, int, str]]) -> list[dict]:
    """A real ActorEngine over a (pp, dp, tp) mesh (fp32, aligned FSDP), resharded into the
    native rollout engine (p_g = 1) with each (method, gen_tp, gen dtype). Every rank checks
    its generation weights against the full model read from disk, greedy generation (fp32)
    against a single-process engine, and its bytes against the formula of its own stage."""
    import transformers

    from hybridflow.engines.reshard import HybridEngine, ModelSizes, aligned_shard_dim
    from hybridflow.engines.rollout import RolloutConfig
    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, TrainEngineConfig

    dp = world // (pp * tp)
    engine = ActorEngine(TrainEngineConfig(
        model_path=model_dir, dtype="fp32", tp_size=tp, pp_size=pp,
        micro_batch=MicroBatchConfig(mini_batch_size=pp * dp, micro_batch_size_per_device=1)),
        fsdp_shard_dim=aligned_shard_dim)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    full = {n: p.detach() for n, p in model.named_parameters()}
    sizes, ref = ModelSizes.from_model(model), reference_engine(model.config, full)
    mine = stage_sizes([n for n, _ in engine.named_sharded_parameters()], full)
    results = []
    for method, gen_tp, dtype_name in settings:
        dtype = DTYPES[dtype_name]
        hybrid = HybridEngine.build(engine.named_sharded_parameters, model.config, RolloutConfig(dtype=dtype),
                                    gen_tp=gen_tp, method=method)
        res = transition(hybrid, full, ref, model.config.vocab_size, dtype,
                         lambda stats: predicted(sizes, stats, tp, dtype, pp, mine))
        results.append({"setting": (method, gen_tp, dtype_name), "stage": engine.pp_rank,
                        "groups": hybrid.grouping.tp_groups, **res})
    return results



def bucketed_sync(rank: int, world: int, model_dir: str, settings: list[tuple[str, int, str]]) -> list[dict]:
    """FSDP2 over the world into the native engine, each setting (method, gen_tp, gen dtype)
    synced unbucketed and with buckets: the load_weights calls the engine received (counted
    around its real load_weights), the dtypes that arrived, and the weights it ends with."""
    import transformers

    from hybridflow.engines.reshard import HybridEngine
    from hybridflow.engines.rollout import RolloutConfig

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref = reference_engine(model.config, full)
    shard_with_fsdp(model, world, aligned=True)
    results = []
    for method, gen_tp, dtype_name in settings:
        dtype = DTYPES[dtype_name]
        for bucket_bytes in (None, 64 << 10):
            hybrid = HybridEngine.build(model.named_parameters, model.config, RolloutConfig(dtype=dtype),
                                        gen_tp=gen_tp, method=method, bucket_bytes=bucket_bytes)
            calls: list[list[tuple[str, torch.dtype]]] = []
            load = hybrid.rollout.load_weights

            def counted(weights, *, sharded=False, load=load, calls=calls):
                weights = list(weights)
                calls.append([(n, t.dtype) for n, t in weights])
                load(weights, sharded=sharded)

            hybrid.rollout.load_weights = counted
            stats = hybrid.to_generation()
            res = {"setting": (method, gen_tp, dtype_name, bucket_bytes), "calls": len(calls),
                   "counted_calls": hybrid.load_calls, "names": sorted(n for c in calls for n, _ in c),
                   "dtypes": sorted({str(d) for c in calls for _, d in c}),
                   "bad_slices": slices_equal(hybrid.rollout, full, dtype), "buffer_bytes": stats.buffer_bytes}
            if dtype == torch.float32:
                res["tokens_equal"] = compare_generation(hybrid.rollout, ref, model.config.vocab_size)["tokens_equal"]
            hybrid.to_training()
            results.append(res)
    return results
