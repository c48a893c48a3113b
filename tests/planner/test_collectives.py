"""The latency terms of the cost model against counts and seconds worked out by hand
(planner_cases.SHAPE: L=2 layers, untied lm head, so 16 split and 5 replicated weight
tensors in the generation layout), the device
share of a pool's compute, and the parts of a phase the workers time on their own."""

from __future__ import annotations

import dataclasses

import pytest

from hybridflow.config.dataflow import FlowPhase
from hybridflow.planner.calibrate import PROFILES, cases_of
from hybridflow.planner.cost import (
    Calls,
    Parallel,
    forward_collectives,
    grad_norm_collectives,
    forward_cost,
    generate_cost,
    reshard_collectives,
    train_collectives,
    train_cost,
)
from hybridflow.planner.devices import DeviceSpec, measure_cpu
from hybridflow.planner.model import ModelShape
from hybridflow.planner.simulate import worker_parts
from planner_cases import EFF, SHAPE, WORK, cluster, load

LAT = dataclasses.replace(EFF, collective_s=1e-4, sync_collective_s=2e-4, dtensor_collective_s=3e-4)
BUILTIN = ModelShape(layers=4, hidden=64, intermediate=256, heads=4, kv_heads=2, vocab=104)  # the demo's model


def test_tensor_counts():
    assert (SHAPE.split_tensors, SHAPE.replicated_tensors) == (16, 5)


def test_grad_norm_collectives_by_hand():
    # One all-reduce per sharded mesh dimension of each layout group, as counted on the real
    # engines (Qwen2, tests/engines/train/test_grad_norm.py for the rule): FSDP's one
    # group on dp; TP's column and row groups on tp; dp x tp: both on both, plus the group
    # TP leaves whole on dp.
    assert [grad_norm_collectives(p) for p in (Parallel(1), Parallel(2), Parallel(1, tp=2),
                                               Parallel(2, tp=2))] == [0, 1, 2, 5]


def test_train_collectives_by_hand():
    # dp2, one micro-batch, one optimizer step: bookkeeping 4 + 4, grad norm 1;
    # FSDP (3*2 + 1) * 1 + 1 = 8.
    assert train_collectives(SHAPE, Parallel(2), 1, 1, False) == Calls(9, 8, 0, 0)
    # tp2, two micro-batches: grad norm 2; DTensor (7*2 + 3) * 2;
    # gradient checkpointing adds the forward's 2*2 + 2 per micro-batch.
    assert train_collectives(SHAPE, Parallel(1, tp=2), 2, 1, False) == Calls(10, 0, 34, 0)
    assert train_collectives(SHAPE, Parallel(1, tp=2), 2, 1, True) == Calls(10, 0, 46, 0)
    # Two stages: a send forward and one backward per micro-batch, the stages' norms summed
    # once per optimizer step; one rank: none at all.
    assert train_collectives(SHAPE, Parallel(1, pp=2), 3, 2, False) == Calls(14, 0, 0, 6)
    assert train_collectives(SHAPE, Parallel(1), 4, 1, False) == Calls()
    # The demo's PPO critic on dp2 (2 micro-batches of 32): a torch profiler trace of the
    # calibration profile counted 48 all-reduces issued by the engine (8 bookkeeping, 40 of
    # the per-tensor gradient norm that one all-reduce replaced), 17 FSDP all-gathers and
    # 10 reduce-scatters: 75 then, 8 + 1 + 27 = 36 now.
    assert sum(train_collectives(BUILTIN.with_head("value"), Parallel(2), 2, 1, False)) == 36


def test_forward_and_reshard_collectives_by_hand():
    assert forward_collectives(SHAPE, Parallel(2), 2) == Calls(2, 5, 0, 0)
    assert forward_collectives(SHAPE, Parallel(1, tp=2), 2) == Calls(2, 0, 12, 0)
    assert forward_collectives(SHAPE, Parallel(1), 2) == Calls()
    # d_g = 2: every split tensor and every norm is gathered; t_g = 2 on FSDP dp2: only the
    # norms; tp2 training into t_g 2: nothing moves.
    assert reshard_collectives(SHAPE, Parallel(2, gen_tp=1)) == 21
    assert reshard_collectives(SHAPE, Parallel(2, gen_tp=2)) == 5
    assert reshard_collectives(SHAPE, Parallel(1, tp=2, gen_tp=2)) == 0
    # The demo's actor: reshard/comm_calls logged 39, 9 and 0 by the three mappings.
    assert [reshard_collectives(BUILTIN, p) for p in (Parallel(2, gen_tp=1), Parallel(2, gen_tp=2),
                                                       Parallel(1, tp=2, gen_tp=2))] == [39, 9, 0]


def test_train_cost_latency_by_hand():
    # dp2: FSDP's 8 calls at 2e-4 join the all-gather bytes (5.92e-4 s) under 6.2e-4 s of
    # compute, 2.192e-3 - 6.20544e-4 exposed; 9 plain calls at 1e-4; reduce-scatter 2.96e-4.
    cost = train_cost(load(), Parallel(2), WORK, cluster(2, eff=LAT))
    assert cost.parts["latency_s"] == pytest.approx(9e-4)
    assert cost.comm_s == pytest.approx(2.192e-3 - 620544 / 2 / 5e8 + 2.96e-4 + 9e-4)
    # tp2, 2 micro-batches of 4 (one dp rank holds all 8 sequences): 10 plain + 34 DTensor calls.
    cost = train_cost(load(), Parallel(1, tp=2), WORK, cluster(2, eff=LAT))
    assert cost.parts["latency_s"] == pytest.approx(10e-4 + 34 * 3e-4)


