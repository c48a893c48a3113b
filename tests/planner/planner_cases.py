"""A small planning problem built by hand (no run config): the shapes and numbers the
hand-computed tests use."""

from __future__ import annotations

from hybridflow.config.algorithm import algorithm_spec
from hybridflow.planner.devices import DeviceSpec, Efficiency
from hybridflow.planner.model import ModelShape
from hybridflow.planner.problem import Capabilities, Cluster, Problem, RoleLoad, Workload, active_phases

# L=2, d=8, f=16, 2 heads, 2 kv heads, V=10: layer matmuls 640, N=1360, P=1480.
SHAPE = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=2, vocab=10)
WORK = Workload(prompts=4, samples=2, prompt_len=3, response_len=5, max_num_seqs=256, gen_dtype_bytes=4)
DEVICE = DeviceSpec("test", peak_flops=1e9, mem_bw=1e8, memory_bytes=1e9, intra_bw=1e7, inter_bw=1e6, source="test")
# Latencies 0 here (the roofline tests); test_collectives.py sets them.
EFF = Efficiency(train=0.5, forward=0.5, prefill=0.5, decode_bw=0.5, comm=1.0, collective_s=0.0, sync_collective_s=0.0,
                 dtensor_collective_s=0.0, call_s=0.1, micro_batch_s=0.01, decode_step_s=0.001,
                 controller_per_seq_s=0.0, source="test")


def load(shape: ModelShape = SHAPE, trainable: bool = True) -> RoleLoad:
    return RoleLoad(shape, trainable, dtype_bytes=4, micro_batch=4, forward_micro_batch=4, mini_batch=8)


def cluster(devices: int = 2, per_node: int | None = None, memory: float = 1e9, eff: Efficiency = EFF,
            shared: float = 1.0) -> Cluster:
    per_node = per_node or devices
    dev = DeviceSpec("test", 1e9, 1e8, memory, 1e7, 1e6, "test", shared_flops=shared, shared_bw=shared)
    return Cluster(devices // per_node, per_node, dev, eff)


def ppo_problem(devices: int = 4, caps: Capabilities | None = None, memory: float = 1e9,
                work: Workload = WORK, shape: ModelShape = SHAPE) -> Problem:
    """PPO with a reference policy: actor, reference, critic."""
    settings = {"reward_model": False, "cost_model": False, "reference": True, "old_log_probs": True,
                "rule_reward": True, "rule_cost": False}
    phases = active_phases(algorithm_spec("ppo").phases, settings)
    roles = {"actor": load(shape), "reference": load(shape, trainable=False), "critic": load(shape.with_head("value"))}
    return Problem(phases, roles, work, cluster(devices, memory=memory), caps or Capabilities())
