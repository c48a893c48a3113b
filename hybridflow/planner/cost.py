"""Per-phase time: an analytic roofline times the device's efficiency factors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from hybridflow.config.dataflow import FlowPhase
from hybridflow.engines.reshard.formulas import Costs, ModelSizes, predicted_costs
from hybridflow.engines.train.flops import training_flops
from hybridflow.planner.devices import DeviceSpec, Efficiency
from hybridflow.planner.model import ModelShape
from hybridflow.planner.problem import Cluster, RoleLoad, Workload


@dataclass(frozen=True)
class Parallel:
    """A role's parallel sizes; gen_tp (t_g) only for the actor (0 elsewhere)."""

    dp: int
    tp: int = 1
    pp: int = 1
    gen_tp: int = 0

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    def label(self) -> str:
        text = f"dp{self.dp}" + (f"-tp{self.tp}" if self.tp > 1 else "") + (f"-pp{self.pp}" if self.pp > 1 else "")
        return text + (f" t_g{self.gen_tp}" if self.gen_tp else "")


@dataclass
class PhaseCost:
    """Seconds of one phase, split into roofline compute, communication and overheads."""

    compute_s: float = 0.0
    comm_s: float = 0.0
    overhead_s: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.compute_s + self.comm_s + self.overhead_s


def link_bw(group: int, span: int, cluster: Cluster) -> float:
    """Bandwidth of a collective over `group` ranks spread over `span` consecutive devices."""
    bw = cluster.device.intra_bw if span <= cluster.devices_per_node else cluster.device.inter_bw
    return bw * cluster.efficiency.comm


def shared(devices: int, cluster: Cluster, busy: int = 0) -> tuple[float, float]:
    """The fractions of its own FLOP rate and memory bandwidth a device of a group of
    `devices` ranks keeps while `max(devices, busy)` devices compute at once (busy: other
    pools' ranks beside it in a block, simulate.busy_devices), where more than one of them
    sit on a node, else 1. The device's measured share (DeviceSpec.shared_*: what
    independent processes keep; this machine's 2 vCPUs, GPUs: 1), times eff.share_scale
    (at most 1) only when the group's own ranks share a node: they compute in lockstep, each
    collective waits for the slower one and takes the cores it computes on, which slows
    them with their compute; a rank of another pool does not wait for them (measured here
    in four quiet rounds: an update beside the other pool's update keeps 0.93-1.02 of its
    time alone, the benchmark's share 0.97-0.99, share_scale fitted 0.6-0.9; docs/planner.md)."""
    per_node = cluster.devices_per_node
    if min(max(devices, busy), per_node) <= 1:
        return 1.0, 1.0
    scale = cluster.efficiency.share_scale if min(devices, per_node) > 1 else 1.0
    return min(1.0, cluster.device.shared_flops * scale), min(1.0, cluster.device.shared_bw * scale)


def exposed_gather_s(gather_s: float, compute_s: float, device: DeviceSpec) -> float:
    """What FSDP's prefetched all-gathers add to a pass: what outlasts the compute where
    collectives run beside it, all of it where they share its cores (DeviceSpec)."""
    return max(0.0, gather_s - compute_s) if device.comm_overlaps_compute else gather_s


def ring_bytes(group: int, nbytes: float) -> float:
    """Bytes each rank sends in a ring all-gather / reduce-scatter of `nbytes` in total."""
    return 0.0 if group <= 1 else nbytes * (group - 1) / group


class Calls(NamedTuple):
    """Collective calls of one phase call on one rank, by how they meet the compute
    (module docstring)."""

    plain: int = 0  # back to back, no compute in between (checks, metrics, grad norm): eff.collective_s
    fsdp: int = 0  # FSDP2's all-gathers / reduce-scatters: asynchronous, hidden under compute
    tensor: int = 0  # DTensor's tensor-parallel collectives in a training pass: eff.dtensor_collective_s
    sends: int = 0  # pipeline sends between stages: eff.sync_collective_s


def train_collectives(shape: ModelShape, par: Parallel, micro: int, optimizer_steps: int,
                      checkpointing: bool) -> Calls:
    """Collective calls of one update call on one rank (module docstring)."""
    if par.devices == 1:
        return Calls()
    layers = shape.layers // par.pp
    plain, fsdp, tensor = 4 + 4 * optimizer_steps, 0, 0
    plain += grad_norm_collectives(par) * optimizer_steps
    if par.dp > 1:
        fsdp = (3 * layers + 1) * micro + 1
    if par.tp > 1:
        tensor += (7 * layers + 3 + (2 * layers + 2 if checkpointing else 0)) * micro
    return Calls(plain, fsdp, tensor, 2 * micro if par.pp > 1 else 0)