def test_fsdp_gathers_add_to_compute_on_a_cpu():
    # The dp2 case above on a device named cpu: gloo's all-gathers take the compute's cores,
    # so the whole 2.192e-3 s of gathers adds to the pass instead of what outlasts 6.2e-4 s.
    gpu = cluster(2, eff=LAT)
    cpu = dataclasses.replace(gpu, device=dataclasses.replace(gpu.device, name="cpu"))
    assert not cpu.device.comm_overlaps_compute and gpu.device.comm_overlaps_compute
    assert train_cost(load(), Parallel(2), WORK, cpu).comm_s == pytest.approx(2.192e-3 + 2.96e-4 + 9e-4)
    hidden = forward_cost(load(), Parallel(2), WORK, gpu).comm_s
    assert forward_cost(load(), Parallel(2), WORK, cpu).comm_s > hidden


def test_forward_and_generate_latency_by_hand():
    # Scoring on dp2, 1 micro-batch of 4: 2 plain calls, FSDP 2 + 1 hidden under compute.
    cost = forward_cost(load(), Parallel(2), WORK, cluster(2, eff=LAT))
    assert cost.parts["latency_s"] == pytest.approx(2e-4)
    # t_g = 2 on 2 devices: one replica of 8 sequences, 5 forward passes of 2*2 + 3 collectives
    # at 2e-4; the reshard gathers the 5 norms back to back at 1e-4 (+ 160 B at 1e7 B/s).
    cost = generate_cost(load(), Parallel(2, gen_tp=2), WORK, cluster(2, eff=LAT))
    assert cost.parts["collectives"] == 35 + 5
    assert cost.parts["reshard_s"] == pytest.approx(5e-4 + 0.5 * 4 * 40 / 1e7)
    without = generate_cost(load(), Parallel(2, gen_tp=2), WORK, cluster(2))
    assert cost.comm_s - without.comm_s == pytest.approx(35 * 2e-4 + 5e-4)


def test_shared_device_slows_a_pool_that_computes_together():
    # Half the rate per device while both devices of the node compute: 2 ranks take as
    # long as one at full rate; a 1-device pool keeps the whole rate.
    half = cluster(2, shared=0.5)
    assert train_cost(load(), Parallel(2), WORK, half).compute_s == pytest.approx(620544 / 5e8)
    assert train_cost(load(), Parallel(1), WORK, half).compute_s == pytest.approx(620544 / 5e8)
    gen_half = generate_cost(load(), Parallel(2, gen_tp=1), WORK, half)
    gen_full = generate_cost(load(), Parallel(2, gen_tp=1), WORK, cluster(2))
    assert gen_half.parts["prefill_s"] == pytest.approx(2 * gen_full.parts["prefill_s"])
    assert gen_half.parts["decode_s"] == pytest.approx(2 * gen_full.parts["decode_s"])


def test_share_scale_corrects_the_measured_share_up_to_a_full_share():
    lower = cluster(2, shared=0.5, eff=dataclasses.replace(EFF, share_scale=0.8))
    assert train_cost(load(), Parallel(2), WORK, lower).compute_s == pytest.approx(620544 / 2 / 5e8 / 0.4)
    full = cluster(2, shared=0.5, eff=dataclasses.replace(EFF, share_scale=4.0))
    assert train_cost(load(), Parallel(2), WORK, full).compute_s == pytest.approx(620544 / 2 / 5e8)


def test_worker_parts():
    cost = generate_cost(load(), Parallel(2, gen_tp=1), WORK, cluster(2))
    parts = worker_parts(FlowPhase("gen", "actor", "generate"), cost, 0.1)
    assert parts == {"reshard_to_generation": cost.parts["reshard_s"],
                     "generate": pytest.approx(cost.seconds - cost.parts["reshard_s"] - 0.1)}
    update = train_cost(load(), Parallel(2), WORK, cluster(2))
    assert worker_parts(FlowPhase("update_actor", "actor", "train"), update, 0.1) == {
        "update_actor_in_worker": pytest.approx(update.seconds - 0.1)}
    assert worker_parts(FlowPhase("values", "critic", "forward"), update, 0.1) == {}


def test_measured_lengths_replace_the_config_caps(tmp_path):
    device = DeviceSpec("cpu", 2e10, 5e9, 4e9, 1e9, 1e9, "test")
    name = next(iter(PROFILES))
    cases = cases_of({name: {"times": {}, "lengths": {"prompt": 9.0, "response": 5.6}}}, device, tmp_path)
    work = cases[name][0].workload
    assert (work.prompt_len, work.response_len) == (9, 6)
    uncapped = cases_of({name: {"times": {}}}, device, tmp_path)[name][0].workload
    assert uncapped.prompt_len > 9  # the config's max_prompt_length


def test_measure_cpu_shares_are_fractions():
    device = measure_cpu(seconds=0.02, rounds=1)
    assert device.peak_flops > 0 and device.mem_bw > 0
    assert 0 < device.shared_flops <= 1 and 0 < device.shared_bw <= 1
