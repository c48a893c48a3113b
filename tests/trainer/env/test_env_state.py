"""An environment run's checkpoint state is read back without running planted code: runner
states and pending batches are JSON + safetensors / DataProto files, and the pickled
environments are unpickled only under this user's signature (trainer/env/state.py). A
collector restored from them continues exactly as the original; a tampered or foreign
environment file is not read (its episodes restart, and the note says why)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from hybridflow.engines.policy.actor_critic import ActorCritic, NetworkSpec
from hybridflow.envs.collector import Collector, CollectorSpec
from hybridflow.envs.registry import resolve_env
from hybridflow.envs.vector import VecEnv
from hybridflow.trainer.env.state import KEY_ENV, load_env_state, save_env_state
from tests.payload import Payload


@pytest.fixture
def user_key(tmp_path, monkeypatch):
    key = tmp_path / "home" / "state.key"
    monkeypatch.setenv(KEY_ENV, str(key))
    return key


def collector() -> Collector:
    source = resolve_env("CartPole-v1")
    venv = VecEnv(source, 1, 0)
    spec = NetworkSpec(obs_dim=venv.obs_dim, action=venv.action_spec, hidden_size=(8,))
    return Collector(CollectorSpec(source, num_envs=2, seed=0, network=spec, acting_model=ActorCritic,
                                   normalize_reward=True))


def saved(directory: Path) -> Collector:
    """A collector 5 steps into its episodes, its state saved (with one pending batch) into `directory`."""
    original = collector()
    pending = original.rollout(5)
    directory.mkdir()
    save_env_state(directory, [original.state_dict()], [pending])
    return original


def test_restored_collector_continues_exactly(tmp_path, user_key):
    original = saved(tmp_path / "ck")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "envs_rank0.pkl", "pending", "runners.json", "runners.safetensors"]
    assert user_key.stat().st_mode & 0o777 == 0o600 and not user_key.is_relative_to(tmp_path / "ck")
    states, pending, note = load_env_state(tmp_path / "ck")
    assert note is None and len(pending) == 1 and pending[0].batch["actions"].shape[:2] == (2, 5)
    restored = collector()
    restored.model.load_state_dict(original.model.state_dict())
    assert restored.load_state_dict(states[0])  # environments restored mid-episode
    a, b = original.rollout(7).batch, restored.rollout(7).batch
    assert all(torch.equal(a[k], b[k]) for k in a.keys())


@pytest.mark.parametrize("how", ["tampered", "other user"])
def test_an_unsigned_environment_file_is_not_unpickled(tmp_path, user_key, monkeypatch, how):
    saved(tmp_path / "ck")
    marker = tmp_path / "payload-ran"
    if how == "tampered":
        (tmp_path / "ck" / "envs_rank0.pkl").write_bytes(pickle.dumps(Payload(marker)))
    else:
        monkeypatch.setenv(KEY_ENV, str(tmp_path / "other-home" / "state.key"))
    states, _, note = load_env_state(tmp_path / "ck")
    assert states[0]["envs"] is None
    assert "env runner(s) [0]" in note and "not signed with this user's key" in note and "restart" in note
    assert not collector().load_state_dict(states[0])  # the episodes restart
    assert not marker.exists()


def test_only_the_signed_environments_are_a_plain_pickle_file(tmp_path, user_key):
    saved(tmp_path / "ck")
    pickles = [p.name for p in (tmp_path / "ck").rglob("*") if p.is_file() and p.read_bytes()[:1] == b"\x80"]
    assert pickles == ["envs_rank0.pkl"]


def test_an_old_pickled_checkpoint_is_refused_not_unpickled(tmp_path):
    marker = tmp_path / "payload-ran"
    (tmp_path / "runners.pkl").write_bytes(pickle.dumps([Payload(marker)]))
    with pytest.raises(ValueError, match="older hybridflow.*runners.pkl.*not unpickled"):
        load_env_state(tmp_path)
    assert not marker.exists()
