"""actor.old_log_probs: when the trainer leaves the old-log-prob pass to the update."""

from __future__ import annotations

import pytest

from hybridflow.config.schema import load_run_config


@pytest.mark.parametrize("overrides, fused", [
    ([], True),  # the demo: 16 prompts x 8 samples = one 128-sequence mini-batch, one epoch, no KL
    (["actor.old_log_probs=recompute"], False),
    (["actor.micro_batch.epochs=2"], False),
    (["actor.micro_batch.mini_batch_size=64", "actor.micro_batch.micro_batch_size_per_device=32"], False),
    (["actor.loss.use_kl_loss=true"], False),  # the reference KL metric reads old_log_probs
    (["algorithm.use_kl_in_reward=true"], False),  # the KL penalty reads them before the update
])
def test_the_pass_is_fused_only_for_one_step_without_a_reader(overrides, fused):
    assert load_run_config(None, overrides).fuses_old_log_probs is fused


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="old_log_probs"):
        load_run_config(None, ["actor.old_log_probs=sometimes"])
