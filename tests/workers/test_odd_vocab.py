"""Vocabulary sizes the ranks do not divide (issue 17): an actor whose embedding and lm_head
have 69 (or 67) rows initialises, generates, trains and generates again on 2 and 4 ranks,
with FSDP alone and FSDP x training TP 2, and generation TP 1 or 2.

FSDP2 and DTensor TP split such a vocabulary into ceil-sized pieces and a shorter one; the
resharder gathers these "ragged" parameters whole and the generation engine cuts its own
ceil-sized TP piece (padded with zero rows). Checked against single-process references:
a plain Hugging Face forward of the starting model, and of the model exported after one
update; the generation engine's and the training engine's log-probs agree throughout.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridflow.controller import RoleSpec
from hybridflow.engines.models import save_tiny_model
from hybridflow.workers import ActorRolloutRefWorker, PlacementSpec, build_role_groups, shutdown_role_groups
from workers_setup import LOGPROB_TOL, actor_config, hf_log_probs, make_prompts, masked_max_diff

N_SAMPLES = 2


@pytest.mark.parametrize("vocab, world, gen_tp, train_tp", [
    pytest.param(69, 2, 1, 1, marks=pytest.mark.extended),
    (69, 2, 2, 1),
    pytest.param(67, 4, 2, 1, marks=pytest.mark.extended),
    pytest.param(69, 4, 2, 2, marks=pytest.mark.extended),  # FSDP x TP: the vocabulary is split 35 | 34, then each half over dp
], ids=lambda v: str(v))
def test_odd_vocabulary_trains_and_generates(ray_local, tmp_path, vocab, world, gen_tp, train_tp):
    model_dir = save_tiny_model(tmp_path / "model", "llama", vocab_size=vocab)
    config = actor_config(model_dir, gen_tp=gen_tp, mini_batch_size=world * N_SAMPLES, use_reference=False)
    config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, tp_size=train_tp))
    groups = build_role_groups({"actor": RoleSpec(ActorRolloutRefWorker, (config,))}, PlacementSpec.colocated([world]))
    actor = groups["actor"]
    try:
        actor.init_model()
        prompts = make_prompts([3, 5, 4, 2][:world], n=N_SAMPLES, max_new_tokens=6)
        prompts.batch["input_ids"] %= vocab  # make_prompts draws ids from a 256-token vocabulary

        gen = actor.generate_sequences(prompts)
        mask = gen.batch["response_mask"]
        assert int(gen.batch["responses"].max()) < vocab  # the padded logit columns were dropped
        old = actor.compute_log_prob(gen).batch["old_log_probs"]
        assert masked_max_diff(gen.batch["rollout_log_probs"], hf_log_probs(model_dir, gen), mask) < LOGPROB_TOL
        assert masked_max_diff(old, gen.batch["rollout_log_probs"], mask) < LOGPROB_TOL

        gen.batch["old_log_probs"] = old
        gen.batch["advantages"] = torch.linspace(-1.0, 1.0, len(gen))[:, None] * mask
        actor.update_actor(gen)
        exported = actor.export_hf(str(tmp_path / "updated"))[0]

        again = actor.generate_sequences(prompts)  # reshards the updated weights
        mask = again.batch["response_mask"]
        reference = hf_log_probs(exported, again)
        assert masked_max_diff(reference, hf_log_probs(model_dir, again), mask) > 10 * LOGPROB_TOL  # it moved
        assert masked_max_diff(again.batch["rollout_log_probs"], reference, mask) < LOGPROB_TOL
        assert masked_max_diff(actor.compute_log_prob(again).batch["old_log_probs"], reference, mask) < LOGPROB_TOL
    finally:
        shutdown_role_groups(groups)
