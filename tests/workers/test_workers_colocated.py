"""All roles colocated on one 2-rank pool, driven like the trainer drives them.

Roles (one set of processes, started once for the module): ``actor`` (full fine-tuning,
generation tp 1, so two micro-DP generation groups, frozen reference engine), ``lora_actor``
(LoRA, generation tp 2 over both ranks, reference = adapters off), ``critic`` and
``reward``. Tolerances: fp32 log-probs from the rollout engine, the training engine and a
plain Hugging Face forward agree within 1e-4 (different kernels and reduction orders).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hybridflow.controller import DispatchError, RoleSpec
from hybridflow.workers import (
    ActorRolloutRefWorker,
    CriticWorker,
    PlacementSpec,
    RewardModelWorker,
    build_role_groups,
    shutdown_role_groups,
)
from workers_setup import (
    LOGPROB_TOL,
    actor_config,
    critic_config,
    hf_log_probs,
    hf_reward_scores,
    make_prompts,
    masked_max_diff,
    reward_config,
)

WORLD = 2
PROMPT_LENGTHS = [5, 3, 4, 2]
N_SAMPLES = 2
BATCH = len(PROMPT_LENGTHS) * N_SAMPLES


@pytest.fixture(scope="module")
def groups(ray_local, tiny_llama_dir, reward_model_dir):
    roles = {
        "actor": RoleSpec(ActorRolloutRefWorker, (actor_config(
            tiny_llama_dir, gen_tp=1, mini_batch_size=BATCH, use_reference=True),)),
        "lora_actor": RoleSpec(ActorRolloutRefWorker, (actor_config(
            tiny_llama_dir, gen_tp=2, mini_batch_size=len(PROMPT_LENGTHS), use_reference=True, lr=5e-2,
            lora_rank=4),)),
        "critic": RoleSpec(CriticWorker, (critic_config(tiny_llama_dir, mini_batch_size=BATCH),)),
        "reward": RoleSpec(RewardModelWorker, (reward_config(reward_model_dir),)),
    }
    built = build_role_groups(roles, PlacementSpec.colocated([WORLD]))
    try:
        for group in built.values():
            group.init_model()
        yield built
    finally:
        shutdown_role_groups(built)


def rl_step(actor, prompts, seed: int) -> SimpleNamespace:
    """generate -> old/ref log-probs -> update -> generate again, recording every output."""
    gen1 = actor.generate_sequences(prompts)
    old1 = actor.compute_log_prob(gen1)
    ref1 = actor.compute_ref_log_prob(gen1)
    batch = make_training_batch(gen1, old1, ref1, seed)
    metrics = actor.update_actor(batch).meta_info["metrics"]
    gen2 = actor.generate_sequences(prompts)
    return SimpleNamespace(
        gen1=gen1, old1=old1, ref1=ref1, batch=batch, metrics=metrics, gen2=gen2,
        old2=actor.compute_log_prob(gen2), old1_after=actor.compute_log_prob(gen1),
        ref1_after=actor.compute_ref_log_prob(gen1),
    )


def make_training_batch(gen, old, ref, seed: int):
    g = torch.Generator().manual_seed(seed)
    batch = gen.select()
    batch.union(old).union(ref)
    batch.batch["advantages"] = torch.randn(batch.batch["responses"].shape, generator=g)
    return batch


@pytest.fixture(scope="module")
def step(groups):
    prompts = make_prompts(PROMPT_LENGTHS, n=N_SAMPLES, max_new_tokens=6, temperature=1.0, seed=11)
    return rl_step(groups["actor"], prompts, seed=0)


@pytest.fixture(scope="module")
def lora_step(groups):
    return rl_step(groups["lora_actor"], make_prompts(PROMPT_LENGTHS, seed=2), seed=1)


# ----------------------------------------------------------------------- placement

def test_roles_share_the_same_processes(groups):
    pids = {role: [info["pid"] for info in g.worker_info] for role, g in groups.items()}
    assert len({tuple(p) for p in pids.values()}) == 1, pids
    assert len(set(pids["actor"])) == WORLD


# ----------------------------------------------------------------------- generation

def test_generation_output_and_pass_through(step):
    gen = step.gen1
    assert len(gen) == BATCH
    assert gen.batch["responses"].shape == (BATCH, 6)
    assert gen.batch["input_ids"].shape[1] == max(PROMPT_LENGTHS) + 6
    # samples of one prompt are adjacent and carry its non-tensor fields
    assert list(gen.non_tensor_batch["uid"]) == [f"u{i}" for i in range(len(PROMPT_LENGTHS)) for _ in range(N_SAMPLES)]
    assert list(gen.non_tensor_batch["ground_truth"][::N_SAMPLES]) == ["0", "1", "2", "3"]
    assert gen.non_tensor_batch["raw_prompt"][2] == [{"role": "user", "content": "q1"}]
    assert set(gen.non_tensor_batch["data_source"]) == {"toy"}
    assert set(gen.non_tensor_batch["finish_reason"]) == {"length"}  # ignore_eos in the config
    metrics = gen.meta_info["metrics"]
    for key in ("timing_s/generate", "timing_s/reshard_to_generation", "timing_s/reshard_to_training"):
        assert metrics[key] > 0, key
    # generation tp 1 over 2 ranks: every rank gathers the other rank's half of the model
    assert metrics["reshard/comm_bytes"] > 0
    assert gen.meta_info["n"] == N_SAMPLES  # the call's meta_info is kept


def test_micro_dp_groups_draw_their_own_samples(groups):
    actor = groups["actor"]
    # four copies of one prompt: rows 0-1 go to generation group 0, rows 2-3 to group 1
    prompts = make_prompts([4, 4, 4, 4], same=True, seed=5, max_new_tokens=6)
    first = actor.generate_sequences(prompts).batch["responses"]
    again = actor.generate_sequences(prompts).batch["responses"]
    assert not torch.equal(first[0], first[2]), "both generation groups drew the same random numbers"
    assert not torch.equal(first, again), "an unseeded call repeated the previous call's samples"


def test_seeded_generation_is_reproducible(groups):
    actor = groups["actor"]
    prompts = make_prompts([4, 4, 4, 4], same=True, seed=5, max_new_tokens=6)
    prompts.meta_info["seed"] = 123
    first = actor.generate_sequences(prompts).batch["responses"]
    second = actor.generate_sequences(prompts).batch["responses"]
    assert torch.equal(first, second)
    assert not torch.equal(first[0], first[2])


def test_do_sample_false_is_greedy(groups):
    actor = groups["actor"]
    prompts = make_prompts([4, 4, 4, 4], same=True, seed=5, max_new_tokens=6, do_sample=False)
    out = actor.generate_sequences(prompts)
    responses = out.batch["responses"]
    # greedy ignores the per-group seeds: the same prompt gives the same tokens everywhere
    assert all(torch.equal(responses[0], responses[i]) for i in range(1, 4))
    # greedy rows report log-probs at temperature 1, the actor's default here
    old = actor.compute_log_prob(out)
    assert masked_max_diff(old.batch["old_log_probs"], out.batch["rollout_log_probs"],
                           out.batch["response_mask"]) < LOGPROB_TOL


def test_batch_not_divisible_by_generation_groups_is_refused(groups):
    with pytest.raises(DispatchError, match="not divisible"):
        groups["actor"].generate_sequences(make_prompts([3, 2, 4]))


# ----------------------------------------------------------------------- log-probs

def test_old_log_probs_equal_rollout_log_probs(step):
    for gen, old in ((step.gen1, step.old1), (step.gen2, step.old2)):
        mask = gen.batch["response_mask"]
        assert masked_max_diff(old.batch["old_log_probs"], gen.batch["rollout_log_probs"], mask) < LOGPROB_TOL
        entropy = old.batch["entropys"][mask.bool()]
        assert entropy.shape[0] == int(mask.sum()) and bool((entropy > 0).all())


def test_reference_is_the_frozen_initial_policy(step):
    mask = step.gen1.batch["response_mask"]
    assert masked_max_diff(step.ref1.batch["ref_log_probs"], step.old1.batch["old_log_probs"], mask) < 1e-5
    assert torch.equal(step.ref1_after.batch["ref_log_probs"], step.ref1.batch["ref_log_probs"])


def test_update_changes_the_policy_and_the_next_generation_uses_it(step):
    mask = step.gen1.batch["response_mask"]
    moved = masked_max_diff(step.old1_after.batch["old_log_probs"], step.old1.batch["old_log_probs"], mask)
    assert moved > 1e-2, "the update did not change the actor"
    # the second generation's log-probs match the updated actor, so it used the new weights
    gen2 = step.gen2
    assert masked_max_diff(step.old2.batch["old_log_probs"], gen2.batch["rollout_log_probs"],
                           gen2.batch["response_mask"]) < LOGPROB_TOL


def test_dp2_update_metrics_come_back_once(step):
    metrics = step.metrics
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/lr", "perf/mfu", "timing_s/update_actor"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["actor/lr"] == pytest.approx(1e-2)


# ----------------------------------------------------------------------- LoRA actor

def test_lora_reference_is_the_base_model_and_generation_uses_merged_weights(lora_step):
    s = lora_step
    mask = s.gen1.batch["response_mask"]
    # fresh adapters (B = 0) leave the base model unchanged
    assert masked_max_diff(s.ref1.batch["ref_log_probs"], s.old1.batch["old_log_probs"], mask) < 1e-5
    assert masked_max_diff(s.old1.batch["old_log_probs"], s.gen1.batch["rollout_log_probs"], mask) < LOGPROB_TOL
    assert masked_max_diff(s.old1_after.batch["old_log_probs"], s.old1.batch["old_log_probs"], mask) > 1e-2
    assert torch.equal(s.ref1_after.batch["ref_log_probs"], s.ref1.batch["ref_log_probs"])
    assert masked_max_diff(s.old2.batch["old_log_probs"], s.gen2.batch["rollout_log_probs"],
                           s.gen2.batch["response_mask"]) < LOGPROB_TOL


# ----------------------------------------------------------------------- persistence

def test_checkpoint_round_trip_restores_training_and_generation(groups, step, tmp_path):
    actor = groups["actor"]
    saved_at = actor.save_checkpoint(str(tmp_path / "ckpt"))
    assert len(set(saved_at)) == 1
    before = actor.compute_log_prob(step.gen1).batch["old_log_probs"]
    actor.update_actor(step.batch)
    changed = actor.compute_log_prob(step.gen1).batch["old_log_probs"]
    mask = step.gen1.batch["response_mask"]
    assert masked_max_diff(changed, before, mask) > 1e-3
    actor.load_checkpoint(str(tmp_path / "ckpt"))
    assert torch.allclose(actor.compute_log_prob(step.gen1).batch["old_log_probs"], before, atol=1e-6)
    gen = actor.generate_sequences(make_prompts(PROMPT_LENGTHS, seed=4))
    old = actor.compute_log_prob(gen)
    assert masked_max_diff(old.batch["old_log_probs"], gen.batch["rollout_log_probs"],
                           gen.batch["response_mask"]) < LOGPROB_TOL


def test_exported_model_matches_the_worker(groups, step, tmp_path):
    actor = groups["actor"]
    out = actor.export_hf(str(tmp_path / "hf"))[0]
    want = actor.compute_log_prob(step.gen2).batch["old_log_probs"]
    got = hf_log_probs(out, step.gen2)
    assert masked_max_diff(got, want, step.gen2.batch["response_mask"]) < LOGPROB_TOL


# ----------------------------------------------------------------------- critic and reward

def critic_batch(gen):
    batch = gen.select(batch_keys=["input_ids", "attention_mask", "position_ids", "responses", "response_mask"],
                       non_tensor_keys=[])
    batch.batch["returns"] = torch.ones(batch.batch["responses"].shape)
    return batch


def test_critic_values_move_towards_returns(groups, step):
    critic = groups["critic"]
    batch = critic_batch(step.gen1)
    mask = batch.batch["response_mask"].bool()

    def error() -> tuple[float, torch.Tensor]:
        values = critic.compute_values(batch).batch["values"]
        return float(((values - 1.0)[mask] ** 2).mean()), values

    start, values = error()
    assert values.shape == mask.shape and values.dtype == torch.float32
    for _ in range(3):
        batch.batch["values"] = values
        metrics = critic.update_critic(batch).meta_info["metrics"]
        _, values = error()
    end, _ = error()
    assert math.isfinite(metrics["critic/vf_loss"]) and metrics["timing_s/update_critic"] > 0
    assert end < 0.5 * start, (start, end)


def test_critic_checkpoint_round_trip(groups, step, tmp_path):
    critic = groups["critic"]
    batch = critic_batch(step.gen1)
    saved = critic.compute_values(batch).batch["values"]
    critic.save_checkpoint(str(tmp_path / "critic"))
    batch.batch["values"] = saved
    critic.update_critic(batch)
    assert not torch.allclose(critic.compute_values(batch).batch["values"], saved, atol=1e-4)
    critic.load_checkpoint(str(tmp_path / "critic"))
    assert torch.allclose(critic.compute_values(batch).batch["values"], saved, atol=1e-6)


def test_reward_model_scores_equal_a_single_process_forward(groups, step, reward_model_dir):
    scores = groups["reward"].compute_rm_score(step.gen1).batch["rm_scores"]
    assert scores.shape == (BATCH,)
    want = hf_reward_scores(reward_model_dir, step.gen1)
    assert torch.allclose(scores, want, atol=1e-4), (scores, want)