def grad_norm_collectives(par: Parallel) -> int:
    """All-reduces of one gradient norm (module docstring)."""
    sharded_dims = 1 + (par.dp > 1)
    return (par.dp > 1) + (2 * sharded_dims if par.tp > 1 else 0) + (par.pp > 1)


def forward_collectives(shape: ModelShape, par: Parallel, micro: int) -> Calls:
    """Collective calls of one scoring call on one rank (module docstring)."""
    if par.devices == 1:
        return Calls()
    layers = shape.layers // par.pp
    return Calls(2, layers * micro + 1 if par.dp > 1 else 0, (2 * layers + 2) * micro if par.tp > 1 else 0,
                 micro if par.pp > 1 else 0)


def blocking_latency_s(calls: Calls, eff: Efficiency) -> float:
    """Seconds of the collectives that hold the pass up (all but FSDP's, which hide under compute)."""
    return (calls.plain * eff.collective_s + calls.tensor * eff.dtensor_collective_s
            + calls.sends * eff.sync_collective_s)


def reshard_collectives(shape: ModelShape, par: Parallel) -> int:
    """All-gathers of the training -> generation reshard (module docstring)."""
    split = shape.split_tensors if par.devices // par.gen_tp > 1 else 0
    return split + (shape.replicated_tensors if par.devices // (par.tp * par.pp) > 1 else 0)


def _micro_batches(sequences: int, dp: int, per_device: int) -> int:
    return math.ceil(math.ceil(sequences / dp) / max(1, per_device))


def train_cost(load: RoleLoad, par: Parallel, work: Workload, cluster: Cluster, busy: int = 0) -> PhaseCost:
    dev, eff, shape = cluster.device, cluster.efficiency, load.shape
    s, S = work.seq_len, work.sequences
    flops = training_flops(shape.matmul_params, shape.layers, shape.hidden, [s] * S) * load.epochs
    if load.gradient_checkpointing:
        flops *= 4 / 3
    micro = _micro_batches(S, par.dp, load.micro_batch) * load.epochs
    optimizer_steps = max(1, S // max(1, load.mini_batch)) * load.epochs
    # The pipeline drains at every optimizer step: its bubble is (pp - 1) / (micro-batches per step).
    bubble = 1 + (par.pp - 1) / max(1, micro // optimizer_steps)
    compute = flops / (par.devices * dev.peak_flops * eff.train * shared(par.devices, cluster, busy)[0]) * bubble
    e = load.dtype_bytes
    shard_group = shape.params / (par.tp * par.pp)
    dp_bw = link_bw(par.dp, par.devices, cluster)
    # FSDP prefetches the next layer's all-gather while this one computes: it hides behind
    # compute up to its own length; gradients are reduce-scattered once per optimizer step.
    gather = ring_bytes(par.dp, 2 * e * shard_group) * micro / dp_bw
    reduce = ring_bytes(par.dp, 4 * shard_group) * optimizer_steps / dp_bw
    act = load.micro_batch * s * shape.hidden * e
    tp = 4 * shape.layers / par.pp * 2 * ring_bytes(par.tp, act) * micro / link_bw(par.tp, par.tp, cluster)
    calls = train_collectives(shape, par, micro, optimizer_steps, load.gradient_checkpointing)
    gather += calls.fsdp * eff.sync_collective_s
    latency = blocking_latency_s(calls, eff)
    exposed = exposed_gather_s(gather, compute, dev)
    return PhaseCost(compute, exposed + reduce + tp + latency, eff.call_s + eff.micro_batch_s * micro,
                     {"fsdp_gather_s": gather, "grad_reduce_s": reduce, "tp_comm_s": tp, "latency_s": latency,
                      "collectives": sum(calls), "micro_batches": micro})


def forward_cost(load: RoleLoad, par: Parallel, work: Workload, cluster: Cluster, busy: int = 0) -> PhaseCost:
    dev, eff, shape = cluster.device, cluster.efficiency, load.shape
    s, S = work.seq_len, work.sequences
    flops = training_flops(shape.matmul_params, shape.layers, shape.hidden, [s] * S) / 3
    micro = _micro_batches(S, par.dp, load.forward_micro_batch)
    rate = par.devices * dev.peak_flops * eff.forward * shared(par.devices, cluster, busy)[0]
    compute = flops / rate * (1 + (par.pp - 1) / micro)
    e = load.dtype_bytes
    gather = ring_bytes(par.dp, e * shape.params / (par.tp * par.pp)) * micro / link_bw(par.dp, par.devices, cluster)
    calls = forward_collectives(shape, par, micro)
    gather += calls.fsdp * eff.sync_collective_s
    latency = blocking_latency_s(calls, eff)
    act = load.forward_micro_batch * s * shape.hidden * e
    tp = 2 * shape.layers / par.pp * 2 * ring_bytes(par.tp, act) * micro / link_bw(par.tp, par.tp, cluster)
    return PhaseCost(compute, exposed_gather_s(gather, compute, dev) + tp + latency, eff.call_s + eff.micro_batch_s * micro,
                     {"fsdp_gather_s": gather, "tp_comm_s": tp, "latency_s": latency, "collectives": sum(calls),
                      "micro_batches": micro})


def reshard_costs(sizes: ModelSizes, par: Parallel, gen_bytes: int, train_bytes: int) -> Costs:
    """Per-rank costs of the training -> generation transition (hybrid grouping); with
    pipeline stages, tp x pp stands for the training shard of one layer's group."""
    n, t_g = par.devices, par.gen_tp
    train_tp = par.tp * par.pp
    # formulas.py wants sizes that divide evenly; round up to whole shards (bytes, not accuracy, matter here).
    unit_s, unit_r = n * t_g, n // train_tp
    sizes = ModelSizes(-(-sizes.split_numel // unit_s) * unit_s, -(-sizes.replicated_numel // unit_r) * unit_r,
                       sizes.largest_split_numel, sizes.largest_replicated_numel)
    return predicted_costs(sizes, "hybrid", world_size=n, train_tp=train_tp, gen_tp=t_g,
                           gen_bytes=gen_bytes, train_bytes=train_bytes)


def generate_cost(load: RoleLoad, par: Parallel, work: Workload, cluster: Cluster,
                  samples_per_prompt: int | None = None) -> PhaseCost:
    dev, eff, shape = cluster.device, cluster.efficiency, load.shape
    t_g = par.gen_tp
    replicas = par.devices // t_g
    per_prompt = work.samples if samples_per_prompt is None else samples_per_prompt
    batch = math.ceil(work.prompts * per_prompt / replicas)
    e, p, r = work.gen_dtype_bytes, work.prompt_len, work.response_len
    prefill = (2 * shape.matmul_params * batch * p + 4 * shape.layers * shape.hidden * batch * p * p)
    flops_s, bytes_s = t_g * dev.peak_flops * eff.prefill, t_g * dev.mem_bw * eff.decode_bw
    share_flops, share_bw = shared(par.devices, cluster)
    flops_s, bytes_s = flops_s * share_flops, bytes_s * share_bw
    compute = prefill / flops_s
    waves = math.ceil(batch / work.max_num_seqs)
    decode = 0.0
    comm = 0.0
    for w in range(waves):
        b = min(work.max_num_seqs, batch - w * work.max_num_seqs)
        ctx = p + (r + 1) / 2  # mean context over the steps (cost is linear in it)
        flops = 2 * shape.matmul_params * b + 4 * shape.layers * shape.hidden * b * ctx
        nbytes = e * shape.params + b * ctx * 2 * shape.layers * shape.kv_dim * e
        step = max(flops / flops_s, nbytes / bytes_s)
        decode += r * step
        comm += r * 2 * shape.layers * 2 * ring_bytes(t_g, b * shape.hidden * e) / link_bw(t_g, t_g, cluster)
    # A forward pass per generated token (the prefill yields the first) in every wave.
    calls = (2 * shape.layers + 3) * r * waves if t_g > 1 else 0
    comm += calls * eff.sync_collective_s
    reshard = reshard_costs(shape.reshard_sizes(), par, e, load.dtype_bytes).comm_bytes
    # Micro-DP groups are t_g ranks at stride: inside a node when the actor's devices are.
    reshard_calls = reshard_collectives(shape, par)
    reshard_s = reshard / link_bw(par.devices // t_g, par.devices, cluster) + reshard_calls * eff.collective_s
    return PhaseCost(compute + decode, comm + reshard_s, eff.call_s + eff.decode_step_s * r * waves,
                     {"prefill_s": compute, "decode_s": decode, "reshard_s": reshard_s,
                      "collectives": calls + reshard_calls})


def controller_cost(work: Workload, eff: Efficiency) -> PhaseCost:
    return PhaseCost(overhead_s=eff.controller_per_seq_s * work.sequences)


def phase_cost(phase: FlowPhase, load: RoleLoad | None, par: Parallel | None, work: Workload,
               cluster: Cluster, busy: int = 0) -> PhaseCost:
    """The cost of `phase` run by a role with `load` on `par` (None for controller phases);
    `busy`: devices computing at once, where more than the role's own (a scoring or update
    phase beside other pools' phases: simulate.busy_devices); they share a node's rate."""
    if phase.kind == "controller":
        return controller_cost(work, cluster.efficiency)
    if phase.kind == "train":
        return train_cost(load, par, work, cluster, busy)
    if phase.kind == "forward":
        return forward_cost(load, par, work, cluster, busy)
    return generate_cost(load, par, work, cluster, phase.samples_per_prompt)
