"""Worker configs, placement specs and the score-placement helper (no processes)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engines.train import ActorLossConfig, LoraConfig, TrainEngineConfig
from hybridflow.workers import (
    ActorRolloutRefConfig,
    CriticWorkerConfig,
    PlacementSpec,
    RewardModelWorkerConfig,
    RolloutWorkerConfig,
    scores_at_last_response_token,
)
from hybridflow.errors import ConfigError


def engine(**kw) -> TrainEngineConfig:
    return TrainEngineConfig(model_path="/models/tiny", **kw)


def test_kl_loss_needs_the_reference_policy():
    with pytest.raises(ConfigError, match="use_reference=True"):
        ActorRolloutRefConfig(engine=engine(), loss=ActorLossConfig(use_kl_loss=True))
    cfg = ActorRolloutRefConfig(engine=engine(), loss=ActorLossConfig(use_kl_loss=True), use_reference=True)
    assert cfg.model_path == "/models/tiny"


@pytest.mark.parametrize("kwargs, message", [
    ({"reshard_method": "scatter"}, "reshard_method"),
    ({"tensor_model_parallel_size": 0}, "tensor_model_parallel_size"),
    ({"name": "vlm"}, "name"),  # unknown backend
    ({"dtype": "fp16"}, "dtype"),
    ({"top_p": 0.0}, "top_p"),
    ({"response_length": 0}, "^response_length: must be >= 1"),  # the setting, not SamplingParams.max_new_tokens
    ({"log_prob_mode": "raw"}, "log_prob_mode"),
])
def test_rollout_settings_are_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RolloutWorkerConfig(**kwargs)


def test_sampling_defaults_follow_do_sample_and_response_length():
    sampled = RolloutWorkerConfig(temperature=0.7, response_length=32, n=4).sampling_defaults()
    assert (sampled["temperature"], sampled["max_new_tokens"], sampled["n"]) == (0.7, 32, 4)
    assert RolloutWorkerConfig(temperature=0.7, do_sample=False).sampling_defaults()["temperature"] == 0.0


def test_sections_must_have_their_types():
    with pytest.raises(ConfigError, match="engine: must be a TrainEngineConfig"):
        ActorRolloutRefConfig(engine={"model_path": "/x"})
    with pytest.raises(ConfigError, match="loss: must be a CriticLossConfig"):
        CriticWorkerConfig(engine=engine(), loss=ActorLossConfig())


def test_lora_is_refused_outside_the_actor():
    with pytest.raises(ConfigError, match="engine.lora.rank: must be 0 for the critic"):
        CriticWorkerConfig(engine=engine(lora=LoraConfig(rank=4)))
    with pytest.raises(ConfigError, match="engine.lora.rank: must be 0 for the reward_model"):
        RewardModelWorkerConfig(engine=engine(lora=LoraConfig(rank=4)))
    ActorRolloutRefConfig(engine=engine(lora=LoraConfig(rank=4)), use_reference=True)


def test_colocated_placement_puts_every_role_on_one_pool():
    spec = PlacementSpec.colocated([4])
    assert spec.assign(["actor", "critic", "reward"]) == {"global_pool": ["actor", "critic", "reward"]}


def test_split_placement_groups_roles_by_pool():
    spec = PlacementSpec(pools={"a": [2], "b": [2]}, mapping={"actor": "a", "critic": "b", "reward": "b"})
    assert spec.assign(["actor", "critic", "reward"]) == {"a": ["actor"], "b": ["critic", "reward"]}


@pytest.mark.parametrize("pools, mapping, roles, message", [
    ({"a": [2], "b": [2]}, {"actor": "a"}, ["actor", "critic"], r"roles \['critic'\] have no pool"),
    ({"a": [2], "b": [2]}, {"actor": "a", "critic": "a"}, ["actor", "critic"], r"pools \['b'\] host no role"),
    ({"a": [2]}, {"actor": "a", "ref": "a"}, ["actor"], r"places roles \['ref'\]"),
])
def test_split_placement_must_cover_roles_and_pools(pools, mapping, roles, message):
    with pytest.raises(ValueError, match=message):
        PlacementSpec(pools=pools, mapping=mapping).assign(roles)


@pytest.mark.parametrize("pools, mapping, message", [
    ({}, {}, "pools is empty"),
    ({"a": [0]}, {}, "ints >= 1"),
    ({"a": [1]}, {"actor": "nope"}, r"names pools \['nope'\]"),
])
def test_placement_spec_is_validated(pools, mapping, message):
    with pytest.raises(ValueError, match=message):
        PlacementSpec(pools=pools, mapping=mapping)


def test_split_parts_must_hold_exactly_the_pools_slots():
    # Split placement cuts one reservation into the pools (a real cluster: tests/cluster/test_cluster_runs.py).
    PlacementSpec(pools={"a": [1], "b": [1]}, mapping={"actor": "a", "critic": "b"}, parts_of=[1, 1])
    with pytest.raises(ValueError, match="parts_of"):
        PlacementSpec(pools={"a": [1], "b": [1]}, mapping={"actor": "a", "critic": "b"}, parts_of=[1])


def test_scores_land_on_the_last_valid_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    placed = scores_at_last_response_token(torch.tensor([0.5, -1.0, 3.0, 2.0]), mask)
    want = torch.tensor([[0, 0, 0.5, 0], [-1.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 2.0]])
    assert placed.dtype == torch.float32
    assert torch.equal(placed, want)
    with pytest.raises(ValueError, match="same B"):
        scores_at_last_response_token(torch.zeros(3), mask)


def test_multi_turn_rollouts_need_a_backend_with_a_turn_engine():
    """native (KV-cache continuation, also at t_g > 1: the lockstep of envs/agent/lockstep.py)
    and hf (regeneration) run the agent loop; stop strings are refused with the setting to
    change, and hf at t_g > 1 by the backend check (it has no tensor parallelism)."""
    from hybridflow.envs.agent import AgentConfig
    from hybridflow.workers.config import RolloutWorkerConfig, multi_turn_backends

    assert {"native", "hf"} <= set(multi_turn_backends())
    for name in ("native", "hf"):
        RolloutWorkerConfig(name=name, agent=AgentConfig(enable=True))
    RolloutWorkerConfig(name="native", tensor_model_parallel_size=2, agent=AgentConfig(enable=True))
    with pytest.raises(ConfigError, match="multi-turn rollouts need") as err:
        RolloutWorkerConfig(agent=AgentConfig(enable=True), stop=["###"])
    assert err.value.key == "agent.enable"
    with pytest.raises(ConfigError, match="one rank only") as err:
        RolloutWorkerConfig(name="hf", tensor_model_parallel_size=2, agent=AgentConfig(enable=True))
    assert err.value.key == "name"
