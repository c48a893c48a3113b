"""perf/mfu from what the workers report (trainer/observe/metrics.py, engines/train/flops.py): each
rank's peak comes from its own device, the controller only adds them up, and every role's
FLOPs are counted at that role's own model size. The end-to-end check (peaks configured
per role, split and colocated placement) is in test_rl_e2e.py."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engines.train.flops import FlopFacts, training_flops
from hybridflow.protocol import DataProto
from hybridflow.trainer.observe.metrics import FlopModel, sequence_lengths, throughput_metrics, total_peak_flops


def test_peaks_add_up_per_process_whatever_the_nodes_are():
    # Two nodes of different speed (a head node's peak would be wrong for both), and a
    # process hosting two colocated roles: its device counts once, at its best rate.
    reports = [(("fast", 1), 8e12), (("fast", 2), 8e12), (("slow", 3), 1e12),
               (("fast", 1), 4e12)]  # a colocated role of process 1 in another dtype
    assert total_peak_flops(reports) == 17e12
    with pytest.raises(ValueError, match="peak_flops_per_device"):
        total_peak_flops([(("node", 1), 0.0)])


def _batch(lengths: list[int]) -> DataProto:
    width = max(lengths)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    return DataProto.from_dict(tensors={"attention_mask": mask})


def test_step_flops_count_every_role_at_its_own_size():
    lengths = [5, 9]
    actor = FlopFacts(matmul_params=1000, layers=2, hidden=8, peak_flops=1e9)
    critic = FlopFacts(matmul_params=700, layers=2, hidden=8, peak_flops=1e9)
    scorer = FlopFacts(matmul_params=3000, layers=4, hidden=16, peak_flops=1e9)
    model = FlopModel(actor, critics=(critic, critic), scorers=(scorer,), peak_flops=3e9)
    a = training_flops(1000, 2, 8, lengths)
    c = training_flops(700, 2, 8, lengths)
    s = training_flops(3000, 4, 16, lengths)
    # generation + 2 actor forwards + 3 actor epochs; each critic: forward + 2 epochs; scorer: forward.
    want = a / 3 + 2 * a / 3 + 3 * a + 2 * (c / 3 + 2 * c) + s / 3
    seq_lens = sequence_lengths(_batch(lengths))
    assert seq_lens == lengths
    got = model.step_flops(seq_lens, actor_forwards=2, actor_update_epochs=3, critic_update_epochs=2)
    assert got == pytest.approx(want, rel=1e-12)
    perf = throughput_metrics(sum(seq_lens), 2.0, got, model.peak_flops)
    assert perf["perf/mfu"] == pytest.approx(got / 2.0 / 3e9) and perf["perf/tokens_per_s"] == 7.0


def test_the_console_mentions_mfu_only_where_the_peak_is_a_known_one():
    from hybridflow.trainer.observe.metrics import mfu_note

    assert mfu_note(3.3e10, on_gpu=False, configured=False) is None  # a matmul timed on a busy CPU
    assert "989 TFLOP/s" in mfu_note(9.89e14, on_gpu=True, configured=False)
    assert "configured peak_flops_per_device" in mfu_note(1e12, on_gpu=False, configured=True)
