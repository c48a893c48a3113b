"""SAC losses, the Polyak target update and the replay buffer, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms.replay import ReplayBuffer
from hybridflow.algorithms.sac import polyak_update, sac_actor_loss, sac_alpha_loss, sac_critic_loss, soft_q_target


def test_soft_q_target_by_hand():
    args = dict(next_q1=torch.tensor([2.0, 2.0]), next_q2=torch.tensor([3.0, 3.0]), next_log_probs=torch.tensor([-0.5, -0.5]))
    y = soft_q_target(torch.tensor([1.0, 1.0]), torch.tensor([False, True]), **args, alpha=0.2, gamma=0.9)
    # y = r + gamma (1 - done) (min(Q1', Q2') - alpha log pi) = 1 + 0.9 (2 + 0.1); terminal: just r
    assert y.tolist() == pytest.approx([1.0 + 0.9 * 2.1, 1.0])


def test_critic_actor_and_alpha_losses_by_hand():
    q1, q2 = torch.tensor([2.0], requires_grad=True), torch.tensor([3.0], requires_grad=True)
    critic = sac_critic_loss(q1, q2, torch.tensor([2.89]))
    assert critic.item() == pytest.approx(0.5 * (0.89**2 + 0.11**2))
    critic.backward()
    assert q1.grad.item() == pytest.approx(2.0 - 2.89) and q2.grad.item() == pytest.approx(3.0 - 2.89)

    log_probs = torch.tensor([-1.0, 0.5])
    actor = sac_actor_loss(torch.tensor([1.0, 4.0]), torch.tensor([2.0, 3.0]), log_probs, torch.tensor(0.2))
    assert actor.item() == pytest.approx(((0.2 * -1.0 - 1.0) + (0.2 * 0.5 - 3.0)) / 2)

    log_alpha = torch.tensor(math.log(0.2), requires_grad=True)
    alpha_loss = sac_alpha_loss(log_alpha, log_probs, target_entropy=-1.0)
    assert alpha_loss.item() == pytest.approx(-math.log(0.2) * (-2.0 - 0.5) / 2)
    alpha_loss.backward()
    # entropy (-mean log pi = 0.25) above the target (-1): the gradient step lowers alpha
    assert log_alpha.grad.item() == pytest.approx(1.25)


def test_polyak_update_moves_targets_by_tau_and_copies_at_one():
    target, online = [torch.zeros(2), torch.ones(1)], [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    polyak_update(target, online, 0.1)
    assert target[0].tolist() == pytest.approx([0.1, 0.2]) and target[1].tolist() == pytest.approx([1.2])
    polyak_update(target, online, 1.0)
    assert target[0].tolist() == [1.0, 2.0] and target[1].tolist() == [3.0]
    with pytest.raises(ValueError, match="tau"):
        polyak_update(target, online, 0.0)


def _rows(values: list[float]) -> dict[str, torch.Tensor]:
    x = torch.tensor(values)
    return {"obs": torch.stack([x, -x], dim=1), "reward": x}


def test_replay_buffer_wraps_around_and_samples_uniformly():
    buffer = ReplayBuffer(5, {"obs": (2,), "reward": ()})
    buffer.add(_rows([0, 1, 2]))
    buffer.add(_rows([3, 4, 5, 6]))  # 5 and 6 overwrite the oldest rows, 0 and 1
    assert len(buffer) == 5 and buffer.position == 2
    assert buffer.storage["reward"].tolist() == [5, 6, 2, 3, 4]
    sample = buffer.sample(50_000, torch.Generator().manual_seed(0))
    assert torch.equal(sample["obs"][:, 0], sample["reward"]) and torch.equal(sample["obs"][:, 1], -sample["reward"])
    counts = torch.bincount(sample["reward"].long(), minlength=7)[2:] / 50_000
    assert counts.tolist() == pytest.approx([0.2] * 5, abs=0.01)


def test_replay_buffer_state_round_trip_gives_the_same_samples():
    buffer = ReplayBuffer(8, {"obs": (2,), "reward": ()})
    buffer.add(_rows([1, 2, 3]))
    copy = ReplayBuffer(8, {"obs": (2,), "reward": ()})
    copy.load_state_dict(buffer.state_dict())
    a, b = (buf.sample(16, torch.Generator().manual_seed(3)) for buf in (buffer, copy))
    assert torch.equal(a["reward"], b["reward"]) and copy.position == 3


def test_replay_buffer_refuses_wrong_input():
    buffer = ReplayBuffer(4, {"obs": (2,), "reward": ()})
    with pytest.raises(RuntimeError, match="empty"):
        buffer.sample(1, torch.Generator())
    with pytest.raises(KeyError, match="fields"):
        buffer.add({"obs": torch.zeros(1, 2)})
    with pytest.raises(ValueError, match="shape"):
        buffer.add({"obs": torch.zeros(1, 3), "reward": torch.zeros(1)})
