"""Cost and memory formulas against values worked out by hand (planner_cases.SHAPE:
N = 1360 matmul parameters, P = 1480 parameters, 640 per layer), and the memory model
against a measured peak of a real CPU update."""

from __future__ import annotations

import pytest

from hybridflow.engines.local_ranks import run_ranks
from hybridflow.engines.models import save_tiny_model
from hybridflow.planner.cost import Parallel, generate_cost, ring_bytes, train_cost
from hybridflow.planner.memory import resident_bytes, train_bytes
from hybridflow.planner.model import LLAMA, ModelShape
from hybridflow.planner.problem import RoleLoad, Workload
from memory_probe import measure_update_peak
from planner_cases import SHAPE, WORK, cluster, load


def test_shape_counts():
    assert SHAPE.layer_matmul == 2 * 64 + 2 * 64 + 3 * 128 == 640
    assert SHAPE.matmul_params == 2 * 640 + 8 * 10 == 1360
    assert SHAPE.params == 1360 + 80 + 5 * 8 == 1480
    # Llama-2 7B has 6.74e9 parameters (published); the shape gives the same count.
    assert LLAMA["llama-7b"].params == pytest.approx(6.74e9, rel=2e-3)
    assert LLAMA["llama-70b"].params == pytest.approx(68.98e9, rel=2e-3)


def test_train_cost_single_rank():
    # FLOPs 6*1360*64 + 12*2*8*(8*8^2) = 522240 + 98304; / (1e9 * 0.5); 2 micro-batches of 4.
    cost = train_cost(load(), Parallel(1), WORK, cluster(1))
    assert cost.compute_s == pytest.approx(620544 / 5e8)
    assert cost.comm_s == 0.0
    assert cost.overhead_s == pytest.approx(0.1 + 2 * 0.01)


def test_train_cost_two_data_parallel_ranks():
    # Half the FLOPs per rank; all-gathers 0.5 * 2*4*1480 = 5920 B in 5.92e-4 s, hidden under
    # 6.2e-4 s of compute; one gradient reduce-scatter 0.5 * 4*1480 = 2960 B at 1e7 B/s.
    cost = train_cost(load(), Parallel(2), WORK, cluster(2))
    assert cost.compute_s == pytest.approx(620544 / 2 / 5e8)
    assert cost.parts["fsdp_gather_s"] == pytest.approx(5.92e-4)
    assert cost.comm_s == pytest.approx(2.96e-4)
    assert cost.overhead_s == pytest.approx(0.1 + 0.01)


def test_generate_cost_with_reshard():
    # 2 replicas of t_g=1, 4 sequences each. Prefill 2*1360*4*3 + 4*2*8*4*9 = 34944 FLOPs.
    # Decode: mean context 3 + 3 = 6; weights 4*1480 + KV 4*6*2*2*8*4 = 8992 B per step at
    # 0.5e8 B/s (memory-bound: 12416 FLOPs take less), 5 steps. Reshard (hybrid, N=2, t_g=1):
    # (2-1)/2 * 4*1440 split + (2-1)/2 * 4*40 replicated = 2960 B at 1e7 B/s.
    cost = generate_cost(load(), Parallel(2, gen_tp=1), WORK, cluster(2))
    assert cost.parts["prefill_s"] == pytest.approx(34944 / 5e8)
    assert cost.parts["decode_s"] == pytest.approx(5 * 8992 / 5e7)
    assert cost.parts["reshard_s"] == pytest.approx(2.96e-4)
    assert cost.overhead_s == pytest.approx(0.1 + 5 * 0.001)
    assert cost.seconds == pytest.approx(34944 / 5e8 + 5 * 8992 / 5e7 + 2.96e-4 + 0.105)


def test_ring_bytes():
    assert ring_bytes(1, 100) == 0 and ring_bytes(4, 100) == 75


def test_memory_by_hand():
    # Resident 16 B x 1480 / 2 ranks; update: one layer 4*640, activations 32 tokens x 2
    # layers x (6*8 + 2*8 + 4*16 = 128) x 4 B, head 32 x 10 x (4 + 12).
    assert resident_bytes(load(), Parallel(2)) == 16 * 1480 / 2
    assert train_bytes(load(), Parallel(2), WORK) == 2560 + 32 * 2 * 128 * 4 + 32 * 10 * 16


def test_memory_model_against_a_measured_cpu_peak(tmp_path):
    """One real ActorEngine update (fp32, 16 sequences of 128 tokens, one micro-batch) in a
    fresh process: its peak resident set above the start is within 25 % of the model
    (the allocator and thread pools add tens of MiB that the model does not count)."""
    layers, hidden, inter, vocab, seqs, p, r = 4, 256, 1024, 4096, 16, 64, 64
    save_tiny_model(tmp_path / "m", hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                    vocab_size=vocab, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    measured = run_ranks(measure_update_peak, 1, str(tmp_path / "m"), seqs, p, r, vocab)[0]["delta"]
    role = RoleLoad(ModelShape(layers, hidden, inter, 4, 2, vocab), True, 4, seqs, seqs, seqs)
    work = Workload(seqs, 1, p, r)
    predicted = resident_bytes(role, Parallel(1)) + train_bytes(role, Parallel(1), work)
    assert predicted == pytest.approx(measured, rel=0.25), (predicted / 2**20, measured / 2**20)
