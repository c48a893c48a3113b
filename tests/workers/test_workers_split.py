"""Split placement: the actor on one pool, critic and reward model on another.

Each pool has one slot, so the actor trains and generates alone (world size 1) while the
critic and the reward model share the second process. Data moves between the groups
through the controller (and Ray's object store), as in a split-placement trainer.
"""

from __future__ import annotations

import pytest

from hybridflow.controller import RoleSpec, WorkerError
from hybridflow.workers import (
    ActorRolloutRefWorker,
    CriticWorker,
    PlacementSpec,
    RewardModelWorker,
    build_role_groups,
    shutdown_role_groups,
)
from workers_setup import LOGPROB_TOL, actor_config, critic_config, make_prompts, masked_max_diff, reward_config

PLACEMENT = PlacementSpec(pools={"actor_pool": [1], "critic_pool": [1]},
                          mapping={"actor": "actor_pool", "critic": "critic_pool", "reward": "critic_pool"})


@pytest.fixture(scope="module")
def groups(ray_local, tiny_llama_dir, reward_model_dir):
    roles = {
        "actor": RoleSpec(ActorRolloutRefWorker, (actor_config(
            tiny_llama_dir, gen_tp=1, mini_batch_size=4, use_reference=False),)),
        "critic": RoleSpec(CriticWorker, (critic_config(tiny_llama_dir, mini_batch_size=4),)),
        "reward": RoleSpec(RewardModelWorker, (reward_config(reward_model_dir),)),
    }
    built = build_role_groups(roles, PLACEMENT)
    try:
        for group in built.values():
            group.init_model()
        yield built
    finally:
        shutdown_role_groups(built)


def test_roles_run_where_the_mapping_says(groups):
    pid = {role: [info["pid"] for info in g.worker_info] for role, g in groups.items()}
    assert pid["critic"] == pid["reward"]
    assert set(pid["actor"]).isdisjoint(pid["critic"])
    assert groups["actor"].resource_pool is not groups["critic"].resource_pool


def test_generation_flows_into_the_other_pool(groups):
    gen = groups["actor"].generate_sequences(make_prompts([3, 5], n=2, max_new_tokens=6))
    assert len(gen) == 4
    old = groups["actor"].compute_log_prob(gen)
    assert masked_max_diff(old.batch["old_log_probs"], gen.batch["rollout_log_probs"],
                           gen.batch["response_mask"]) < LOGPROB_TOL
    values = groups["critic"].compute_values(gen).batch["values"]
    assert values.shape == gen.batch["responses"].shape
    scores = groups["reward"].compute_rm_score(gen).batch["rm_scores"]
    assert scores.shape == (4,)


def test_actor_without_reference_refuses_reference_log_probs(groups):
    gen = groups["actor"].generate_sequences(make_prompts([3, 5], max_new_tokens=6))
    with pytest.raises(WorkerError, match="use_reference=True"):
        groups["actor"].compute_ref_log_prob(gen)
