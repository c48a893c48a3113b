"""A generation-only rollout pool beside the actor's training pool (trainer.mode async).

The actor trains on two ranks (FSDP shards), the rollout worker generates on a third
process; weights cross by the WeightBridge (torch.distributed gloo), not the controller.
"""

from __future__ import annotations

import dataclasses

import pytest
import ray
import torch
from safetensors.torch import load_file

from hybridflow.controller import RoleSpec
from hybridflow.engines.rollout.partial import POLICY_VERSION
from hybridflow.protocol import DataProto
from hybridflow.workers import ActorRolloutRefWorker, PlacementSpec, build_role_groups, shutdown_role_groups
from hybridflow.workers.rollout import RolloutWorker, connect_weight_bridge
from workers_setup import actor_config, make_prompts

pytestmark = pytest.mark.slow  # three processes on two cores: ~70 s

PLACEMENT = PlacementSpec(pools={"actor_pool": [2], "rollout_pool": [1]},
                          mapping={"actor": "actor_pool", "rollout": "rollout_pool"})


@pytest.fixture(scope="module")
def pools(ray_local, tiny_llama_dir):
    # The update computes the old log-probs itself (one optimizer step over the 4 samples).
    cfg = dataclasses.replace(actor_config(tiny_llama_dir, gen_tp=1, mini_batch_size=4, use_reference=False),
                              fuse_old_log_probs=True)
    built = build_role_groups({"actor": RoleSpec(ActorRolloutRefWorker, (cfg,)),
                               "rollout": RoleSpec(RolloutWorker, (cfg,))}, PLACEMENT)
    try:
        for group in built.values():
            group.init_model()
        connect_weight_bridge(built["actor"], built["rollout"], bucket_bytes=64 << 10)  # several buckets
        yield built
    finally:
        shutdown_role_groups(built)


def _sync(pools, version):
    sent = pools["actor"].send_weights(version).get()[0]  # returns once the receiver threads took it
    return sent, pools["rollout"].load_version(version)[0]


def test_transferred_weights_equal_the_trained_ones_bit_for_bit(pools, tmp_path):
    actor, rollout = pools["actor"], pools["rollout"]
    sent, received = _sync(pools, 0)
    initial = rollout.generation_weights()
    gen = actor.generate_sequences(make_prompts([3, 5, 4, 2], n=1, max_new_tokens=6))
    gen.batch["advantages"] = torch.linspace(-1, 1, len(gen)).unsqueeze(-1).expand_as(gen.batch["responses"]).clone()
    actor.update_actor(gen)  # the weights move away from the checkpoint
    sent, received = _sync(pools, 1)
    assert sent["weight_sync/bytes"] == received["weight_sync/receive/bytes"] > 0
    assert sent["weight_sync/version"] == received["weight_sync/receive/version"] == 1
    assert sent["weight_sync/buckets"] > 1 and sent["weight_sync/seconds"] > 0
    trained = load_file(actor.export_hf(str(tmp_path / "trained"))[0] + "/model.safetensors")
    now = rollout.generation_weights()
    assert set(now) <= set(trained) and len(now) >= 10
    changed = 0
    for name, tensor in now.items():
        assert torch.equal(tensor, trained[name].to(tensor.dtype)), name
        changed += not torch.equal(tensor, initial[name])
    assert changed > len(now) // 2
    manifest = actor.weight_bridge_endpoint()[2]
    assert sent["weight_sync/bytes"] == sum(meta.nbytes for meta in manifest)
    assert sent["weight_sync/tensors"] == len(manifest)


def test_stream_generates_with_policy_versions(pools):
    rollout = pools["rollout"]
    prompts = make_prompts([3, 5], n=2, max_new_tokens=6)
    ((refs, steering),) = rollout.generate_stream([prompts], [None], [1]).get()  # version 1 is loaded already
    groups = ray.get(refs)  # one DataProto per prompt group, in the object store; the call returned refs
    assert [g.non_tensor_batch["uid"].tolist() for g in groups] == [["u0", "u0"], ["u1", "u1"]]
    assert steering["metrics"] == {}  # no weights loaded, no reward function on this pool
    assert steering["groups"] == [{"uid": u, "oldest_version": 1, "informative": None} for u in ("u0", "u1")]
    out = DataProto.concat(groups)
    mask = out.batch["response_mask"].bool()
    assert bool((out.batch[POLICY_VERSION][mask] == 1).all())


def test_syncs_are_received_while_generation_is_queued(pools):
    """The actor's sends complete while the rollout rank is busy: its receiver thread
    stages them; a generation call then loads exactly the version it names."""
    actor, rollout = pools["actor"], pools["rollout"]
    busy = rollout.generate_stream([make_prompts([4, 4, 4, 4], n=4, max_new_tokens=48)], [None], [1])
    for version in (2, 3):
        assert actor.send_weights(version).get()[0]["weight_sync/version"] == version
    busy.get()
    ((_, steering),) = rollout.generate_stream([make_prompts([3], n=1, max_new_tokens=4)], [None], [3]).get()
    loaded = steering["metrics"]
    assert loaded["weight_sync/receive/version"] == 3 and rollout.staged_versions()[0] == []  # 2 was skipped
