"""Sequence-length balancing across dp ranks (trainer.balance_batch, issue 11).

`dp_balanced_order` on its own (no Ray): it only swaps rows inside a "slot" (the rows at
one offset of every rank's chunk) and keeps every prefix of the ranks' chunks balanced.
Then the trainer phases on a real 2-rank actor group: old log-probs per sample and a
two-mini-batch update agree with balancing on and off (fp32, float summation order only).
"""

from __future__ import annotations

import random

import pytest
import torch

from hybridflow.controller import RoleSpec
from hybridflow.engines.train.batching import dp_balanced_order
from hybridflow.protocol import DataProto
from hybridflow.trainer.programs import phases as P
from hybridflow.workers import ActorRolloutRefWorker, PlacementSpec, build_role_groups, shutdown_role_groups
from workers_setup import VOCAB, actor_config

WORLD = 2
TOL = 1e-5  # fp32; the only difference is the order of float sums


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width) < torch.tensor(lengths)[:, None]).long()


@pytest.mark.parametrize("dp", [2, 3, 4])
def test_order_keeps_slots_and_balances_every_prefix(dp):
    rng = random.Random(dp)
    chunk = 24
    # GRPO-like: samples of one prompt are adjacent and similar in length, so whole groups
    # of long responses land on one rank without balancing.
    lengths = [max(1, int(rng.gauss(mu, 20))) for mu in [rng.choice([40, 300]) for _ in range(dp * chunk // 4)]
               for _ in range(4)]
    order = dp_balanced_order(_mask(lengths, max(lengths)), dp).tolist()
    assert sorted(order) == list(range(dp * chunk))
    for pos, row in enumerate(order):  # a row moves to another rank, never to another offset
        assert row % chunk == pos % chunk
    totals = [0] * dp
    for slot in range(chunk):
        for rank in range(dp):
            totals[rank] += lengths[order[rank * chunk + slot]]
        assert max(totals) - min(totals) <= max(lengths)
    naive = [sum(lengths[r * chunk:(r + 1) * chunk]) for r in range(dp)]
    assert max(totals) - min(totals) < max(naive) - min(naive)


def test_order_refuses_a_batch_the_ranks_do_not_divide():
    with pytest.raises(ValueError, match="cannot be split evenly over 4 dp ranks"):
        dp_balanced_order(_mask([3] * 6, 4), 4)


# ----------------------------------------------------------------------------- 2 real ranks

PROMPT_LEN, RESPONSE_LEN = 8, 6
# Long sequences first: without balancing rank 0 gets 4 x 14 tokens and rank 1 4 x ~4.
PROMPTS = [8, 8, 7, 8, 2, 1, 2, 1]
RESPONSES = [6, 6, 6, 5, 2, 1, 3, 1]
MINI_BATCH = 4  # two optimizer steps per update: the slots keep each step's samples


def _batch() -> DataProto:
    g = torch.Generator().manual_seed(0)
    n = len(PROMPTS)
    prompt_mask = (torch.arange(PROMPT_LEN) >= PROMPT_LEN - torch.tensor(PROMPTS)[:, None]).long()  # left-padded
    response_mask = _mask(RESPONSES, RESPONSE_LEN)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(3, VOCAB, (n, PROMPT_LEN + RESPONSE_LEN), generator=g) * mask
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": mask,
                 "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "responses": input_ids[:, PROMPT_LEN:],
                 "response_mask": response_mask.float(),
                 "advantages": torch.randn(n, RESPONSE_LEN, generator=g) * response_mask},
        meta_info={"temperature": 1.0})


@pytest.fixture(scope="module")
def actor(ray_local, tiny_llama_dir):
    config = actor_config(tiny_llama_dir, gen_tp=1, mini_batch_size=MINI_BATCH, use_reference=False)
    groups = build_role_groups({"actor": RoleSpec(ActorRolloutRefWorker, (config,))},
                               PlacementSpec.colocated([WORLD]))
    try:
        groups["actor"].init_model()
        yield groups["actor"]
    finally:
        shutdown_role_groups(groups)


def _step(actor, balance: bool) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """Old log-probs, update metrics, and log-probs after the update, all in batch order."""
    step = P.Step(1, _batch(), balance_dp=balance)
    P.compute_old_log_probs(step, actor)
    P.update_actor(step, actor, with_ref=False)
    after = P.Step(2, _batch(), balance_dp=balance)
    P.compute_old_log_probs(after, actor)
    # Loss-type metrics are sums over the whole mini-batch, so they do not depend on the
    # split; ratio-type ones (clip fractions, ppo_kl) are means of per-micro-batch means
    # and do (as with another dp size), so they are not compared.
    metrics = {k: step.metrics[k] for k in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/lr")}
    return step.batch.batch["old_log_probs"], metrics, after.batch.batch["old_log_probs"]


def test_balanced_dispatch_gives_the_unbalanced_results(actor, tmp_path):
    batch = _batch()
    order = dp_balanced_order(batch.batch["attention_mask"], WORLD)
    per_rank = [int(part.sum()) for part in batch.batch["attention_mask"][order].chunk(WORLD)]
    naive = [int(part.sum()) for part in batch.batch["attention_mask"].chunk(WORLD)]
    assert max(per_rank) - min(per_rank) < (max(naive) - min(naive)) / 4  # the test batch does get reordered

    assert actor.dp_parts("compute_log_prob") == WORLD and actor.dp_parts("update_actor") == WORLD
    start = str(tmp_path / "start")
    actor.write_checkpoint(start)
    plain = _step(actor, balance=False)
    actor.load_checkpoint(start)
    balanced = _step(actor, balance=True)

    mask = batch.batch["response_mask"].bool()
    for before_or_after in (0, 2):
        diff = (plain[before_or_after] - balanced[before_or_after])[mask].abs().max()
        assert float(diff) < TOL
    assert not torch.equal(plain[0], plain[2])  # the update moved the policy
    for key, value in plain[1].items():
        assert balanced[1][key] == pytest.approx(value, rel=TOL, abs=TOL), key
